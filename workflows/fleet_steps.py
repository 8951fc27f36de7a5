"""The job's fleet, as steps of a run: lease, report, ask for a spare, hand back, release.

``fleet_link`` holds the calls themselves (each a fleet activity, its retry and the
notes it leaves); this is the job's side of the sequence: when each is made, and the
spec the job runs on afterwards (the fleet's nodes and spares, through
:meth:`JobRun.move_to`). Only jobs with ``spec.fleet`` consult the fleet patches, so
other jobs issue exactly the commands they did.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from lazarus.domain.contracts import FailureReport
    from workflows.fleet_link import (
        ask_again,
        ask_for_spare,
        fleet_of,
        hand_back_fenced,
        hands_back,
        release_nodes,
        take_lease,
        tell_fleet,
    )
    from workflows.operator_requests import reopen_pool
    from workflows.run_context import JobRun
    from workflows.state import Phase


class FleetSteps:
    """The fleet steps of one run (each a no-op for a job without a fleet)."""

    def __init__(self, run: JobRun) -> None:
        self.run = run

    async def lease(self) -> None:
        """``spec.fleet``: the nodes come from the fleet (``fleet_link``); no lease, no job."""
        fleet = fleet_of(self.run.spec)
        if fleet is not None:
            leased = await take_lease(self.run.spec, self.run.state, fleet)
            if isinstance(leased, str):
                self.run.fail(leased)
            else:
                self.run.move_to(leased)

    async def tell(self, node: str, failure_class: str, reason: str) -> None:
        """Report a quarantine to the job's fleet, and with no spare of the job's own
        left, take the fleet's replacement as a spare."""
        fleet = fleet_of(self.run.spec) if self.run.spec.fleet is not None else None
        if fleet is not None:
            self.run.move_to(
                await tell_fleet(self.run.spec, self.run.state, fleet, node, failure_class, reason)
            )

    async def ask_for_spare(self, failure: FailureReport) -> FailureReport:
        """With no spare of the job's own left, the fleet's replacement becomes one; the
        answer goes into the failure's evidence (its incident does not exist yet)."""
        fleet = fleet_of(self.run.spec) if self.run.spec.fleet is not None else None
        if fleet is None:
            return failure
        spec, failure = await ask_for_spare(self.run.spec, self.run.state, fleet, failure)
        self.run.move_to(spec)
        return failure

    async def ask_again(self) -> None:
        """Waiting for an operator only for want of nodes: ask the fleet again, and go
        on once it had enough, as a person's ``resume`` would but with the restart
        budget as it was (nobody looked at the job). The page stands; a ``resume``
        that comes later is ignored, as one that makes no sense now."""
        fleet = fleet_of(self.run.spec)
        assert fleet is not None  # waits_on_fleet gave the timeout
        self.run.move_to(await ask_again(self.run.spec, self.run.state, fleet))
        if reopen_pool(self.run.spec, self.run.state, None, self.run.now()) is not None:
            return
        self.run.state.operator_reason = None
        workflow.logger.info("fleet %s had nodes again: resuming without a person", fleet.name)
        self.run.set_phase(Phase.LAUNCHING)

    async def hand_back(self) -> None:
        """Quarantined nodes the job's stops have fenced go back to the fleet, for
        probation, before the next generation starts."""
        fleet = fleet_of(self.run.spec) if self.run.spec.fleet is not None else None
        if fleet is not None and hands_back(self.run.spec):
            await hand_back_fenced(self.run.spec, self.run.state, fleet)

    async def release(self) -> None:
        fleet = fleet_of(self.run.spec) if self.run.spec.fleet is not None else None
        if fleet is not None:
            await release_nodes(self.run.spec, self.run.state, fleet)
