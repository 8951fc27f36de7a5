"""Stopping ranks: the compensation that always runs before a relaunch.

On every node at once: SIGTERM to each rank's whole process group (with SIGCONT,
because a SIGSTOPped rank cannot act on SIGTERM), a grace period, then SIGKILL,
and each stopped generation is marked so a late launch of it is refused.
Idempotent: stopping what is already gone is a no-op, so a retry after a worker
crash, or a second ``cancel``, is always safe. A node that cannot be reached is
reported, not waited for: what runs there is fenced when it comes back. A group
that outlives SIGKILL for ``kill_wait_s`` (uninterruptible sleep) is reported in
``unkillable``, not retried forever: the workflow quarantines its node.
With ``end_of_run`` (the run finished, was cancelled or failed) each node's
zygote (warm starts) is stopped too and the run's memory tier removed.
"""

from __future__ import annotations

import logging
from pathlib import Path

from temporalio import activity

from activities.heartbeat import in_thread_heartbeating
from activities.nodes.agent import NodeAgent, NodeRefused, NodeUnreachable, ShimError
from activities.nodes.factory import agents, on_each, this_machine_agent
from activities.nodes.node_records import NodeStopResult
from activities.nodes.rundir import runs
from lazarus.domain.contracts import StopRequest, StopResult
from lazarus.domain.memory_tier import memory_checkpoint_dir

log = logging.getLogger(__name__)


def stop_on_nodes(request: StopRequest) -> StopResult:
    """Stop on every node of the request at once; with no nodes, every rank on this
    machine (whichever logical node launched it).

    The fast path of a crash recovery: ``kill_at_once`` gives no grace (the survivors
    are stuck in a collective with a dead peer and cannot checkpoint), and the nodes
    in ``skip_nodes`` (declared dead) are not contacted at all: they are reported
    ``unreachable``, as a dead host would be, and fenced when they come back."""
    grace_s = 0.0 if request.kill_at_once else request.grace_s

    def stop_one(agent: NodeAgent) -> NodeStopResult:
        result = agent.stop(request.run_root, request.keep_generation, grace_s, request.kill_wait_s)
        if request.end_of_run and result.reachable:
            end_run_on(agent, request)
        if request.undrain and result.reachable:
            undrain_on(agent)
        return result

    skipped = set(request.skip_nodes)
    nodes = request.access.nodes
    contacted = [node for node in nodes if node.name not in skipped]
    results = [
        NodeStopResult(node=node.name, reachable=False, error="declared dead: not contacted")
        for node in nodes
        if node.name in skipped
    ]
    if not nodes:
        results.append(stop_one(this_machine_agent()))
    elif contacted:
        with agents(request.access.with_nodes(contacted)) as opened:
            results += on_each(opened, stop_one)
    steps = [r.last_step for r in results if r.last_step is not None]
    return StopResult(
        generations=sorted({g for r in results for g in r.generations}),
        signalled_groups=sum(r.signalled_groups for r in results),
        killed_groups=sum(r.killed_groups for r in results),
        last_step=max(steps) if steps else None,
        unreachable=[r.node for r in results if not r.reachable],
        unkillable=[group for r in results for group in r.unkillable],
    )


def end_run_on(agent: NodeAgent, request: StopRequest) -> None:
    """``end_of_run``: the node's zygote stopped, the run's memory tier removed. Best
    effort once the ranks are stopped: a failure here is logged, never retried
    forever (an idle zygote wastes memory, not correctness; ``/dev/shm`` is per run)."""
    try:
        agent.end_run(request.run_root, memory_dirs(request))
    except (NodeUnreachable, NodeRefused, ShimError, OSError, ValueError) as exc:
        log.warning("end of run on node %s: %s", agent.node.name, exc)


def undrain_on(agent: NodeAgent) -> None:
    """``lazarus return`` of a Slurm node: give it back to Slurm's scheduling too
    (nodes without a scheduler answer None). Needs Slurm admin rights; a refusal is
    logged, never fatal (the node is usable by this job's allocation either way once
    an admin resumes it)."""
    done = agent.undrain()
    if done is not None:
        if done.error is not None:
            log.warning("return of node %s: %s", agent.node.name, done.error)
        elif done.left is not None:
            log.warning("return of node %s: not resumed in Slurm: %s", agent.node.name, done.left)


def memory_dirs(request: StopRequest) -> list[str]:
    """The memory-tier directories of the run(s) ``request.run_root`` names: a run
    directory has one; a job directory (legacy layout, or a whole-job cleanup) has
    the legacy one and one per run found below it on this machine."""
    root = Path(request.run_root)
    if root.name != request.job_id:
        return [memory_checkpoint_dir(request.job_id, str(root))]
    return [
        memory_checkpoint_dir(request.job_id, None),
        *(memory_checkpoint_dir(request.job_id, str(run)) for run in runs(root)),
    ]


async def stop_generations(request: StopRequest) -> StopResult:
    return await in_thread_heartbeating(lambda: stop_on_nodes(request), lambda: "stopping")


@activity.defn(name="stop")
async def stop(request: StopRequest) -> StopResult:
    """Stop every generation of the job except ``keep_generation``, on every node."""
    return await stop_generations(request)
