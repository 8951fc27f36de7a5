"""Fake activities for testing the job workflow's decisions against a real server.

Each fake is named as the real activity and registered under its name by
:func:`~activities.stand_ins.stand_ins`, so the real ``JobWorkflow`` runs
unchanged; a :class:`Script` per job says what the "cluster" does (a launch that
meets an unreachable node, a stop that cannot kill, a failure at some generation) and
records what the workflow asked for. No ranks, no files: these tests are about policy.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.fleet import (  # noqa: F401 - they stand in for themselves
    fleet_hand_back,
    fleet_lease,
    fleet_release,
    fleet_report,
)
from activities.stand_ins import launched_without_ranks, stand_ins
from lazarus.domain import contracts
from lazarus.domain.process_groups import UnkillableGroup
from tests.workflow.fake_checkpoints import holdings_for


@dataclass
class Script:
    """What the fake cluster does for one job, and what the workflow asked of it."""

    unreachable_at_launch: dict[int, str] = field(default_factory=dict)
    """generation -> node the launch cannot reach."""
    failures: dict[int, contracts.FailureReport] = field(default_factory=dict)
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
    launch_warm: contracts.WarmStartOutcome | None = None
    """What every launch reports about warm starts (None: warm starts off)."""
    preempted: dict[int, contracts.FailureReport] = field(default_factory=dict)
    """generation -> the preemption notice supervision reports."""
    allocations: list[contracts.AllocationGranted] = field(default_factory=list)
    """What Slurm grants, one per submission or growth; empty: Slurm refuses."""
    allocation_requests: list[
        contracts.SubmitAllocationRequest | contracts.GrowAllocationRequest
    ] = field(default_factory=list)
    submit_waits: bool = False
    """A submission waits in Slurm's queue until the activity is cancelled."""
    given_back: list[contracts.SubmitAllocationRequest] = field(default_factory=list)
    """What ``cancel_allocation`` was asked to give back."""
    preflight_lost: dict[int, set[str]] = field(default_factory=dict)
    """preflight call number (1 is the first launch's) -> nodes it finds lost."""
    preflights: int = 0
    preflight_awaits_search_s: float | None = None
    """Each preflight waits up to this long for its launch's search to have started
    (as many searches as preflights; a test that moves no node), and records in
    ``preflight_saw_search`` whether it did: were they run one after the other, the
    search would wait for the preflight's end (the preflight beside the search)."""
    preflight_saw_search: list[bool] = field(default_factory=list)
    program_missing: set[str] = field(default_factory=set)
    """Nodes whose every preflight finds the command's program missing."""
    searches: list[contracts.FindVerifiedCheckpointRequest] = field(default_factory=list)
    watches: list[contracts.WatchCheckpointsRequest] = field(default_factory=list)
    launches: list[contracts.LaunchRequest] = field(default_factory=list)
    stops: list[contracts.StopRequest] = field(default_factory=list)
    hooks: list[contracts.EscalationHookRequest] = field(default_factory=list)
    progress_fields: dict[str, Any] = field(default_factory=dict)
    """Added to every periodic progress report (``seconds_per_step``, ``checkpoint_save_s``)."""
    interval_requests: list[contracts.SetCheckpointIntervalRequest] = field(default_factory=list)
    collection_blocks: bool = False
    """Garbage collection runs until cancelled (else it fails at once)."""
    rejoin_refused: bool = False
    """Launches start every rank afresh although survivors were asked for (all gone)."""
    unkillable_at_carry: dict[int, list[UnkillableGroup]] = field(default_factory=dict)
    """generation -> groups a carrying launch's fencing could not kill: the launch
    refuses (``RanksWouldNotDie``) and starts nothing."""
    supervisions: list[contracts.SuperviseRequest] = field(default_factory=list)
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


