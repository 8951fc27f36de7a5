"""A job's calls into its fleet: Temporal updates sent with the worker's own client.

Workflows cannot call updates on other workflows, and signals cannot answer; an
activity can, and its result is recorded in the job's history like any other, so a
replay never asks the fleet again. Each update is idempotent on the fleet's side (a
run's second lease returns the first, a report's key is counted once, a replacement
for the same lost node is the same node), so Temporal may retry these freely.

Errors: ``FleetRefused`` (non-retryable) when the fleet's validator rejects the
request, with its reason; ``FleetUnreachable`` (retryable) when the fleet workflow is
not running or does not answer.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from lazarus.domain.api import (
    FLEET_UPDATE_HAND_BACK,
    FLEET_UPDATE_LEASE,
    FLEET_UPDATE_RELEASE,
    FLEET_UPDATE_REPLACE,
    FLEET_UPDATE_REPORT_QUARANTINE,
    fleet_workflow_id,
)
from lazarus.domain.fleet import (
    FLEET_REFUSED,
    FLEET_UNREACHABLE,
    FleetHandBackCall,
    FleetLeaseCall,
    FleetReleaseCall,
    FleetReply,
    FleetReportCall,
    FleetReportReply,
    HandBackReply,
    Lease,
    ReplaceRequest,
)
from lazarus.domain.spec import NodeSpec


async def _update(fleet: str, update: str, request: Any, result_type: Any) -> Any:
    handle = activity.client().get_workflow_handle(fleet_workflow_id(fleet))
    try:
        return await handle.execute_update(update, request, result_type=result_type)
    except WorkflowUpdateFailedError as exc:
        cause: BaseException = exc.cause
        while cause.__cause__ is not None:
            cause = cause.__cause__
        raise ApplicationError(
            f"fleet {fleet} refused {update}: {cause}", type=FLEET_REFUSED, non_retryable=True
        ) from None
    except RPCError as exc:
        raise ApplicationError(
            f"fleet {fleet} unreachable ({update}): {exc.message}", type=FLEET_UNREACHABLE
        ) from None


@activity.defn(name="fleet_lease")
async def fleet_lease(call: FleetLeaseCall) -> Lease:
    lease: Lease = await _update(call.fleet, FLEET_UPDATE_LEASE, call.request, Lease)
    return lease


@activity.defn(name="fleet_report")
async def fleet_report(call: FleetReportCall) -> FleetReportReply:
    note = ""
    if call.report is not None:
        note = await _update(call.fleet, FLEET_UPDATE_REPORT_QUARANTINE, call.report, str)
    if call.replace is None:
        return FleetReportReply(note=note)
    replacement: NodeSpec | None = await _update(
        call.fleet,
        FLEET_UPDATE_REPLACE,
        ReplaceRequest(job=call.job, lost=call.replace, key=call.replace_key),
        NodeSpec | None,
    )
    return FleetReportReply(note=note, replacement=replacement)


@activity.defn(name="fleet_release")
async def fleet_release(call: FleetReleaseCall) -> FleetReply:
    note: str = await _update(call.fleet, FLEET_UPDATE_RELEASE, call.request, str)
    return FleetReply(note=note)


@activity.defn(name="fleet_hand_back")
async def fleet_hand_back(call: FleetHandBackCall) -> HandBackReply:
    reply: HandBackReply = await _update(
        call.fleet, FLEET_UPDATE_HAND_BACK, call.request, HandBackReply
    )
    return reply
