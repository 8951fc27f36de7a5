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

The class is the job's core: the message handlers, the turn loop (``_turn``) and
the launch, supervise, pause and wait turns. Each feature's durable steps (await an
activity, record the result, change phase) live in a collaborator of their own,
which gets a narrow :class:`~workflows.run_context.JobRun` (the spec
read-only, the state, the clock, the phase, routing, an escalation), not the
workflow:

- ``run_context``: ``JobRun``, and the pool lock every pool edit across an await holds;
- ``recovery_steps``: a failure's recovery, a forced recovery, a straggler swap;
- ``checkpoint_steps``: resume point, verify, restore, retier, just-in-time checkpoint,
  planned stop, rollback, interval tuning;
- ``stop_steps``: stops, fencing, swapping a node out; ``preflight_steps``: the preflight;
- ``slurm_steps``: the first submit, preemption, resubmission, ``slurm.grow``;
- ``fleet_steps`` (over ``fleet_link``): lease, report, spares, hand back, release;
- ``hand_over``: continue-as-new and escalation hook delivery;
- ``housekeeping``: checkpoint tiering and retention, a loop beside the machine.

What they decide with lives in pure modules, each unit-tested without a server:
``playbook`` (with ``failures``, ``stragglers``, ``rejoin``), ``state`` (incidents,
the node pool, the :class:`Phase` diagram and its ``TRANSITIONS``),
``operator_requests``, ``stops``, ``resume_points``, ``preemption``, ``escalation``,
``placement``, ``routing``, ``checkpoint_tuning``, ``current_details``, ``status`` and
``accounting``. Every ``workflow.patched`` id is in ``patches``.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from lazarus.domain.activity_refs import LAUNCH, SUPERVISE
    from lazarus.domain.api import (
        QUERY_STATUS,
        SIGNAL_FORCE_RECOVER,
        SIGNAL_PAUSE,
        SIGNAL_RESUME,
        UPDATE_DRAIN,
        UPDATE_RECOVER,
        UPDATE_RETURN,
        WORKFLOW_TYPE,
    )
    from lazarus.domain.contracts import (
        LaunchRequest,
        NodeAccess,
        SuperviseOutcome,
        SuperviseRequest,
    )
    from lazarus.domain.spec import JobSpec
    from workflows.activity_calls import (
        LAUNCH_RETRY,
        QUICK_RETRY,
        cause,
        execute,
        start,
        worker_loss_timeout,
    )
    from workflows.checkpoint_steps import CheckpointSteps, SearchedBeside
    from workflows.checkpoint_tuning import TUNED_OUTCOMES
    from workflows.failures import ranks_would_not_die, unreachable_failure, unreachable_node
    from workflows.fleet_link import waits_on_fleet
    from workflows.fleet_steps import FleetSteps
    from workflows.hand_over import HandOver
    from workflows.housekeeping import Housekeeper
    from workflows.operator_requests import (
        WAITING,
        drain_recovery,
        drain_refusal,
        drain_reply,
        pause_refusal,
        queued_refusal,
        recover_refusal,
        recover_reply,
        reopen_pool,
        resume_refusal,
        return_refusal,
    )
    from workflows.patches import (
        PATCH_CONTINUE_AS_NEW_ANY_PHASE,
        PATCH_FAST_RECOVERY,
        PATCH_HANDLERS_FINISH,
        PATCH_NODES_BEFORE_RESUME,
        PATCH_PAUSED_STAYS_PAUSED,
        PATCH_POOL_LOCK,
        PATCH_RUN_DIRECTORY,
        PATCH_SEARCH_ATTRIBUTES_V2,
        PATCH_SLURM_PREEMPTION,
    )
    from workflows.placement import (
        active_nodes,
        generation_dir,
        prewarm_nodes,
        run_root,
        world_size,
    )
    from workflows.preemption import handled_preemption_at, preempt_marker_for
    from workflows.preflight_steps import Preflight
    from workflows.recovery_steps import RecoverySteps
    from workflows.rejoin import rejoin_evidence
    from workflows.routing import route
    from workflows.run_context import JobRun
    from workflows.slurm_steps import SlurmSteps
    from workflows.state import (
        MAX_RECORDS,
        ForceRecover,
        IgnoredMessage,
        JobInput,
        JobState,
        JobStatus,
        NodeRequest,
        Phase,
    )
    from workflows.status import job_status
    from workflows.stop_steps import StopSteps


