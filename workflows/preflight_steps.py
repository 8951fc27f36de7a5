"""The preflight before a launch: every active node checked, the failing ones replaced.

A node that fails its checks is swapped out (quarantine, a spare, a shrink, or an
operator) after Slurm was asked to grow (``slurm.grow``) and the fleet was told, so
the launch that follows runs on nodes that passed. Its own module because it joins
three features' steps (stops, Slurm, fleet) that otherwise need not know each other.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from lazarus.domain.activity_refs import PREFLIGHT
    from lazarus.domain.contracts import NodeAccess, PreflightActivityRequest, PreflightReport
    from workflows.activity_calls import QUICK_RETRY, cause, execute
    from workflows.fleet_steps import FleetSteps
    from workflows.patches import PATCH_MISSING_PROGRAM_FAILS_JOB
    from workflows.placement import active_nodes
    from workflows.routing import route
    from workflows.run_context import JobRun
    from workflows.slurm_steps import SlurmSteps
    from workflows.stop_steps import StopSteps


def missing_everywhere(report: PreflightReport) -> bool:
    """Every checked node lacks the command's program: the spec is wrong, not the nodes.

    One node without it among nodes that have it is that node's fault (a missing
    package, a PATH that differs): it is swapped out as any failing node is. But when
    no node has it (the only node of a local job, say), quarantining them would leave
    the job waiting for an operator with advice to shrink, for a typo in ``command``.
    Other problems on such a node do not change that: the job cannot start anywhere
    until ``command`` names a program the nodes have."""
    return bool(report.nodes) and all(health.program_missing for health in report.nodes)


def missing_program_reason(program: str, report: PreflightReport) -> str:
    """The failure a user reads in ``lazarus status``: the field, the program, the fix."""
    where = ", ".join(health.node for health in report.nodes)
    return (
        f"command: {program!r} was not found on any node ({where}); this is the spec, "
        "not the nodes (none was quarantined): fix `command` (or env.PATH) and start again"
    )


class Preflight:
    """The preflight of one run."""

    def __init__(self, run: JobRun, stops: StopSteps, slurm: SlurmSteps, fleet: FleetSteps) -> None:
        self.run = run
        self.stops = stops
        self.slurm = slurm
        self.fleet = fleet

    async def check_active_nodes(self) -> bool:
        """Check every active node before launching; replace the ones that fail.

        A program missing on every node ends the job FAILED instead
        (:func:`missing_everywhere`): no spare or shrink can fix a wrong ``command``."""
        spec = self.run.spec
        program = spec.command[0]
        while True:
            try:
                report = await self.preflight(program)
            except ActivityError as err:
                # Only a refusal ends up here (a program not on the worker's allow-list):
                # a node that fails its checks is a report, not an error.
                self.run.fail(f"preflight: {cause(err)}")
                return False
            if not report.failed:
                return True
            if missing_everywhere(report) and workflow.patched(PATCH_MISSING_PROGRAM_FAILS_JOB):
                self.run.fail(missing_program_reason(program, report))
                return False
            for failed in report.failed:
                # A node that died while its peers crashed first is found here.
                await self.slurm.maybe_grow(failed.node, self.run.state.current_incident)
                await self.fleet.tell(failed.node, "preflight", "; ".join(failed.problems))
                if not self.stops.swap_out(failed.node, "preflight: " + "; ".join(failed.problems)):
                    return False

    async def preflight(self, program: str) -> PreflightReport:
        spec = self.run.spec
        return await execute(
            PREFLIGHT,
            PreflightActivityRequest(
                access=NodeAccess.of(spec, active_nodes(spec, self.run.state.pool)),
                checks=spec.preflight,
                interpreter=program,
                workdir=spec.workdir,
                disk_path=spec.checkpoint_dir,
                search_path=spec.env.get("PATH"),
                job_id=spec.job_id,
            ),
            start_to_close_timeout=timedelta(seconds=spec.preflight.timeout_s + 60),
            retry_policy=QUICK_RETRY,
            summary=f"preflight {', '.join(self.run.state.pool.active)}",
            **route(PREFLIGHT, self.run.state.host_task_queue),
        )
