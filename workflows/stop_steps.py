"""Stops and fencing: the durable steps that stop a job's ranks and take nodes out.

Every stop goes through :meth:`StopSteps.stop_all`: which nodes it reaches, what it
fences and what a planned stop cost are pure decisions in ``stops``; this sequences
the ``stop`` activity and records what it found. A node that is swapped out goes to
quarantine here too, with a spare in its slot (or the job shrinks, or an operator is
needed), because a swap only ever follows a stop that fenced or skipped it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from lazarus.domain.activity_refs import STOP
    from lazarus.domain.contracts import NodeAccess, StopRequest, StopResult
    from workflows.activity_calls import (
        END_OF_RUN_RETRY,
        QUICK_RETRY,
        cause,
        execute,
        worker_loss_timeout,
    )
    from workflows.patches import PATCH_END_OF_RUN_EVERY_NODE
    from workflows.placement import node_spec, run_root
    from workflows.routing import route
    from workflows.run_context import JobRun
    from workflows.stops import end_of_run_targets, leaves_state, settle_stop, stop_targets


class StopSteps:
    """Stopping ranks, fencing, and swapping nodes out, for one run."""

    def __init__(self, run: JobRun) -> None:
        self.run = run

    async def fence_a_stuck_carry(self) -> None:
        """A rejoin skipped the stop before its launch, and its carry met ranks that
        would not die and started nothing (issue 37, N7). As without rejoin: stop the
        generation (its nodes quarantined where they stay stuck) and never launch
        beside them: a person must look. Ranks gone by now: the next turn launches
        the whole generation."""
        state = self.run.state
        await self.stop_all(
            f"fence generation {state.generation - 1}: ranks would not die "
            "during the rejoin's carry",
            kill_at_once=True,
        )
        if state.stuck_ranks is not None:
            stuck, state.stuck_ranks = state.stuck_ranks, None
            self.run.needs_operator(stuck)

    async def stop_all(
        self,
        reason: str,
        only: list[str] | None = None,
        *,
        kill_at_once: bool = False,
        skip: Sequence[str] = (),
        end_of_run: bool = False,
        undrain: bool = False,
    ) -> StopResult:
        """Stop ranks on the active nodes and on quarantined nodes not yet fenced.
        ``skip``: nodes declared dead, not contacted (they stay unfenced, and a later
        stop that reaches them fences them); ``kill_at_once``: no grace for ranks that
        cannot use it; ``end_of_run``: also zygotes and memory-tier snapshots, and
        (PATCH_END_OF_RUN_EVERY_NODE) on every node the run touched, wherever it went:
        a node that left the pool still holds them. That last stop is tried a few
        times, never forever: the nodes it could not reach are noted in
        ``cleanup_unreached`` and the run ends."""
        spec = self.run.spec
        every_node = end_of_run and workflow.patched(PATCH_END_OF_RUN_EVERY_NODE)
        targets = (
            end_of_run_targets(spec, self.run.state)
            if every_node
            else stop_targets(spec, self.run.state.pool, only)
        )
        names = [n for n in targets if n not in skip]
        grace = spec.recovery.stop_grace_s
        try:
            result = await execute(
                STOP,
                StopRequest(
                    job_id=spec.job_id,
                    run_root=run_root(spec, self.run.state),
                    grace_s=grace,
                    reason=reason,
                    access=NodeAccess.of(spec, [node_spec(spec, n) for n in names]),
                    kill_at_once=kill_at_once,
                    end_of_run=end_of_run,
                    undrain=undrain,
                ),
                start_to_close_timeout=timedelta(seconds=grace + 60),
                heartbeat_timeout=worker_loss_timeout(spec),
                retry_policy=END_OF_RUN_RETRY if every_node else QUICK_RETRY,
                summary=f"stop ranks: {reason}",
                **route(STOP, self.run.state.host_task_queue),
            )
        except ActivityError as err:
            if not every_node:
                raise
            workflow.logger.warning("end-of-run stop failed: %s", cause(err))
            result = StopResult(
                generations=[], signalled_groups=0, killed_groups=0, unreachable=names
            )
        if every_node:
            self.run.state.cleanup_unreached = list(result.unreachable)
            if result.unreachable:
                workflow.logger.warning(
                    "end of run: not reached, their zygotes and snapshots may remain: %s",
                    ", ".join(result.unreachable),
                )
        stuck = settle_stop(self.run.state, names, result, self.run.now(), whole_job=only is None)
        if stuck is not None:
            workflow.logger.error(stuck)
        return result

    def dead_nodes(self) -> list[str]:
        """Quarantined nodes not yet fenced: on the recovery path they are not waited
        on (each would cost a connect timeout); every other stop still tries them."""
        return self.run.state.pool.unfenced()

    def swap_out(self, node: str, reason: str) -> bool:
        """Quarantine a node and put a spare in its place (same rank slot), or shrink
        when allowed. False when neither is possible: the job then needs an operator."""
        if self.run.state.pool.swap_out(node, reason, self.run.now(), self.run.spec.min_nodes):
            return True
        self.run.needs_operator(
            f"{node} quarantined ({reason}) and no spare left; set min_nodes to allow "
            "shrinking, or 'lazarus return' a node",
            waits_for_node=True,
        )
        return False

    def run_leaves_state(self) -> bool:
        """Whether the run leaves something on the nodes beyond its ranks: zygotes
        (warm starts) or memory-tier snapshots in tmpfs, which its last stop removes."""
        return leaves_state(self.run.spec)
