"""A simulated cluster behind the real activity names, on Temporal's time-skipping server.

The real ``JobWorkflow`` runs unchanged; only its activities are these. Simulated
time *is* the test server's clock: each activity reads it (``env.get_current_time``),
works out from the seeded failure trace what the cluster does next, and advances the
clock with ``env.sleep`` (a server-side timer, not a real sleep) before it answers.

How the time-skipping server moves its clock decides the design. It keeps a lock
counter: the driver's ``handle.result()`` releases its one lock, every *open* activity
holds one (from its scheduling until the server records its end), a workflow task in
flight holds one, and ``env.sleep(d)`` (``UnlockTimeSkippingWithSleep``) releases one
until the clock has moved ``d``. The clock jumps only while the counter is zero, so:

- every open activity must be inside ``env.sleep`` for time to pass: an activity that
  waits in any other way (for an update, a signal, real time) stalls the clock, and
  the sleeping ones then fail with ``RPCError: Timeout expired``;
- nothing sleeps outside an activity: with no open activity the counter is already
  zero, and another unlock is refused as unbalanced. The simulated operator therefore
  watches the clock instead of sleeping (:meth:`SimCluster._operate`), and the
  checkpoint watch shortens its sleep so the clock stops at the operator's moment;
- an activity still open when its workflow run closes leaks its lock: the run's
  continue-as-new cancels supervision and the checkpoint watch (``TRY_CANCEL``, the
  same workflow task), the server then rejects their completion ("Completed
  workflow") and never releases their locks, and the next run's sleeps stall. Each
  activity that ends after its run was replaced gives its lock back
  (:meth:`SimCluster._settle`);
- no activity sleeps longer than its own heartbeat or start-to-close timeout (the
  server enforces those in simulated time, and heartbeats do not reach it in time to
  count): supervision reports, and the watch wakes, at most every ``REPORT_S``, under
  the spec's 600 s heartbeat timeout.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar, cast

from temporalio import activity
from temporalio.api.testservice.v1 import UnlockTimeSkippingRequest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from bench.sim_model import ClusterTrace, CostModel, FailureEvent, Ledger, progress_at
from lazarus.domain.api import QUERY_STATUS, SIGNAL_RESUME, UPDATE_RETURN
from lazarus.domain.contracts import (
    AllocationGranted,
    CheckpointNowRequest,
    CheckpointNowResult,
    CheckpointRef,
    CheckpointSearch,
    EscalationHookRequest,
    EscalationHookResult,
    FailureReport,
    FileStamp,
    FindVerifiedCheckpointRequest,
    GarbageCollectionRequest,
    GarbageCollectionResult,
    GrowAllocationRequest,
    LaunchRequest,
    LaunchResult,
    NodeHealth,
    PreflightActivityRequest,
    PreflightReport,
    RestoreCheckpointRequest,
    RollbackRequest,
    RollbackResult,
    SetCheckpointIntervalRequest,
    SetCheckpointIntervalResult,
    StopRequest,
    StopResult,
    SubmitAllocationRequest,
    SuperviseOutcome,
    SuperviseRequest,
    UploadCheckpointRequest,
    UploadResult,
    VerifiedCheckpoint,
    WatchCheckpointsRequest,
)

ActivityMethod = TypeVar("ActivityMethod", bound=Callable[..., Awaitable[Any]])

REPORT_S = 570.0
"""The longest any simulated activity sleeps: below the 600 s heartbeat timeout (the
clock also creeps on in real time while it is locked, a few milliseconds a call)."""


def simulated(method: ActivityMethod) -> ActivityMethod:
    """Wrap a simulated activity: note its run on entry, settle its lock on exit."""

    @functools.wraps(method)
    async def wrapper(self: SimCluster, request: Any) -> Any:
        run_id = self._enter()
        try:
            return await method(self, request)
        finally:
            await self._settle(run_id)

    return cast(ActivityMethod, wrapper)


@dataclass
class Generation:
    number: int
    nodes: frozenset[str]
    resume_step: int
    every: int
    launched_at: float
    first_step_at: float
    first_step_reported: bool = False
    frozen_at: float | None = None
    """When its ranks stopped stepping (the fault, or the stop)."""
    segment_step: int = 0
    """The step at which the interval in force took effect (``resume_step`` at first)."""
    segment_at: float = 0.0
    """When it took effect (``first_step_at`` at first)."""
    committed_before: int | None = None
    """The newest checkpoint committed under earlier intervals of this generation."""
    blocked_before: float = 0.0
    """Seconds blocked in checkpoints under earlier intervals of this generation."""
    interval_changes: int = 0

    def __post_init__(self) -> None:
        self.segment_step = self.resume_step
        self.segment_at = self.first_step_at


@dataclass
class Interruption:
    at_s: float
    node: str
    category: str
    kind: str
    detected_at_s: float
    step_at_fault: int
    resume_step: int | None = None
    first_step_at_s: float | None = None


@dataclass
class SimCluster:
    env: WorkflowEnvironment
    trace: ClusterTrace
    costs: CostModel
    horizon_s: float
    operator_delay_s: float
    started: datetime | None = None
    workflow_id: str = ""
    client: Client | None = None
    generation: Generation | None = None
    committed: int | None = None
    broken: set[str] = field(default_factory=set)
    cursor: int = 0
    interruptions: list[Interruption] = field(default_factory=list)
    ledger: Ledger = field(default_factory=Ledger)
    checkpointing_s: float = 0.0
    final_step: int = 0
    operator_actions: list[str] = field(default_factory=list)
    operator_due_s: float | None = None
    """When the simulated operator acts on the page it got (None: no page pending)."""
    interval_changes: list[tuple[float, int]] = field(default_factory=list)
    """``(time, every_steps)`` for each interval the workflow sent (``interval: auto``)."""
    placed: set[str] = field(default_factory=set)
    """Every node a generation was launched on."""
    runs: list[str] = field(default_factory=list)
    """Workflow run ids in the order their first activity started."""
    leaked_locks_returned: int = 0
    _operators: list[asyncio.Task[None]] = field(default_factory=list)

    # ------------------------------------------------------------------ the clock

    async def now(self) -> float:
        current = await self.env.get_current_time()
        if self.started is None:
            self.started = current
        return (current - self.started).total_seconds()

    async def advance(self, seconds: float, phase: str | None = None) -> None:
        if seconds > 0:
            await self.env.sleep(seconds)
        if phase is not None:
            self.ledger.add(phase, max(0.0, seconds))

    def _enter(self) -> str:
        """Note the calling activity's workflow run (the newest run seen is the live
        one: a chain of continue-as-new runs never overlaps)."""
        run_id = activity.info().workflow_run_id or ""
        if run_id not in self.runs:
            self.runs.append(run_id)
        return run_id

    async def _settle(self, run_id: str) -> None:
        """Give back the time-skipping lock of an activity whose run has closed: the
        server will refuse its completion and would hold that lock for ever."""
        if self.runs and run_id != self.runs[-1]:
            await self.env.client.test_service.unlock_time_skipping(UnlockTimeSkippingRequest())
            self.leaked_locks_returned += 1

    # --------------------------------------------------------------- the training

    def _progress(self, gen: Generation, at: float) -> tuple[int, int | None, float]:
        """Step, newest committed checkpoint and seconds blocked in checkpoints of ``gen``
        at ``at``, across the intervals it was sent."""
        if at < gen.segment_at:
            return gen.segment_step, gen.committed_before, gen.blocked_before
        p = progress_at(
            gen.segment_step,
            at - gen.segment_at,
            gen.every,
            self.costs.step_s,
            self.costs.checkpoint_s,
        )
        checkpoint = p.checkpoint_step
        if gen.committed_before is not None:
            checkpoint = max(checkpoint or 0, gen.committed_before)
        return p.step, checkpoint, gen.blocked_before + p.checkpointing_s

    def _change_interval(self, gen: Generation, at: float, every: int) -> None:
        """The ranks follow a new interval from their next step (``should_checkpoint``
        reads the control file each step)."""
        if at > gen.segment_at:
            step, checkpoint, blocked = self._progress(gen, at)
            gen.segment_step, gen.segment_at = step, at
            gen.committed_before, gen.blocked_before = checkpoint, blocked
        gen.every = every
        gen.interval_changes += 1

    def _freeze(self, at: float) -> int:
        gen = self.generation
        if gen is None:
            return self.final_step
        if gen.frozen_at is None:
            gen.frozen_at = at
            step, checkpoint, blocked = self._progress(gen, at)
            self.checkpointing_s += blocked
            if checkpoint is not None:
                self.committed = max(checkpoint, self.committed or 0)
            self.final_step = step
        return self._progress(gen, gen.frozen_at)[0]

    def _newest_committed(self, at: float) -> int | None:
        gen = self.generation
        if gen is not None and gen.frozen_at is None:
            checkpoint = self._progress(gen, at)[1]
            if checkpoint is not None:
                return max(checkpoint, self.committed or 0)
        return self.committed

    def _consume_until(self, at: float, running: frozenset[str]) -> FailureEvent | None:
        """Walk the trace up to ``at``: the first failure on a node of the running
        generation is returned (not consumed); failures elsewhere break hardware."""
        events = self.trace.events
        while self.cursor < len(events) and events[self.cursor].at_s <= at:
            event = events[self.cursor]
            if event.node in running:
                return event
            if event.share.hardware:
                self.broken.add(event.node)
            self.cursor += 1
        return None

    # ----------------------------------------------------------------- activities

    @activity.defn(name="launch")
    @simulated
    async def launch(self, request: LaunchRequest) -> LaunchResult:
        now = await self.now()
        await self.advance(self.costs.launch_s, "launch")
        launched = now + self.costs.launch_s
        self._freeze(now)
        nodes = [n.name for n in (request.nodes or request.spec.nodes)]
        resume = request.resume.step if request.resume is not None else 0
        if self.interruptions and self.interruptions[-1].resume_step is None:
            self.interruptions[-1].resume_step = resume
        self.placed.update(nodes)
        self.generation = Generation(
            number=request.generation,
            nodes=frozenset(nodes),
            resume_step=resume,
            every=request.spec.checkpoints.every_steps or 0,
            launched_at=launched,
            first_step_at=launched + self.costs.startup_s,
        )
        wall = self._wall(launched)
        return LaunchResult(
            generation=request.generation,
            master_addr="10.0.0.1",
            master_port=29500,
            run_dir=f"{request.run_root}/gen-{request.generation:05d}",
            ranks=[],
            launched_at=wall,
            adopted=False,
            ranks_started_at=wall,
        )

    def _wall(self, at: float) -> float:
        assert self.started is not None
        return self.started.timestamp() + at

    @activity.defn(name="supervise")
    @simulated
    async def supervise(self, request: SuperviseRequest) -> SuperviseOutcome:
        now = await self.now()
        gen = self.generation
        if gen is None or gen.number != request.generation or gen.frozen_at is not None:
            return SuperviseOutcome(
                kind="progress", generation=request.generation, observed_at=self._wall(now)
            )
        end = min(now + min(request.report_after_s, REPORT_S), self.horizon_s)
        event = self._consume_until(end, gen.nodes)
        if event is not None:
            detected = max(event.at_s, now) + self.costs.detection_s(event.share.kind)
            if detected <= end:
                return await self._fail(gen, event, now, detected)
        if request.report_first_step and not gen.first_step_reported and gen.first_step_at <= end:
            await self.advance(max(0.0, gen.first_step_at - now), "startup")
            gen.first_step_reported = True
            last = self.interruptions[-1] if self.interruptions else None
            if last is not None and last.first_step_at_s is None:
                last.first_step_at_s = gen.first_step_at
            return SuperviseOutcome(
                kind="first_step",
                generation=gen.number,
                observed_at=self._wall(gen.first_step_at),
                first_step_at=self._wall(gen.first_step_at),
                step=gen.resume_step + 1,
                seconds_per_step=self.costs.step_s,
            )
        await self.advance(end - now, "running")
        step = self._progress(gen, end)[0]
        if end >= self.horizon_s:
            self._freeze(end)
            return SuperviseOutcome(
                kind="succeeded", generation=gen.number, observed_at=self._wall(end), step=step
            )
        return SuperviseOutcome(
            kind="progress",
            generation=gen.number,
            observed_at=self._wall(end),
            step=step,
            seconds_per_step=self.costs.step_s,
            progress_signal="heartbeat",
            checkpoint_save_s=self._save_s(gen),
        )

    def _save_s(self, gen: Generation) -> float | None:
        """δ as the ranks would measure it: known once this generation has saved."""
        if gen.every <= 0 or gen.frozen_at is not None:
            return None
        return self.costs.checkpoint_s

    async def _fail(
        self, gen: Generation, event: FailureEvent, now: float, detected: float
    ) -> SuperviseOutcome:
        fault = max(event.at_s, now)
        await self.advance(fault - now, "running")
        await self.advance(detected - fault, "detection")
        self.cursor += 1
        step = self._freeze(fault)
        if event.share.hardware:
            self.broken.add(event.node)
        self.interruptions.append(
            Interruption(fault, event.node, event.share.name, event.share.kind, detected, step)
        )
        rank = sorted(gen.nodes).index(event.node)
        return SuperviseOutcome(
            kind="failed",
            generation=gen.number,
            observed_at=self._wall(detected),
            step=step,
            failure=FailureReport(
                kind=event.share.kind,
                failure_class=event.share.failure_class,
                rank=rank,
                node=event.node,
                exit_code=1 if event.share.kind == "crash" else None,
                evidence=[f"simulated {event.share.name} on {event.node}"],
                fault_at=self._wall(fault),
                detected_at=self._wall(detected),
                step_at_failure=step,
            ),
        )

    @activity.defn(name="stop")
    @simulated
    async def stop(self, request: StopRequest) -> StopResult:
        now = await self.now()
        await self.advance(self.costs.stop_s, "stop")
        last = self._freeze(now)
        return StopResult(generations=[], signalled_groups=0, killed_groups=0, last_step=last)

    @activity.defn(name="preflight")
    @simulated
    async def preflight(self, request: PreflightActivityRequest) -> PreflightReport:
        now = await self.now()
        await self.advance(self.costs.preflight_s, "preflight")
        self._consume_until(now + self.costs.preflight_s, frozenset())
        return PreflightReport(
            nodes=[
                NodeHealth(
                    node=n.name,
                    ok=n.name not in self.broken,
                    problems=[] if n.name not in self.broken else ["simulated: GPU/host down"],
                )
                for n in request.nodes
            ]
        )

    @activity.defn(name="find_verified_checkpoint")
    @simulated
    async def find_verified_checkpoint(
        self, request: FindVerifiedCheckpointRequest
    ) -> CheckpointSearch:
        now = await self.now()
        await self.advance(self.costs.search_s, "resume_search")
        step = self._newest_committed(now)
        if step is None or step in request.exclude_steps:
            return CheckpointSearch()
        if request.below_step is not None and step >= request.below_step:
            return CheckpointSearch()
        return CheckpointSearch(
            chosen=CheckpointRef(step=step, path=f"{request.checkpoint_dir}/step-{step:08d}"),
            location="local",
        )

    @activity.defn(name="watch_checkpoints")
    @simulated
    async def watch_checkpoints(self, request: WatchCheckpointsRequest) -> CheckpointRef | None:
        now = await self.now()
        wait = min(max(request.min_interval_s, 1.0), REPORT_S)
        if self.operator_due_s is not None and self.operator_due_s > now:
            wait = min(wait, self.operator_due_s - now)  # the clock stops for the operator
        await self.advance(wait)
        step = self._newest_committed(now + wait)
        if step is None or (
            request.newer_than_step is not None and step <= request.newer_than_step
        ):
            return None
        path = f"sim/step-{step:08d}"
        stamp = FileStamp(size=1, mtime_ns=step)
        verified = VerifiedCheckpoint(
            step=step, path=path, files={"state.pt": stamp}, verified_at=self._wall(now + wait)
        )
        return CheckpointRef(step=step, path=path, verified=verified)

    @activity.defn(name="collect_garbage")
    @simulated
    async def collect_garbage(self, request: GarbageCollectionRequest) -> GarbageCollectionResult:
        return GarbageCollectionResult()

    @activity.defn(name="checkpoint_now")
    @simulated
    async def checkpoint_now(self, request: CheckpointNowRequest) -> CheckpointNowResult:
        return CheckpointNowResult(checkpoint=None, waited_s=0.0)

    @activity.defn(name="roll_back_checkpoint")
    @simulated
    async def roll_back_checkpoint(self, request: RollbackRequest) -> RollbackResult:
        return RollbackResult(retired=[], resume=None)

    @activity.defn(name="restore_checkpoint")
    @simulated
    async def restore_checkpoint(self, request: RestoreCheckpointRequest) -> CheckpointRef:
        raise ApplicationError("no durable tier in the simulation", non_retryable=True)

    @activity.defn(name="upload_checkpoint")
    @simulated
    async def upload_checkpoint(self, request: UploadCheckpointRequest) -> UploadResult:
        raise ApplicationError("no durable tier in the simulation", non_retryable=True)

    @activity.defn(name="submit_allocation")
    @simulated
    async def submit_allocation(self, request: SubmitAllocationRequest) -> AllocationGranted:
        raise ApplicationError("no Slurm in the simulation", non_retryable=True)

    @activity.defn(name="grow_allocation")
    @simulated
    async def grow_allocation(self, request: GrowAllocationRequest) -> AllocationGranted:
        raise ApplicationError("no Slurm in the simulation", non_retryable=True)

    @activity.defn(name="run_escalation_hook")
    @simulated
    async def run_escalation_hook(self, request: EscalationHookRequest) -> EscalationHookResult:
        """The page reaches the simulated operator, who acts ``operator_delay_s`` later
        (:meth:`_operate`, a task beside the worker: the hook itself returns now)."""
        now = await self.now()
        if self.operator_due_s is None:
            self.operator_due_s = now + self.operator_delay_s
            self._operators.append(asyncio.create_task(self._operate(now)))
        return EscalationHookResult(ran=True, exit_code=0)

    async def _operate(self, paged_at: float) -> None:
        """Wait for the clock to reach the operator's moment (it never sleeps: outside
        an activity that would unbalance the time-skipping lock; the checkpoint watch
        stops the clock there), repair and return every quarantined node
        (``lazarus return``), and resume the job."""
        assert self.client is not None and self.operator_due_s is not None
        while await self.now() < self.operator_due_s:
            await asyncio.sleep(0.005)
        self.ledger.add("operator_wait", await self.now() - paged_at)
        handle = self.client.get_workflow_handle(self.workflow_id)
        status: Any = await handle.query(QUERY_STATUS)
        for node in [q["node"] for q in status["nodes"]["quarantined"]]:
            self.broken.discard(node)
            try:
                await handle.execute_update(UPDATE_RETURN, {"node": node})
            except Exception as err:
                self.operator_actions.append(f"return {node} refused: {err}")
            else:
                self.operator_actions.append(f"return {node}")
        self.operator_due_s = None
        await handle.signal(SIGNAL_RESUME)
        self.operator_actions.append("resume")

    @activity.defn(name="set_checkpoint_interval")
    @simulated
    async def set_checkpoint_interval(
        self, request: SetCheckpointIntervalRequest
    ) -> SetCheckpointIntervalResult:
        """``checkpoints.interval: auto``: the ranks of the live generation follow it."""
        now = await self.now()
        gen = self.generation
        if gen is not None and gen.frozen_at is None:
            self._change_interval(gen, now, request.checkpoint_every_steps)
            self.interval_changes.append((now, request.checkpoint_every_steps))
        return SetCheckpointIntervalResult(nodes=[n.name for n in request.nodes])

    def activities(self) -> list[Any]:
        return [
            self.launch,
            self.supervise,
            self.stop,
            self.preflight,
            self.find_verified_checkpoint,
            self.watch_checkpoints,
            self.collect_garbage,
            self.checkpoint_now,
            self.roll_back_checkpoint,
            self.restore_checkpoint,
            self.upload_checkpoint,
            self.submit_allocation,
            self.grow_allocation,
            self.run_escalation_hook,
            self.set_checkpoint_interval,
        ]

    async def close(self) -> None:
        """End the operator tasks; one that failed is noted in ``operator_actions``."""
        for task in self._operators:
            if not task.done():
                task.cancel()
        results = await asyncio.gather(*self._operators, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                self.operator_actions.append(f"operator failed: {result!r}")