@workflow.defn(name=WORKFLOW_TYPE)
class JobWorkflow:
    def __init__(self) -> None:
        self._state = JobState()
        self._run = JobRun(self._state)
        self._pause_requested = False
        self._resume_requested = False
        self._force: ForceRecover | None = None
        self._pausing = False
        """A pause is being carried out (its just-in-time checkpoint and stop)."""
        self._stops = StopSteps(self._run)
        self._checkpoints = CheckpointSteps(self._run, self._stops)
        self._fleet = FleetSteps(self._run)
        self._slurm = SlurmSteps(self._run, self._stops, self._checkpoints)
        self._preflight = Preflight(self._run, self._stops, self._slurm, self._fleet)
        self._recovery = RecoverySteps(
            self._run, self._stops, self._checkpoints, self._fleet, self._slurm
        )
        self._hand_over = HandOver(
            self._run, 10_000, busy=lambda: self._interrupted() or self._resume_requested
        )

    # ----------------------------------------------------------------- messages

    # A message that makes no sense in the current phase is recorded as ignored, with
    # the reason, and has no later effect: a stray ``resume`` sent to a running job
    # must not turn the next ``pause`` into a no-op or resume a later escalation.

    @workflow.signal(name=SIGNAL_PAUSE)
    def pause(self) -> None:
        problem = pause_refusal(self._state.phase, self._pausing or self._pause_requested)
        if problem is not None:
            self._ignore(SIGNAL_PAUSE, problem)
            return
        self._pause_requested = True

    @workflow.signal(name=SIGNAL_RESUME)
    def resume(self) -> None:
        if self._pause_requested and self._state.phase not in WAITING:
            self._pause_requested = False  # withdrawn before it was acted on
            self._ignore(SIGNAL_RESUME, "withdrew the pause that had not started yet")
            return
        problem = resume_refusal(self._state.phase)
        if problem is not None:
            self._ignore(SIGNAL_RESUME, problem)
            return
        self._resume_requested = True

    @workflow.signal(name=SIGNAL_FORCE_RECOVER)
    def force_recover(self, request: ForceRecover) -> None:
        """The signal form, kept for older clients: it cannot answer, so a request the
        update would refuse is recorded as ignored instead. Histories recorded before
        a paused job refused it replay as they ran (asked only while paused)."""
        paused_refuses = self._state.phase != Phase.PAUSED or workflow.patched(
            PATCH_PAUSED_STAYS_PAUSED
        )
        problem = recover_refusal(self._state, self._force, request, paused_refuses=paused_refuses)
        if problem is not None:
            self._ignore(SIGNAL_FORCE_RECOVER, problem)
            return
        self._force = request

    @workflow.update(name=UPDATE_RECOVER)
    def recover(self, request: ForceRecover) -> str:
        self._refuse_if_queued(f"recover: {request.reason}")
        self._force = request
        return recover_reply(request)

    @recover.validator
    def _validate_recover(self, request: ForceRecover) -> None:
        problem = recover_refusal(self._state, self._force, request)
        if problem is not None:
            raise ValueError(problem)

    def _refuse_if_queued(self, what: str) -> None:
        """Validators of two updates in one workflow task can both pass before either
        handler runs: the handler checks again, so exactly one request is queued and
        the other caller is told, never acknowledged and then dropped."""
        problem = queued_refusal(self._force, what)
        if problem is not None:
            raise ApplicationError(problem, non_retryable=True)

    def _ignore(self, name: str, reason: str) -> None:
        state = self._state
        workflow.logger.warning("ignored %s: %s", name, reason)
        state.ignored_messages = [
            *state.ignored_messages,
            IgnoredMessage(name=name, at=self._run.now(), phase=state.phase, reason=reason),
        ][-MAX_RECORDS:]

    @workflow.update(name=UPDATE_DRAIN)
    def drain(self, request: NodeRequest) -> str:
        self._refuse_if_queued(f"drain {request.node}")
        self._force = drain_recovery(request)
        return drain_reply(request)

    @drain.validator
    def _validate_drain(self, request: NodeRequest) -> None:
        problem = drain_refusal(self._state, self._force, request)
        if problem is not None:
            raise ValueError(problem)

    @workflow.update(name=UPDATE_RETURN)
    async def return_node(self, request: NodeRequest) -> str:
        """Take a node out of quarantine into the spares, but only once whatever stale
        generation it may still run has been stopped (fencing). The pool lock keeps a
        recovery from moving nodes between the fence and the release (histories from
        before PATCH_POOL_LOCK ran without it)."""
        async with self._run.editing_pool(workflow.patched(PATCH_POOL_LOCK)):
            stopped = await self._stops.stop_all(
                f"fence {request.node} before returning it", [request.node], undrain=True
            )
            if request.node in stopped.unreachable:
                raise ApplicationError(
                    f"node {request.node!r} is still unreachable; it stays quarantined",
                    non_retryable=True,
                )
            self._state.pool.release(request.node)
            return f"{request.node} is a spare again"

    @return_node.validator
    def _validate_return(self, request: NodeRequest) -> None:
        fleet = self.spec.fleet.name if self.spec.fleet is not None else None
        problem = return_refusal(self._state, request, fleet)
        if problem is not None:
            raise ValueError(problem)

    @workflow.query(name=QUERY_STATUS)
    def status(self) -> JobStatus:
        return job_status(self.spec, self._state, self._run.now(), run_root(self.spec, self._state))

    # ---------------------------------------------------------------- main loop

    @workflow.run
    async def run(self, job: JobInput) -> JobStatus:
        self._run.begin(job.spec)
        self._hand_over.continue_as_new_after = job.continue_as_new_after_events
        self._run.strict_phases = job.strict_phases
        if job.state is not None:
            self._state = self._run.state = job.state
        else:
            self._state.started_at = self._run.now()
            self._state.pool.active = [n.name for n in job.spec.nodes]
            self._state.pool.spares = [n.name for n in job.spec.spares]
            if workflow.patched(PATCH_RUN_DIRECTORY):
                # A new start never sees an earlier start's launch.json, exit files,
                # fences or escalation markers; continue-as-new keeps the key.
                self._state.run_key = f"run-{workflow.info().run_id}"
        self._run.continue_anywhere = workflow.patched(PATCH_CONTINUE_AS_NEW_ANY_PHASE)
        self._run.fast = workflow.patched(PATCH_FAST_RECOVERY)
        self._run.attributes_v2 = workflow.patched(PATCH_SEARCH_ATTRIBUTES_V2)
        if job.state is None and job.spec.fleet is not None:
            await self._fleet.lease()
        if job.state is None and not await self._slurm.submit_first():
            return self.status()  # Slurm refused the allocation: nothing ran, nothing to undo
        self._run.pin_to_host()
        self._run.publish_phase()
        self._run.housekeeper = Housekeeper(self.spec, self._state)
        self._run.housekeeper.start()
        for request in self._state.pending_hooks:  # carried over by continue-as-new
            self._hand_over.deliver_later(request)
        try:
            while not self._state.phase.is_terminal:
                await self._turn()
                self._run.explain()
        except asyncio.CancelledError:
            self._stop_housekeeping()
            await self._stops.stop_all("job cancelled", end_of_run=self._stops.run_leaves_state())
            if self._run.housekeeper is not None:
                await self._run.housekeeper.ended()
            await self._fleet.release()
            self._run.set_phase(Phase.CANCELLED)
            self._state.finished_at = self._run.now()
            raise
        if self._run.housekeeper is not None:
            await self._run.housekeeper.ended()
        if self._run.fast and self._stops.run_leaves_state():
            await self._stops.stop_all(f"end of run ({self._state.phase.value})", end_of_run=True)
        await self._fleet.release()
        # An update still running (a return's fence) finishes before the run completes:
        # no caller is left without an answer (only asked when one is running).
        if not workflow.all_handlers_finished() and workflow.patched(PATCH_HANDLERS_FINISH):
            await workflow.wait_condition(workflow.all_handlers_finished)
        return self.status()

    async def _turn(self) -> None:
        """One durable move of the state machine."""
        phase = self._state.phase
        if self._pause_requested and phase not in WAITING:
            await self._pause()
        elif self._force is not None and phase == Phase.RUNNING:
            force, self._force = self._force, None  # taken: a new request may queue
            async with self._run.pool_lock:
                await self._recovery.forced(force)
        elif phase in (Phase.PENDING, Phase.LAUNCHING):
            async with self._run.pool_lock:
                await self._launch_next()
        elif phase == Phase.RUNNING:
            await self._hand_over.maybe_continue_as_new()
            await self._supervise()
        elif phase in WAITING:
            await self._wait_for_operator()
        else:  # RECOVERING is only ever transient inside _recover
            self._run.set_phase(Phase.LAUNCHING)

    # ------------------------------------------------------------------- phases

    async def _launch_next(self) -> None:
        spec = self.spec
        state = self._state
        self._run.set_phase(Phase.LAUNCHING)
        rejoining = state.rejoin_ranks if state.stopped_generation == state.generation else []
        if (
            state.generation > 0
            and not rejoining
            and not (self._run.fast and state.stopped_generation == state.generation)
        ):
            await self._stops.stop_all(
                f"fence generation {state.generation} before relaunch",
                skip=self._stops.dead_nodes() if self._run.fast else (),
            )
        if state.stuck_ranks is not None:
            # Never launch beside ranks that would not die: a person must look.
            stuck, state.stuck_ranks = state.stuck_ranks, None
            self._run.needs_operator(stuck)  # waits for a person, never for a node
            return
        await self._fleet.hand_back()
        # The resume point must be chosen for the nodes that launch: the memory tier's
        # snapshot exists only on the nodes its search checked (issue 26).
        nodes_first = workflow.patched(PATCH_NODES_BEFORE_RESUME)
        beside: SearchedBeside | None = None
        if nodes_first:
            planned_on = list(state.pool.active)
            # The search runs beside it (made again if the preflight moved a node).
            check = self._preflight.check_active_nodes
            ready, beside = await self._checkpoints.search_beside(check)
            if rejoining and state.pool.active != planned_on:
                rejoining = []
                ready = await self._recovery.drop_rejoin(planned_on) and ready
            if not ready:
                return
        resume = await self._checkpoints.resume_point(beside)
        recovering = state.current_incident
        if recovering is not None and recovering.timeline is not None:
            recovering.timeline.resume_chosen_at = self._run.now()
        state.resume = resume
        state.account_resume(resume)
        state.cut_timeline(resume)
        self._checkpoints.retier_from(resume)
        if not nodes_first and not await self._preflight.check_active_nodes():
            return
        spec = self.spec  # a node Slurm added (slurm.grow) during the preflight
        state.generation += 1
        origin = f"step {resume.step}" if resume else "scratch"
        if recovering is not None and recovering.timeline is not None:
            recovering.timeline.launch_requested_at = self._run.now()
        try:
            result = await execute(
                LAUNCH,
                LaunchRequest(
                    spec=spec,
                    generation=state.generation,
                    resume=resume,
                    nodes=active_nodes(spec, state.pool),
                    run_root=run_root(spec, state) if state.run_key else None,
                    rejoin_ranks=rejoining,
                    prewarm=prewarm_nodes(spec, state.pool),
                ),
                start_to_close_timeout=timedelta(seconds=120),
                heartbeat_timeout=worker_loss_timeout(self.spec),
                retry_policy=LAUNCH_RETRY,
                **route(LAUNCH, state.host_task_queue),
                summary=(
                    f"launch generation {state.generation}: {world_size(spec, state.pool)} "
                    f"ranks on {', '.join(state.pool.active)} from {origin}"
                ),
            )
        except ActivityError as err:
            state.rejoin_ranks = []
            unreachable = unreachable_node(err)
            if unreachable is not None:
                # A blip during a launch is a node failure for the playbook (a spare, or
                # an operator), never the end of the job.
                failure = unreachable_failure(spec, state, unreachable, cause(err), self._run.now())
                await self._recovery.recover(failure)
                return
            if ranks_would_not_die(err):
                await self._stops.fence_a_stuck_carry()
                return
            await self._stops.stop_all("launch failed")
            self._run.fail(f"launch of generation {state.generation} failed: {cause(err)}")
            return
        state.generation_live = True
        self._run.learn_host(result.host)
        state.ranks = []
        state.noted_stragglers = []
        state.rejoin_ranks = []
        state.rejoining = result.rejoined
        relaunched = state.current_incident
        if relaunched is not None:
            relaunched.relaunched_at = result.launched_at
            if relaunched.timeline is not None:
                relaunched.timeline.rank_started_at = result.ranks_started_at
            if result.warm_start is not None:
                relaunched.evidence.append(result.warm_start.summary())
            if rejoining:
                relaunched.add_evidence(rejoin_evidence(result))
                relaunched.restart_path = "rejoin" if result.rejoined else "whole_generation"
        workflow.logger.info(
            "launched generation %d on port %d (adopted=%s)",
            result.generation,
            result.master_port,
            result.adopted,
        )
        self._run.set_phase(Phase.RUNNING)

    async def _supervise(self) -> None:
        spec = self.spec
        state = self._state
        request = SuperviseRequest(
            job_id=spec.job_id,
            generation=state.generation,
            run_dir=generation_dir(spec, state),
            world_size=world_size(spec, state.pool),
            health=spec.health,
            resume_step=state.resume.step if state.resume else None,
            report_first_step=state.open_incident is not None,
            report_after_s=spec.health.report_interval_s,
            access=NodeAccess.of(spec, active_nodes(spec, state.pool)),
            nproc_per_node=spec.nproc_per_node,
            node_timeout_s=spec.node_timeout_s,
            preempt_marker=preempt_marker_for(spec),
            preempt_handled_at=handled_preemption_at(state) if spec.slurm is not None else None,
            straggler=spec.straggler,
            known_stragglers=state.noted_stragglers,
            rejoining=state.rejoining,
            rejoin_timeout_s=spec.rejoins.timeout_s if spec.rejoins is not None else None,
        )
        handle = start(
            SUPERVISE,
            request,
            start_to_close_timeout=timedelta(seconds=spec.health.report_interval_s + 600),
            heartbeat_timeout=timedelta(seconds=spec.health.supervisor_heartbeat_timeout_s),
            retry_policy=QUICK_RETRY,
            cancellation_type=workflow.ActivityCancellationType.TRY_CANCEL,
            summary=f"supervise generation {state.generation}",
            **route(SUPERVISE, state.host_task_queue),
        )
        await workflow.wait_condition(
            lambda: handle.done() or self._interrupted() or self._hand_over.due()
        )
        if not handle.done():
            handle.cancel()
            with contextlib.suppress(ActivityError, asyncio.CancelledError):
                await handle
            return  # the next turn handles the pause, forced recovery or continue-as-new
        try:
            outcome = await handle
        except ActivityError as err:
            self._run.fail(f"supervision of generation {state.generation} failed: {cause(err)}")
            return
        await self._on_outcome(outcome)

    async def _on_outcome(self, outcome: SuperviseOutcome) -> None:
        state = self._state
        state.ranks = outcome.ranks
        if outcome.progress_signal is not None:
            state.progress_signal = outcome.progress_signal
        if outcome.seconds_per_step is not None:
            state.seconds_per_step = outcome.seconds_per_step
        if outcome.step is not None:
            self._run.set_step(outcome.step)
        if outcome.kind == "first_step":
            state.rejoining = []  # every carried rank acts for this generation now
            first_step_at = outcome.first_step_at or outcome.observed_at
            recovered = state.current_incident
            if recovered is not None and recovered.timeline is not None:
                timeline = recovered.timeline.with_rank_marks(outcome.rank_phases)
                recovered.timeline = timeline.model_copy(update={"first_step_at": first_step_at})
            state.close_incident(first_step_at)
        elif outcome.kind == "succeeded":
            if state.pool.unfenced():
                await self._stops.stop_all("job finished: fence quarantined nodes that came back")
            state.generation_live = False
            state.finished_at = self._run.now()
            self._run.set_phase(Phase.SUCCEEDED)
        elif outcome.kind == "failed" and outcome.failure is not None:
            async with self._run.pool_lock:
                await self._recovery.recover(outcome.failure)
        elif outcome.kind == "straggler" and outcome.straggler is not None:
            async with self._run.pool_lock:
                await self._recovery.straggler_swap(outcome.straggler)
        elif (
            outcome.kind == "preempted"
            and outcome.failure is not None
            and workflow.patched(PATCH_SLURM_PREEMPTION)
        ):
            async with self._run.pool_lock:
                await self._slurm.on_preempted(outcome.failure)
        if self.spec.checkpoints.interval == "auto" and outcome.kind in TUNED_OUTCOMES:
            await self._checkpoints.tune_interval(outcome)

    async def _pause(self) -> None:
        self._pause_requested = False
        self._pausing = True
        try:
            if self._state.phase == Phase.RUNNING and self._state.generation_live:
                await self._checkpoints.planned_stop("pause")
            else:
                await self._stops.stop_all("paused by operator")
            self._run.set_phase(Phase.PAUSED)
        finally:
            self._pausing = False

    async def _wait_for_operator(self) -> None:
        fleet_retry_s = waits_on_fleet(self.spec, self._state)
        try:
            await workflow.wait_condition(
                lambda: self._resume_requested or self._force is not None or self._hand_over.due(),
                timeout=fleet_retry_s,
                timeout_summary="short of nodes: ask the fleet again",
            )
        except TimeoutError:
            async with self._run.pool_lock:
                await self._fleet.ask_again()
            return
        if not (self._resume_requested or self._force is not None):
            await (
                self._hand_over.maybe_continue_as_new()
            )  # a long wait must not grow history forever
            return
        force = self._force
        reason = force.reason if force else "resumed by operator"
        self._resume_requested = False
        self._force = None
        # Nodes the operator returned while we waited fill the slots that were lost.
        short = reopen_pool(self.spec, self._state, force, self._run.now())
        if short is not None:
            # A person has looked: what is left to wait for is nodes.
            self._state.operator_reason = short
            self._state.waits_for_node = True
            self._run.set_phase(Phase.NEEDS_OPERATOR)
            return
        if self._state.phase == Phase.NEEDS_OPERATOR:
            # A person looked at it: the budget starts afresh.
            self._state.restart_times = []
            self._state.consecutive_failures = 0
            self._state.operator_reason = None
        workflow.logger.info("leaving %s: %s", self._state.phase, reason)
        self._run.set_phase(Phase.LAUNCHING)

    def _stop_housekeeping(self) -> None:
        if self._run.housekeeper is not None:
            self._run.housekeeper.stop()

    # ------------------------------------------------------------------ helpers

    @property
    def spec(self) -> JobSpec:
        return self._run.spec

    def _interrupted(self) -> bool:
        return self._pause_requested or self._force is not None
