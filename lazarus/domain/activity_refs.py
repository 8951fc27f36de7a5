"""Every activity as the workflow calls it: a registered name and a typed contract.

The workflow floor must not import the activities' floor (it would pull SSH, S3
and process code into the workflow sandbox, and make policy depend on
mechanics). So the workflow calls activities by these references, and each
implementation registers under the same name (``@activity.defn(name=REF.name)``).
A unit test checks that every reference has exactly one implementation whose
request and result types match, so a rename on either side fails in CI, not in a
week-old history.

The names are the functions' original names: recorded histories schedule them,
and they must keep replaying.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from lazarus.domain.contracts import (
    AllocationGranted,
    AllocationsCancelled,
    CheckpointNowRequest,
    CheckpointNowResult,
    CheckpointRef,
    CheckpointSearch,
    EscalationHookRequest,
    EscalationHookResult,
    FindVerifiedCheckpointRequest,
    GarbageCollectionRequest,
    GarbageCollectionResult,
    GrowAllocationRequest,
    LaunchRequest,
    LaunchResult,
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
    WatchCheckpointsRequest,
)
from lazarus.domain.fleet import (
    FleetHandBackCall,
    FleetLeaseCall,
    FleetReleaseCall,
    FleetReply,
    FleetReportCall,
    FleetReportReply,
    HandBackReply,
    Lease,
)
from lazarus.domain.worker_calls import (
    ListCheckpointsRequest,
    ListCheckpointsResult,
    RanksEndedRequest,
    RanksEndedResult,
    ReadLogRequest,
    ReadLogResult,
    StartCheckRequest,
    StartCheckResult,
    VerifyCheckpointsRequest,
    VerifyCheckpointsResult,
)

RequestT = TypeVar("RequestT")
ResultT = TypeVar("ResultT")


@dataclass(frozen=True)
class ActivityRef(Generic[RequestT, ResultT]):
    """One activity's name, request type and result type (the result may be a union)."""

    name: str
    request_type: type[RequestT]
    result_type: Any
    """The result's type hint, handed to the data converter (``CheckpointRef | None``
    is a hint, not a class, hence ``Any``)."""


