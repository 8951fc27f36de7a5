"""The fleet workflow: one long-running entity per cluster, ``lazarus-fleet-<name>``.

It holds the inventory of nodes (``lazarus.domain.fleet``): which are free, leased to
which job, in the shared spare pool, quarantined or on probation, and what each has
done. Jobs and operators change it only through updates, so every request is
validated before it is accepted (the validator runs the same pure move on a copy of
the state and raises its refusal) and is answered once it is durable.

Handlers hold one lock across their work, so a probation check that awaits its
activity never interleaves with a lease. History is bounded the way the job's is:
past ``continue_as_new_after_events`` (or when Temporal suggests it) the workflow
waits for every handler to finish, then continues as new carrying the state; a lease
accepted before the hop is in the state the next run starts from.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from lazarus.domain.activity_refs import PREFLIGHT
    from lazarus.domain.api import (
        FLEET_QUERY_STATUS,
        FLEET_UPDATE_DRAIN,
        FLEET_UPDATE_HAND_BACK,
        FLEET_UPDATE_LEASE,
        FLEET_UPDATE_RELEASE,
        FLEET_UPDATE_RELEASE_ORPHAN,
        FLEET_UPDATE_REPLACE,
        FLEET_UPDATE_REPORT_QUARANTINE,
        FLEET_UPDATE_RETURN,
        FLEET_WORKFLOW_TYPE,
    )
    from lazarus.domain.contracts import NodeAccess, PreflightActivityRequest
    from lazarus.domain.fleet import (
        DrainRequest,
        FleetConfig,
        FleetInput,
        FleetRefusal,
        FleetState,
        FleetStatus,
        HandBackReply,
        HandBackRequest,
        Lease,
        LeaseRequest,
        OrphanRelease,
        QuarantineReport,
        ReleaseRequest,
        ReplaceRequest,
        ReturnRequest,
        drain,
        fleet_status,
        hand_back,
        initial_state,
        lease,
        on_probation,
        probation_not_run,
        probation_result,
        release,
        release_orphan,
        replace,
        report_quarantine,
        return_node,
        scratch_copy,
    )
    from lazarus.domain.spec import NodeSpec, PreflightSpec
    from workflows.activity_calls import QUICK_RETRY, cause, execute

RequestT = TypeVar("RequestT")
ReplyT = TypeVar("ReplyT")
Move = Callable[[FleetState, FleetConfig, RequestT, float], ReplyT]


@workflow.defn(name=FLEET_WORKFLOW_TYPE)
class FleetWorkflow:
    @workflow.init
    def __init__(self, fleet: FleetInput) -> None:
        # Set here, not in ``run``: an update delivered with the run's first task (one
        # sent across a continue-as-new) is validated before ``run`` starts.
        self._config = fleet.config
        self._state = (
            fleet.state
            if fleet.state is not None
            else initial_state(fleet.config, workflow.now().timestamp())
        )
        self._lock = asyncio.Lock()

    # ---------------------------------------------------------------- messages

    @workflow.update(name=FLEET_UPDATE_LEASE)
    async def lease(self, request: LeaseRequest) -> Lease:
        return await self._apply(lease, request)

    @lease.validator
    def _validate_lease(self, request: LeaseRequest) -> None:
        self._validate(lease, request)

    @workflow.update(name=FLEET_UPDATE_RELEASE)
    async def release(self, request: ReleaseRequest) -> str:
        return await self._apply(release, request)

    @release.validator
    def _validate_release(self, request: ReleaseRequest) -> None:
        self._validate(release, request)

    @workflow.update(name=FLEET_UPDATE_RELEASE_ORPHAN)
    async def release_orphan(self, request: OrphanRelease) -> str:
        """``lazarus fleet release JOB``: the client has checked that the job's workflow
        is closed (this workflow cannot look); see :func:`release_orphan`."""
        return await self._apply(release_orphan, request)

    @release_orphan.validator
    def _validate_release_orphan(self, request: OrphanRelease) -> None:
        self._validate(release_orphan, request)

    @workflow.update(name=FLEET_UPDATE_HAND_BACK)
    async def hand_back(self, request: HandBackRequest) -> HandBackReply:
        return await self._apply(hand_back, request)

    @hand_back.validator
    def _validate_hand_back(self, request: HandBackRequest) -> None:
        self._validate(hand_back, request)

    @workflow.update(name=FLEET_UPDATE_REPORT_QUARANTINE)
    async def report_quarantine(self, report: QuarantineReport) -> str:
        return await self._apply(report_quarantine, report)

    @report_quarantine.validator
    def _validate_report(self, report: QuarantineReport) -> None:
        self._validate(report_quarantine, report)

    @workflow.update(name=FLEET_UPDATE_REPLACE)
    async def replace(self, request: ReplaceRequest) -> NodeSpec | None:
        return await self._apply(replace, request)

    @replace.validator
    def _validate_replace(self, request: ReplaceRequest) -> None:
        self._validate(replace, request)

    @workflow.update(name=FLEET_UPDATE_DRAIN)
    async def drain(self, request: DrainRequest) -> str:
        return await self._apply(drain, request)

    @drain.validator
    def _validate_drain(self, request: DrainRequest) -> None:
        self._validate(drain, request)

    @workflow.update(name=FLEET_UPDATE_RETURN)
    async def return_node(self, request: ReturnRequest) -> str:
        return await self._apply(return_node, request)

    @return_node.validator
    def _validate_return(self, request: ReturnRequest) -> None:
        self._validate(return_node, request)

    @workflow.query(name=FLEET_QUERY_STATUS)
    def status(self) -> FleetStatus:
        return fleet_status(self._state, self.config, self._now())

    def _validate(self, move: Move[RequestT, object], request: RequestT) -> None:
        """Run the move on a copy: a refusal is raised before the update is accepted,
        so it never enters history."""
        try:
            move(scratch_copy(self._state), self.config, request, self._now())
        except FleetRefusal as refusal:
            raise ValueError(str(refusal)) from None

    async def _apply(self, move: Move[RequestT, ReplyT], request: RequestT) -> ReplyT:
        """Apply the move under the lock; it checks again (another handler may have
        changed the state since the validator ran) and refuses with the reason."""
        async with self._lock:
            try:
                return move(self._state, self.config, request, self._now())
            except FleetRefusal as refusal:
                raise ApplicationError(str(refusal), non_retryable=True) from None

    # ---------------------------------------------------------------- main loop

    @workflow.run
    async def run(self, fleet: FleetInput) -> FleetStatus:
        while True:
            interval = self._next_check_in()
            # Wakes for a hop, when a node first goes on probation (checked at once), or
            # when the interval is up (the next round).
            with contextlib.suppress(asyncio.TimeoutError):
                await workflow.wait_condition(
                    functools.partial(self._should_wake, interval),
                    timeout=interval,
                    timeout_summary="next probation round",
                )
            if not self._history_is_long():
                await self._probe()
                continue
            # Accepted updates finish (and answer) in this run; their effect is in the
            # state the next run starts from.
            await workflow.wait_condition(workflow.all_handlers_finished)
            self._state.runs += 1
            workflow.continue_as_new(FleetInput(config=self.config, state=self._state))

    def _should_wake(self, interval: timedelta | None) -> bool:
        return self._history_is_long() or self._next_check_in() != interval

    def _next_check_in(self) -> timedelta | None:
        """Sleep until the next probation round, or indefinitely with nothing to check."""
        probation = self.config.probation
        if probation.health_command is None or not on_probation(self._state):
            return None
        return timedelta(seconds=probation.interval_s)

    async def _probe(self) -> None:
        """One probation round: run the health command on every node on probation (the
        preflight activity's mechanics) and count passes."""
        probation = self.config.probation
        nodes = [r.spec for r in on_probation(self._state)]
        if probation.health_command is None or not nodes:
            return
        request = PreflightActivityRequest(
            access=NodeAccess(nodes=nodes, ssh=self.config.ssh),
            checks=PreflightSpec(
                health_command=probation.health_command, timeout_s=probation.timeout_s
            ),
            interpreter=probation.health_command[0],
            workdir=probation.workdir,
            disk_path=probation.workdir,
        )
        try:
            report = await execute(
                PREFLIGHT,
                request,
                start_to_close_timeout=timedelta(seconds=probation.timeout_s + 60),
                retry_policy=QUICK_RETRY,
                summary=f"probation: {', '.join(n.name for n in nodes)}",
            )
        except ActivityError as err:
            workflow.logger.warning("probation check failed to run: %s", cause(err))
            async with self._lock:
                probation_not_run(self._state, cause(err), self._now())
            return
        async with self._lock:
            now = self._now()
            for health in report.nodes:
                probation_result(
                    self._state,
                    self.config,
                    health.node,
                    health.ok,
                    "; ".join(health.problems),
                    now,
                )

    # ------------------------------------------------------------------ helpers

    @property
    def config(self) -> FleetConfig:
        return self._config

    def _now(self) -> float:
        return workflow.now().timestamp()

    def _history_is_long(self) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self.config.continue_as_new_after_events
        )
