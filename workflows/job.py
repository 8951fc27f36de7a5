"""The job workflow: one long-running workflow per training job.

It is the state machine documented on :class:`workflows.state.Phase`. Each loop
turn looks at the phase and does one durable thing (launch, supervise, recover,
wait for an operator), so a crash of the controller at any point resumes at the
same place: activities are idempotent and re-attach to what is already running.

History grows with events that matter: the supervise activity returns only on a
failure, a finish, the first step after a recovery, or a periodic progress
report; the live step travels in its heartbeat details instead. When history
gets long the workflow continues as new, carrying :class:`JobState`, and the new
run adopts the live ranks rather than relaunching them.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.checkpoints import find_checkpoint
    from activities.contracts import (
        CheckpointRef,
        FailureReport,
        FindCheckpointRequest,
        LaunchRequest,
        StopRequest,
        StopResult,
        SuperviseOutcome,
        SuperviseRequest,
    )
    from activities.launcher import launch
    from activities.stop import stop
    from activities.supervise import supervise
    from lazarus.spec import JobSpec
    from workflows.accounting import effective_training_time_ratio
    from workflows.api import (
        PHASE_ATTRIBUTE,
        QUERY_STATUS,
        SIGNAL_FORCE_RECOVER,
        SIGNAL_PAUSE,
        SIGNAL_RESUME,
        STEP_ATTRIBUTE,
        WORKFLOW_TYPE,
    )
    from workflows.playbook import (
        SUGGESTED_OPERATOR_ACTIONS,
        Action,
        FailureContext,
        decide,
    )
    from workflows.state import ForceRecover, Incident, JobInput, JobState, JobStatus, Phase

QUICK_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=5)
)
LAUNCH_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=5,
    non_retryable_error_types=["LaunchRefused"],
)


@workflow.defn(name=WORKFLOW_TYPE)
class JobWorkflow:
    def __init__(self) -> None:
        self._spec: JobSpec | None = None
        self._state = JobState()
        self._continue_as_new_after = 10_000
        self._pause_requested = False
        self._resume_requested = False
        self._force: ForceRecover | None = None

    # ----------------------------------------------------------------- messages

    @workflow.signal(name=SIGNAL_PAUSE)
    def pause(self) -> None:
        self._pause_requested = True

    @workflow.signal(name=SIGNAL_RESUME)
    def resume(self) -> None:
        self._resume_requested = True

    @workflow.signal(name=SIGNAL_FORCE_RECOVER)
    def force_recover(self, request: ForceRecover) -> None:
        self._force = request

    @workflow.query(name=QUERY_STATUS)
    def status(self) -> JobStatus:
        spec = self.spec
        state = self._state
        now = self._now()
        end = state.finished_at if state.finished_at is not None else now
        elapsed = max(0.0, end - state.started_at)
        return JobStatus(
            job_id=spec.job_id,
            phase=state.phase,
            generation=state.generation,
            step=state.step,
            world_size=spec.world_size,
            ranks=state.ranks,
            restarts=state.restarts,
            max_restarts=spec.recovery.max_restarts,
            incidents=state.incidents,
            ettr=effective_training_time_ratio(state, end),
            elapsed_s=elapsed,
            operator_reason=state.operator_reason,
            suggested_actions=(
                list(SUGGESTED_OPERATOR_ACTIONS) if state.phase == Phase.NEEDS_OPERATOR else []
            ),
            resume_step=state.resume.step if state.resume else None,
            runs=state.runs,
        )

    # ---------------------------------------------------------------- main loop

    @workflow.run
    async def run(self, job: JobInput) -> JobStatus:
        self._spec = job.spec
        self._continue_as_new_after = job.continue_as_new_after_events
        if job.state is not None:
            self._state = job.state
        else:
            self._state.started_at = self._now()
        self._publish_phase()
        try:
            while not self._state.phase.is_terminal:
                await self._turn()
        except asyncio.CancelledError:
            await self._stop_all("job cancelled")
            self._set_phase(Phase.CANCELLED)
            self._state.finished_at = self._now()
            raise
        return self.status()

    async def _turn(self) -> None:
        """One durable move of the state machine."""
        phase = self._state.phase
        if self._pause_requested and phase not in (Phase.PAUSED, Phase.NEEDS_OPERATOR):
            await self._pause()
        elif self._force is not None and phase == Phase.RUNNING:
            await self._forced_recovery(self._force)
        elif phase in (Phase.PENDING, Phase.LAUNCHING):
            await self._launch_next()
        elif phase == Phase.RUNNING:
            self._maybe_continue_as_new()
            await self._supervise()
        elif phase in (Phase.PAUSED, Phase.NEEDS_OPERATOR):
            await self._wait_for_operator()
        else:  # RECOVERING is only ever transient inside _recover
            self._set_phase(Phase.LAUNCHING)

    # ------------------------------------------------------------------- phases

    async def _launch_next(self) -> None:
        spec = self.spec
        state = self._state
        self._set_phase(Phase.LAUNCHING)
        if state.generation > 0:
            await self._stop_all(f"fence generation {state.generation} before relaunch")
        resume = await workflow.execute_activity(
            find_checkpoint,
            FindCheckpointRequest(checkpoint_dir=spec.checkpoint_dir),
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=QUICK_RETRY,
            summary="find the newest committed checkpoint",
        )
        state.resume = resume
        self._account_resume(resume)
        state.generation += 1
        origin = f"step {resume.step}" if resume else "scratch"
        try:
            result = await workflow.execute_activity(
                launch,
                LaunchRequest(spec=spec, generation=state.generation, resume=resume),
                start_to_close_timeout=timedelta(seconds=120),
                retry_policy=LAUNCH_RETRY,
                summary=(
                    f"launch generation {state.generation}: {spec.world_size} ranks from {origin}"
                ),
            )
        except ActivityError as err:
            await self._stop_all("launch failed")
            self._fail(f"launch of generation {state.generation} failed: {_cause(err)}")
            return
        state.generation_live = True
        state.ranks = []
        workflow.logger.info(
            "launched generation %d on port %d (adopted=%s)",
            result.generation,
            result.master_port,
            result.adopted,
        )
        self._set_phase(Phase.RUNNING)

    async def _supervise(self) -> None:
        spec = self.spec
        state = self._state
        request = SuperviseRequest(
            job_id=spec.job_id,
            generation=state.generation,
            run_dir=f"{self._run_root()}/gen-{state.generation:05d}",
            world_size=spec.world_size,
            health=spec.health,
            resume_step=state.resume.step if state.resume else None,
            report_first_step=state.open_incident is not None,
            report_after_s=spec.health.report_interval_s,
        )
        handle = workflow.start_activity(
            supervise,
            request,
            start_to_close_timeout=timedelta(seconds=spec.health.report_interval_s + 600),
            heartbeat_timeout=timedelta(seconds=spec.health.supervisor_heartbeat_timeout_s),
            retry_policy=QUICK_RETRY,
            cancellation_type=workflow.ActivityCancellationType.TRY_CANCEL,
            summary=f"supervise generation {state.generation}",
        )
        await workflow.wait_condition(lambda: handle.done() or self._interrupted())
        if not handle.done():
            handle.cancel()
            with contextlib.suppress(ActivityError, asyncio.CancelledError):
                await handle
            return  # the next turn handles the pause or forced recovery
        try:
            outcome = await handle
        except ActivityError as err:
            self._fail(f"supervision of generation {state.generation} failed: {_cause(err)}")
            return
        await self._on_outcome(outcome)

    async def _on_outcome(self, outcome: SuperviseOutcome) -> None:
        state = self._state
        state.ranks = outcome.ranks
        if outcome.seconds_per_step is not None:
            state.seconds_per_step = outcome.seconds_per_step
        if outcome.step is not None:
            self._set_step(outcome.step)
        if outcome.kind == "first_step":
            self._close_open_incident(outcome.first_step_at or outcome.observed_at)
        elif outcome.kind == "succeeded":
            state.generation_live = False
            state.finished_at = self._now()
            self._set_phase(Phase.SUCCEEDED)
        elif outcome.kind == "failed" and outcome.failure is not None:
            await self._recover(outcome.failure)

    async def _recover(self, failure: FailureReport) -> None:
        spec = self.spec
        state = self._state
        self._set_phase(Phase.RECOVERING)
        state.consecutive_failures += 1
        incident = self._open_incident(
            kind=failure.kind,
            failure_class=failure.failure_class,
            rank=failure.rank,
            fault_at=failure.fault_at,
            detected_at=failure.detected_at,
            step_at_failure=failure.step_at_failure,
            exit_code=failure.exit_code,
            signal=failure.signal,
            evidence=failure.evidence,
            collateral_ranks=failure.collateral_ranks,
        )
        decision = decide(
            FailureContext(
                failure_class=failure.failure_class,
                rank=failure.rank,
                now=self._now(),
                restart_times=state.restart_times,
                consecutive_failures=state.consecutive_failures,
            ),
            spec.recovery,
        )
        incident.action = decision.action.value
        incident.reason = decision.reason
        stopped = await self._stop_all(
            f"incident {incident.id}: {failure.kind} on rank {failure.rank}"
        )
        if stopped.last_step is not None:
            incident.step_at_failure = max(incident.step_at_failure or 0, stopped.last_step)
        if decision.action == Action.NEEDS_OPERATOR:
            state.operator_reason = decision.reason
            self._set_phase(Phase.NEEDS_OPERATOR)
            return
        state.restarts += 1
        state.restart_times.append(self._now())
        if decision.backoff_s > 0:
            await workflow.sleep(
                decision.backoff_s,
                summary=(
                    f"backoff {decision.backoff_s:.1f} s before generation {state.generation + 1}"
                ),
            )
        self._set_phase(Phase.LAUNCHING)

    async def _forced_recovery(self, request: ForceRecover) -> None:
        self._force = None
        now = self._now()
        self._set_phase(Phase.RECOVERING)
        incident = self._open_incident(
            kind="operator",
            failure_class="operator",
            rank=None,
            fault_at=now,
            detected_at=now,
            step_at_failure=self._state.step,
            evidence=[f"force_recover: {request.reason}"],
        )
        incident.action = Action.RESTART.value
        incident.reason = f"forced by operator: {request.reason}"
        stopped = await self._stop_all(f"forced recovery: {request.reason}")
        if stopped.last_step is not None:
            incident.step_at_failure = max(incident.step_at_failure or 0, stopped.last_step)
        self._set_phase(Phase.LAUNCHING)

    async def _pause(self) -> None:
        self._pause_requested = False
        stopped = await self._stop_all("paused by operator")
        if stopped.last_step is not None:
            self._set_step(stopped.last_step)
        self._set_phase(Phase.PAUSED)

    async def _wait_for_operator(self) -> None:
        await workflow.wait_condition(lambda: self._resume_requested or self._force is not None)
        reason = self._force.reason if self._force else "resumed by operator"
        self._resume_requested = False
        self._force = None
        if self._state.phase == Phase.NEEDS_OPERATOR:
            # A person looked at it: the budget starts afresh.
            self._state.restart_times = []
            self._state.consecutive_failures = 0
            self._state.operator_reason = None
        workflow.logger.info("leaving %s: %s", self._state.phase, reason)
        self._set_phase(Phase.LAUNCHING)

    # ------------------------------------------------------------------ helpers

    @property
    def spec(self) -> JobSpec:
        assert self._spec is not None, "the workflow has not started"
        return self._spec

    def _now(self) -> float:
        return workflow.now().timestamp()

    def _run_root(self) -> str:
        return f"{self.spec.run_dir}/{self.spec.job_id}"

    def _interrupted(self) -> bool:
        return self._pause_requested or self._force is not None

    def _fail(self, reason: str) -> None:
        self._state.operator_reason = reason
        self._state.finished_at = self._now()
        self._set_phase(Phase.FAILED)

    async def _stop_all(self, reason: str) -> StopResult:
        grace = self.spec.recovery.stop_grace_s
        result = await workflow.execute_activity(
            stop,
            StopRequest(
                job_id=self.spec.job_id, run_root=self._run_root(), grace_s=grace, reason=reason
            ),
            start_to_close_timeout=timedelta(seconds=grace + 60),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=QUICK_RETRY,
            summary=f"stop ranks: {reason}",
        )
        self._state.generation_live = False
        return result

    def _open_incident(self, **fields: object) -> Incident:
        state = self._state
        if state.open_incident is not None:
            # Failed again before the previous recovery made a step: that one never recovered.
            previous = state.incidents[state.open_incident - 1]
            previous.reason += " (superseded: failed again before the first step)"
        fault_at = float(fields["fault_at"])  # type: ignore[arg-type]
        detected_at = float(fields["detected_at"])  # type: ignore[arg-type]
        incident = Incident.model_validate(
            {
                **fields,
                "id": len(state.incidents) + 1,
                "generation": state.generation,
                "detection_s": max(0.0, detected_at - fault_at),
            }
        )
        state.incidents.append(incident)
        state.open_incident = incident.id
        return incident

    def _account_resume(self, resume: CheckpointRef | None) -> None:
        """Fill in what the open incident cost in steps, now that we know where we resume."""
        state = self._state
        if state.open_incident is None:
            return
        incident = state.incidents[state.open_incident - 1]
        resumed = resume.step if resume else 0
        incident.resumed_from_step = resumed
        if incident.step_at_failure is not None:
            incident.steps_lost = max(0, incident.step_at_failure - resumed)

    def _close_open_incident(self, first_step_at: float) -> None:
        state = self._state
        if state.open_incident is not None:
            incident = state.incidents[state.open_incident - 1]
            incident.recovery_s = max(0.0, first_step_at - incident.fault_at)
            state.open_incident = None
        state.consecutive_failures = 0

    def _maybe_continue_as_new(self) -> None:
        info = workflow.info()
        if not (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self._continue_as_new_after
        ):
            return
        if self._pause_requested or self._force is not None or self._resume_requested:
            return  # finish handling operator messages in this run first
        self._state.runs += 1
        workflow.continue_as_new(
            JobInput(
                spec=self.spec,
                state=self._state,
                continue_as_new_after_events=self._continue_as_new_after,
            )
        )

    def _set_phase(self, phase: Phase) -> None:
        if self._state.phase != phase:
            self._state.phase = phase
            self._publish_phase()

    def _publish_phase(self) -> None:
        workflow.upsert_search_attributes([PHASE_ATTRIBUTE.value_set(self._state.phase.value)])

    def _set_step(self, step: int) -> None:
        if self._state.step != step:
            self._state.step = step
            workflow.upsert_search_attributes([STEP_ATTRIBUTE.value_set(step)])


def _cause(err: BaseException) -> str:
    """The innermost message of an activity failure: what actually went wrong."""
    while err.__cause__ is not None:
        err = err.__cause__
    return str(err)