LAUNCH = ActivityRef[LaunchRequest, LaunchResult]("launch", LaunchRequest, LaunchResult)
SUPERVISE = ActivityRef[SuperviseRequest, SuperviseOutcome](
    "supervise", SuperviseRequest, SuperviseOutcome
)
STOP = ActivityRef[StopRequest, StopResult]("stop", StopRequest, StopResult)
PREFLIGHT = ActivityRef[PreflightActivityRequest, PreflightReport](
    "preflight", PreflightActivityRequest, PreflightReport
)
FIND_VERIFIED_CHECKPOINT = ActivityRef[FindVerifiedCheckpointRequest, CheckpointSearch](
    "find_verified_checkpoint", FindVerifiedCheckpointRequest, CheckpointSearch
)
RESTORE_CHECKPOINT = ActivityRef[RestoreCheckpointRequest, CheckpointRef](
    "restore_checkpoint", RestoreCheckpointRequest, CheckpointRef
)
WATCH_CHECKPOINTS = ActivityRef[WatchCheckpointsRequest, CheckpointRef | None](
    "watch_checkpoints", WatchCheckpointsRequest, CheckpointRef | None
)
UPLOAD_CHECKPOINT = ActivityRef[UploadCheckpointRequest, UploadResult](
    "upload_checkpoint", UploadCheckpointRequest, UploadResult
)
COLLECT_GARBAGE = ActivityRef[GarbageCollectionRequest, GarbageCollectionResult](
    "collect_garbage", GarbageCollectionRequest, GarbageCollectionResult
)
CHECKPOINT_NOW = ActivityRef[CheckpointNowRequest, CheckpointNowResult](
    "checkpoint_now", CheckpointNowRequest, CheckpointNowResult
)
ROLL_BACK_CHECKPOINT = ActivityRef[RollbackRequest, RollbackResult](
    "roll_back_checkpoint", RollbackRequest, RollbackResult
)
RUN_ESCALATION_HOOK = ActivityRef[EscalationHookRequest, EscalationHookResult](
    "run_escalation_hook", EscalationHookRequest, EscalationHookResult
)
SUBMIT_ALLOCATION = ActivityRef[SubmitAllocationRequest, AllocationGranted](
    "submit_allocation", SubmitAllocationRequest, AllocationGranted
)
CANCEL_ALLOCATION = ActivityRef[SubmitAllocationRequest, AllocationsCancelled](
    "cancel_allocation", SubmitAllocationRequest, AllocationsCancelled
)
"""Gives back what a ``SUBMIT_ALLOCATION`` request submitted (a job cancelled while it
waited for its first allocation)."""
GROW_ALLOCATION = ActivityRef[GrowAllocationRequest, AllocationGranted](
    "grow_allocation", GrowAllocationRequest, AllocationGranted
)
SET_CHECKPOINT_INTERVAL = ActivityRef[SetCheckpointIntervalRequest, SetCheckpointIntervalResult](
    "set_checkpoint_interval", SetCheckpointIntervalRequest, SetCheckpointIntervalResult
)
FLEET_LEASE = ActivityRef[FleetLeaseCall, Lease]("fleet_lease", FleetLeaseCall, Lease)
FLEET_REPORT = ActivityRef[FleetReportCall, FleetReportReply](
    "fleet_report", FleetReportCall, FleetReportReply
)
FLEET_RELEASE = ActivityRef[FleetReleaseCall, FleetReply](
    "fleet_release", FleetReleaseCall, FleetReply
)
FLEET_HAND_BACK = ActivityRef[FleetHandBackCall, HandBackReply](
    "fleet_hand_back", FleetHandBackCall, HandBackReply
)
"""A job's calls into its fleet (``activities.fleet``); the fleet's own
probation checks reuse ``PREFLIGHT``."""
FLEET_CALLS: tuple[ActivityRef[Any, Any], ...] = (
    FLEET_LEASE,
    FLEET_REPORT,
    FLEET_RELEASE,
    FLEET_HAND_BACK,
)

ALL: tuple[ActivityRef[Any, Any], ...] = (
    LAUNCH,
    SUPERVISE,
    STOP,
    PREFLIGHT,
    FIND_VERIFIED_CHECKPOINT,
    RESTORE_CHECKPOINT,
    WATCH_CHECKPOINTS,
    UPLOAD_CHECKPOINT,
    COLLECT_GARBAGE,
    CHECKPOINT_NOW,
    ROLL_BACK_CHECKPOINT,
    RUN_ESCALATION_HOOK,
    SUBMIT_ALLOCATION,
    CANCEL_ALLOCATION,
    GROW_ALLOCATION,
    SET_CHECKPOINT_INTERVAL,
    *FLEET_CALLS,
)
"""What the controller worker must register for the job workflow, each exactly once."""

START_CHECKS = ActivityRef[StartCheckRequest, StartCheckResult](
    "start_checks", StartCheckRequest, StartCheckResult
)
LIST_CHECKPOINTS = ActivityRef[ListCheckpointsRequest, ListCheckpointsResult](
    "list_checkpoints", ListCheckpointsRequest, ListCheckpointsResult
)
VERIFY_CHECKPOINTS = ActivityRef[VerifyCheckpointsRequest, VerifyCheckpointsResult](
    "verify_checkpoints", VerifyCheckpointsRequest, VerifyCheckpointsResult
)

READ_LOG = ActivityRef[ReadLogRequest, ReadLogResult]("read_log", ReadLogRequest, ReadLogResult)
RANKS_ENDED = ActivityRef[RanksEndedRequest, RanksEndedResult](
    "ranks_ended", RanksEndedRequest, RanksEndedResult
)

WORKER_CALLS: tuple[ActivityRef[Any, Any], ...] = (
    START_CHECKS,
    LIST_CHECKPOINTS,
    VERIFY_CHECKPOINTS,
    READ_LOG,
    RANKS_ENDED,
)
"""What a client asks a worker for (:mod:`lazarus.domain.worker_calls`), each through the
call workflow (``workflows/worker_call.py``), never the job workflow: the job's fakes and
the simulator's stand-ins need not have them."""