async def launch(request: contracts.LaunchRequest) -> contracts.LaunchResult:
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
    stuck = script.unkillable_at_carry.get(request.generation)
    if stuck and request.rejoin_ranks:
        raise ApplicationError(
            f"ranks would not die after SIGKILL: {stuck[0].reason}; no rank was started",
            *(g.node for g in stuck),
            type="RanksWouldNotDie",
            non_retryable=True,
        )
    return launched_without_ranks(
        request,
        time.time(),
        "127.0.0.1",
        warm_start=script.launch_warm,
        rejoined=[] if script.rejoin_refused else list(request.rejoin_ranks),
        rejoin_refused=(
            [f"rank {r}: its process has exited" for r in request.rejoin_ranks]
            if script.rejoin_refused
            else []
        ),
    )


async def supervise(request: contracts.SuperviseRequest) -> contracts.SuperviseOutcome:
    """Reports what the script says for this generation as soon as it says it (tests
    may script a failure after the generation started), else a periodic progress
    report after ``report_after_s``, as the real supervisor does."""
    script = script_for(request.job_id)
    script.supervisions.append(request)
    deadline = time.monotonic() + request.report_after_s
    phases = script.first_step_phases.get(request.generation)
    if request.report_first_step and phases is not None:
        return contracts.SuperviseOutcome(
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
            return contracts.SuperviseOutcome(
                kind="succeeded", generation=request.generation, observed_at=now
            )
        notice = script.preempted.get(request.generation)
        if notice is not None:
            return contracts.SuperviseOutcome(
                kind="preempted", generation=request.generation, observed_at=now, failure=notice
            )
        failure = script.failures.get(request.generation)
        if failure is not None:
            return contracts.SuperviseOutcome(
                kind="failed", generation=request.generation, observed_at=now, failure=failure
            )
        if time.monotonic() >= deadline:
            return contracts.SuperviseOutcome(
                kind="progress",
                generation=request.generation,
                observed_at=now,
                **script.progress_fields,
            )
        activity.heartbeat()
        await asyncio.sleep(0.2)


async def stop(request: contracts.StopRequest) -> contracts.StopResult:
    script = script_for(request.job_id)
    script.stops.append(request)
    names = [n.name for n in request.access.nodes]
    if request.end_of_run and script.end_of_run_fails:
        raise ApplicationError("cannot stop", type="StopFailed", non_retryable=True)
    unreachable = [n for n in names if request.end_of_run and n in script.unreachable_at_end]
    stuck = [g for g in script.unkillable if g.node in names]
    return contracts.StopResult(
        generations=[],
        signalled_groups=0,
        killed_groups=0,
        unreachable=unreachable,
        unkillable=stuck,
    )


async def find_verified_checkpoint(
    request: contracts.FindVerifiedCheckpointRequest,
) -> contracts.CheckpointSearch:
    script = script_for(request.job_id or "")
    script.searches.append(request)
    holdings = holdings_for(request.job_id or "")
    return holdings.search(request, script.checkpoint_steps, _launched(script))


def _launched(script: Script) -> set[int]:
    return {launch.generation for launch in script.launches}


async def preflight(request: contracts.PreflightActivityRequest) -> contracts.PreflightReport:
    script = script_for(request.job_id)
    script.preflights += 1
    lost = script.preflight_lost.get(script.preflights, set())
    if script.preflight_awaits_search_s is not None:
        deadline = time.monotonic() + script.preflight_awaits_search_s
        while len(script.searches) < script.preflights and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        script.preflight_saw_search.append(len(script.searches) >= script.preflights)
    return contracts.PreflightReport(
        nodes=[
            _health(n.name, lost, script.program_missing, request.interpreter)
            for n in request.access.nodes
        ]
    )


def _health(node: str, lost: set[str], missing: set[str], program: str) -> contracts.NodeHealth:
    if node in missing:
        return contracts.NodeHealth(
            node=node,
            ok=False,
            problems=[f"command: {program!r} not found on node {node}; install it or fix PATH"],
            program_missing=True,
        )
    return contracts.NodeHealth(node=node, ok=node not in lost, problems=["Slurm: node DOWN"])


async def watch_checkpoints(
    request: contracts.WatchCheckpointsRequest,
) -> contracts.CheckpointRef | None:
    job_id = request.checkpoint_dir.rstrip("/").rsplit("/", 1)[-1]
    script = script_for(job_id)
    script.watches.append(request)
    if script.watch_reports:
        step = script.watch_reports.pop(0)
        path = f"{request.checkpoint_dir}/step-{step:08d}"
        stamp = contracts.FileStamp(size=1, mtime_ns=step)
        verified = contracts.VerifiedCheckpoint(
            step=step, path=path, files={"state.pt": stamp}, verified_at=time.time()
        )
        return contracts.CheckpointRef(
            step=step, path=path, verified=verified if request.verify else None
        )
    await _wait_until_cancelled()
    return None


async def run_escalation_hook(
    request: contracts.EscalationHookRequest,
) -> contracts.EscalationHookResult:
    job_id = request.payload.split('"job_id": "', 1)[1].split('"', 1)[0]
    script = script_for(job_id)
    script.hooks.append(request)
    if script.hook_fails:
        raise ApplicationError("webhook down")
    if script.hook_blocks > 0:
        script.hook_blocks -= 1
        await _wait_until_cancelled()
    return contracts.EscalationHookResult(ran=True, exit_code=0)


async def checkpoint_now(request: contracts.CheckpointNowRequest) -> contracts.CheckpointNowResult:
    return contracts.CheckpointNowResult(checkpoint=None, waited_s=0.0)


async def set_checkpoint_interval(
    request: contracts.SetCheckpointIntervalRequest,
) -> contracts.SetCheckpointIntervalResult:
    script_for(request.job_id).interval_requests.append(request)
    return contracts.SetCheckpointIntervalResult(nodes=[n.name for n in request.access.nodes])


async def roll_back_checkpoint(request: contracts.RollbackRequest) -> contracts.RollbackResult:
    script = script_for(request.job_id or "")
    holdings = holdings_for(request.job_id or "")
    retired = [
        contracts.CheckpointRef(
            step=step,
            path=f"{request.checkpoint_dir}/.rolled-back/step-{step:08d}",
            generation=holdings.writer(step, script.checkpoint_steps, _launched(script)),
        )
        for step in script.retire_on_rollback
    ]
    # The retired steps stay in ``checkpoint_steps``: their durable copies still exist,
    # and only the workflow (its bound, cuts and retired checkpoints) keeps a search
    # from choosing them.
    return contracts.RollbackResult(retired=retired, resume=None)


async def restore_checkpoint(
    request: contracts.RestoreCheckpointRequest,
) -> contracts.CheckpointRef:
    raise ApplicationError("no durable tier in these tests", non_retryable=True)


async def upload_checkpoint(request: contracts.UploadCheckpointRequest) -> contracts.UploadResult:
    raise ApplicationError("no durable tier in these tests", non_retryable=True)


async def collect_garbage(
    request: contracts.GarbageCollectionRequest,
) -> contracts.GarbageCollectionResult:
    if script_for(request.job_id).collection_blocks:
        await _wait_until_cancelled()
    raise ApplicationError("no retention in these tests", non_retryable=True)


def _grant(
    script: Script, request: contracts.SubmitAllocationRequest | contracts.GrowAllocationRequest
) -> Any:
    script.allocation_requests.append(request)
    if not script.allocations:
        raise ApplicationError("Slurm says no: no nodes", type="SubmitRefused", non_retryable=True)
    return script.allocations.pop(0)


async def submit_allocation(
    request: contracts.SubmitAllocationRequest,
) -> contracts.AllocationGranted:
    script = script_for(request.job_name)
    if script.submit_waits:
        script.allocation_requests.append(request)
        await _wait_until_cancelled()
    granted: contracts.AllocationGranted = _grant(script, request)
    return granted


async def cancel_allocation(
    request: contracts.SubmitAllocationRequest,
) -> contracts.AllocationsCancelled:
    script_for(request.job_name).given_back.append(request)
    return contracts.AllocationsCancelled(job_ids=[4242])


async def grow_allocation(request: contracts.GrowAllocationRequest) -> contracts.AllocationGranted:
    granted: contracts.AllocationGranted = _grant(script_for(request.job_name), request)
    return granted


ACTIVITIES: Sequence[Callable[..., Any]] = stand_ins(sys.modules[__name__])
"""Every activity the workflow calls: this module's function of each reference's name.
The fleet calls are the real ones, imported above: they only send updates to a (real)
fleet workflow."""
