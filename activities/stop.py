"""Stopping ranks: the compensation that always runs before a relaunch.

On every node at once: SIGTERM to each rank's whole process group (with SIGCONT,
because a SIGSTOPped rank cannot act on SIGTERM), a grace period, then SIGKILL,
and each stopped generation is marked so a late launch of it is refused.
Idempotent: stopping what is already gone is a no-op, so a retry after a worker
crash, or a second ``cancel``, is always safe. A node that cannot be reached is
reported, not waited for: what runs there is fenced when it comes back. A group
that outlives SIGKILL for ``kill_wait_s`` (uninterruptible sleep) is reported in
``unkillable``, not retried forever: the workflow quarantines its node.
"""

from __future__ import annotations

from temporalio import activity

from lazarus.activities.heartbeat import in_thread_heartbeating
from lazarus.activities.nodes.agent import NodeAgent, NodeStopResult
from lazarus.activities.nodes.factory import agents, on_each
from lazarus.activities.nodes.local_agent import LocalAgent
from lazarus.domain.contracts import StopRequest, StopResult
from lazarus.domain.spec import NodeSpec


def stop_on_nodes(request: StopRequest) -> StopResult:
    """Stop on every node of the request at once; with no nodes, every rank on this
    machine (whichever logical node launched it)."""

    def stop_one(agent: NodeAgent) -> NodeStopResult:
        return agent.stop(
            request.run_root, request.keep_generation, request.grace_s, request.kill_wait_s
        )

    if not request.nodes:
        results = [stop_one(LocalAgent(NodeSpec(), whole_machine=True))]
    else:
        with agents(request.nodes, request.ssh) as opened:
            results = on_each(opened, stop_one)
    steps = [r.last_step for r in results if r.last_step is not None]
    return StopResult(
        generations=sorted({g for r in results for g in r.generations}),
        signalled_groups=sum(r.signalled_groups for r in results),
        killed_groups=sum(r.killed_groups for r in results),
        last_step=max(steps) if steps else None,
        unreachable=[r.node for r in results if not r.reachable],
        unkillable=[group for r in results for group in r.unkillable],
    )


async def stop_generations(request: StopRequest) -> StopResult:
    return await in_thread_heartbeating(lambda: stop_on_nodes(request), lambda: "stopping")


@activity.defn(name="stop")
async def stop(request: StopRequest) -> StopResult:
    """Stop every generation of the job except ``keep_generation``, on every node."""
    return await stop_generations(request)
