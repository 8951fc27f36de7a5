"""Fake activities for testing the job workflow's decisions against a real server.

Each fake is registered under the real activity's name, so the real ``JobWorkflow``
runs unchanged; a :class:`Script` per job says what the "cluster" does (a launch that
meets an unreachable node, a stop that cannot kill, a failure at some generation) and
records what the workflow asked for. No ranks, no files: these tests are about policy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from lazarus.activities.fleet import (
    fleet_hand_back,
    fleet_lease,
    fleet_release,
    fleet_report,
)
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
    UnkillableGroup,
    UploadCheckpointRequest,
    UploadResult,
    VerifiedCheckpoint,
    WarmStartOutcome,
    WatchCheckpointsRequest,
)


@dataclass
class Script:
    """What the fake cluster does for one job, and what the workflow asked of it."""

    unreachable_at_launch: dict[int, str] = field(default_factory=dict)
    """generation -> node the launch cannot reach."""
    failures: dict[int, FailureReport] = field(default_factory=dict)
    """generation -> the failure supervision reports (else it runs until cancelled)."""
    succeed_at: set[int] = field(default_factory=set)
    """Generations whose supervision reports success."""
    unkillable: list[UnkillableGroup] = field(default_factory=list)
    """Reported by every stop while non-empty."""
    failure_evidence: list[str] = field(default_factory=list)
    hook_fails: bool = False
    hook_blocks: int = 0
    """Hook deliveries that hang until cancelled (a slow webhook), before the rest run."""
    checkpoint_steps: list[int] = field(default_factory=list)
    """Committed, verified checkpoints the fake search can choose from."""
    watch_reports: list[int] = field(default_factory=list)
    """Steps the fake checkpoint watch reports, one per call, before it blocks."""
    retire_on_rollback: list[int] = field(default_factory=list)
    first_step_phases: dict[int, dict[str, float]] = field(default_factory=dict)
    """generation -> rank phase marks: supervision reports the first step with them."""
    launch_warm: WarmStartOutcome | None = None
    """What every launch reports about warm starts (None: warm starts off)."""
    preempted: dict[int, FailureReport] = field(default_factory=dict)
    """generation -> the preemption notice supervision reports."""
    allocations: list[AllocationGranted] = field(default_factory=list)
    """What Slurm grants, one per submission or growth; empty: Slurm refuses."""
    allocation_requests: list[SubmitAllocationRequest | GrowAllocationRequest] = field(
        default_factory=list
    )
    preflight_lost: dict[int, set[str]] = field(default_factory=dict)
    """preflight call number (1 is the first launch's) -> nodes it finds lost."""
    preflights: int = 0
    searches: list[FindVerifiedCheckpointRequest] = field(default_factory=list)
    watches: list[WatchCheckpointsRequest] = field(default_factory=list)
    launches: list[LaunchRequest] = field(default_factory=list)
    stops: list[StopRequest] = field(default_factory=list)
    hooks: list[EscalationHookRequest] = field(default_factory=list)
    progress_fields: dict[str, Any] = field(default_factory=dict)
    """Added to every periodic progress report (``seconds_per_step``, ``checkpoint_save_s``)."""
    interval_requests: list[SetCheckpointIntervalRequest] = field(default_factory=list)
    collection_blocks: bool = False
    """Garbage collection runs until cancelled (else it fails at once)."""
    rejoin_refused: bool = False
    """Launches start every rank afresh although survivors were asked for (all gone)."""
    supervisions: list[SuperviseRequest] = field(default_factory=list)
    unreachable_at_end: set[str] = field(default_factory=set)
    """Nodes the end-of-run stop cannot reach."""
    end_of_run_fails: bool = False
    """The end-of-run stop fails (non-retryable), as a worker that cannot stop would."""


SCRIPTS: dict[str, Script] = {}


def script_for(job_id: str) -> Script:
    return SCRIPTS.setdefault(job_id, Script())


async def _wait_until_cancelled() -> None:
    while True:
        activity.heartbeat()
        await asyncio.sleep(0.2)


@activity.defn(name="launch")
async def launch(request: LaunchRequest) -> LaunchResult:
    script = script_for(request.spec.job_id)
    script.launches.append(request)
    node = script.unreachable_at_launch.get(request.generation)
    if node is not None:
        raise ApplicationError(
            f"node {node} unreachable: connection timed out",
            node,
            type="NodeUnreachable",
            non_retryable=True,
        )
    return LaunchResult(
        generation=request.generation,
        master_addr="127.0.0.1",
        master_port=29500,
        run_dir=f"{request.run_root}/gen-{request.generation:05d}",
        ranks=[],
        launched_at=time.time(),
        adopted=False,
        ranks_started_at=time.time(),
        warm_start=script.launch_warm,
        rejoined=[] if script.rejoin_refused else list(request.rejoin_ranks),
        rejoin_refused=(
            [f"rank {r}: its process has exited" for r in request.rejoin_ranks]
            if script.rejoin_refused
            else []
        ),
    )


@activity.defn(name="supervise")
async def supervise(request: SuperviseRequest) -> SuperviseOutcome:
    """Reports what the script says for this generation as soon as it says it (tests
    may script a failure after the generation started), else a periodic progress
    report after ``report_after_s``, as the real supervisor does."""
    script = script_for(request.job_id)
    script.supervisions.append(request)
    deadline = time.monotonic() + request.report_after_s
    phases = script.first_step_phases.get(request.generation)
    if request.report_first_step and phases is not None:
        return SuperviseOutcome(
            kind="first_step",
            generation=request.generation,
            observed_at=time.time(),
            first_step_at=time.time(),
            step=1,
            rank_phases=phases,
        )
    while True:
        now = time.time()
        if request.generation in script.succeed_at:
            return SuperviseOutcome(
                kind="succeeded", generation=request.generation, observed_at=now
            )
        notice = script.preempted.get(request.generation)
        if notice is not None:
            return SuperviseOutcome(
                kind="preempted", generation=request.generation, observed_at=now, failure=notice
            )
        failure = script.failures.get(request.generation)
        if failure is not None:
            return SuperviseOutcome(
                kind="failed", generation=request.generation, observed_at=now, failure=failure
            )
        if time.monotonic() >= deadline:
            return SuperviseOutcome(
                kind="progress",
                generation=request.generation,
                observed_at=now,
                **script.progress_fields,
            )
        activity.heartbeat()
        await asyncio.sleep(0.2)


@activity.defn(name="stop")
async def stop(request: StopRequest) -> StopResult:
    script = script_for(request.job_id)
    script.stops.append(request)
    names = [n.name for n in request.nodes]
    if request.end_of_run and script.end_of_run_fails:
        raise ApplicationError("cannot stop", type="StopFailed", non_retryable=True)
    unreachable = [n for n in names if request.end_of_run and n in script.unreachable_at_end]
    stuck = [g for g in script.unkillable if g.node in names]
    return StopResult(
        generations=[],
        signalled_groups=0,
        killed_groups=0,
        unreachable=unreachable,
        unkillable=stuck,
    )


@activity.defn(name="find_verified_checkpoint")
async def find_verified_checkpoint(request: FindVerifiedCheckpointRequest) -> CheckpointSearch:
    script = script_for(request.job_id or "")
    script.searches.append(request)
    usable = [
        step
        for step in script.checkpoint_steps
        if step not in request.exclude_steps
        and (request.below_step is None or step < request.below_step)
    ]
    if not usable:
        return CheckpointSearch()
    step = max(usable)
    return CheckpointSearch(
        chosen=CheckpointRef(step=step, path=f"{request.checkpoint_dir}/step-{step:08d}"),
        location="local",
    )


@activity.defn(name="preflight")
async def preflight(request: PreflightActivityRequest) -> PreflightReport:
    script = script_for(request.job_id)
    script.preflights += 1
    lost = script.preflight_lost.get(script.preflights, set())
    return PreflightReport(
        nodes=[
            NodeHealth(node=n.name, ok=n.name not in lost, problems=["Slurm: node DOWN"])
            for n in request.nodes
        ]
    )


@activity.defn(name="watch_checkpoints")
async def watch_checkpoints(request: WatchCheckpointsRequest) -> CheckpointRef | None:
    job_id = request.checkpoint_dir.rstrip("/").rsplit("/", 1)[-1]
    script = script_for(job_id)
    script.watches.append(request)
    if script.watch_reports:
        step = script.watch_reports.pop(0)
        path = f"{request.checkpoint_dir}/step-{step:08d}"
        stamp = FileStamp(size=1, mtime_ns=step)
        verified = VerifiedCheckpoint(
            step=step, path=path, files={"state.pt": stamp}, verified_at=time.time()
        )
        return CheckpointRef(step=step, path=path, verified=verified if request.verify else None)
    await _wait_until_cancelled()
    return None


@activity.defn(name="run_escalation_hook")
async def run_escalation_hook(request: EscalationHookRequest) -> EscalationHookResult:
    job_id = request.payload.split('"job_id": "', 1)[1].split('"', 1)[0]
    script = script_for(job_id)
    script.hooks.append(request)
    if script.hook_fails:
        raise ApplicationError("webhook down")
    if script.hook_blocks > 0:
        script.hook_blocks -= 1
        await _wait_until_cancelled()
    return EscalationHookResult(ran=True, exit_code=0)


@activity.defn(name="checkpoint_now")
async def checkpoint_now(request: CheckpointNowRequest) -> CheckpointNowResult:
    return CheckpointNowResult(checkpoint=None, waited_s=0.0)


@activity.defn(name="set_checkpoint_interval")
async def set_checkpoint_interval(
    request: SetCheckpointIntervalRequest,
) -> SetCheckpointIntervalResult:
    script_for(request.job_id).interval_requests.append(request)
    return SetCheckpointIntervalResult(nodes=[n.name for n in request.nodes])


@activity.defn(name="roll_back_checkpoint")
async def roll_back_checkpoint(request: RollbackRequest) -> RollbackResult:
    script = script_for(request.job_id or "")
    retired = [
        CheckpointRef(step=step, path=f"{request.checkpoint_dir}/.rolled-back/step-{step:08d}")
        for step in script.retire_on_rollback
    ]
    # The retired steps stay in ``checkpoint_steps``: their durable copies still exist,
    # and only the workflow's ``exclude_steps`` keeps a search from choosing them.
    return RollbackResult(retired=retired, resume=None)


@activity.defn(name="restore_checkpoint")
async def restore_checkpoint(request: RestoreCheckpointRequest) -> CheckpointRef:
    raise ApplicationError("no durable tier in these tests", non_retryable=True)


@activity.defn(name="upload_checkpoint")
async def upload_checkpoint(request: UploadCheckpointRequest) -> UploadResult:
    raise ApplicationError("no durable tier in these tests", non_retryable=True)


@activity.defn(name="collect_garbage")
async def collect_garbage(request: GarbageCollectionRequest) -> GarbageCollectionResult:
    if script_for(request.job_id).collection_blocks:
        await _wait_until_cancelled()
    raise ApplicationError("no retention in these tests", non_retryable=True)


def _grant(script: Script, request: SubmitAllocationRequest | GrowAllocationRequest) -> Any:
    script.allocation_requests.append(request)
    if not script.allocations:
        raise ApplicationError("Slurm says no: no nodes", type="SubmitRefused", non_retryable=True)
    return script.allocations.pop(0)


@activity.defn(name="submit_allocation")
async def submit_allocation(request: SubmitAllocationRequest) -> AllocationGranted:
    granted: AllocationGranted = _grant(script_for(request.job_name), request)
    return granted


@activity.defn(name="grow_allocation")
async def grow_allocation(request: GrowAllocationRequest) -> AllocationGranted:
    granted: AllocationGranted = _grant(script_for(request.job_name), request)
    return granted


ACTIVITIES: Sequence[Callable[..., Any]] = (
    launch,
    supervise,
    stop,
    find_verified_checkpoint,
    preflight,
    watch_checkpoints,
    run_escalation_hook,
    checkpoint_now,
    set_checkpoint_interval,
    roll_back_checkpoint,
    restore_checkpoint,
    upload_checkpoint,
    collect_garbage,
    submit_allocation,
    grow_allocation,
    fleet_lease,
    fleet_report,
    fleet_release,
    fleet_hand_back,
)
"""The fleet calls are the real ones: they only send updates to a (real) fleet workflow."""
