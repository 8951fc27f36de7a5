"""Activities that change the Slurm allocation a job runs in: its first (the
workflow's first step in submit mode), a new one when Slurm takes the old away
(``slurm.resubmit``), and a node more when a lost one has no spare (``slurm.grow``);
and giving back a first allocation when the job is cancelled while it waits.

Both wait on Slurm's queue, so both heartbeat with their latest progress line (the
Web UI shows it as the activity's details) and bound the wait by ``slurm.wait_s``.
Both are safe to retry: a retry adopts what an earlier attempt got (see
:mod:`activities.nodes.allocation`). A refusal is non-retryable: Slurm's
answer will not change by asking again at once, and the workflow has a fallback.
Its error type stays the refusal's own class name (``SubmitRefused``,
``GrowRefused``), which the workflow's history records.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import in_thread_heartbeating
from activities.nodes import allocation
from activities.nodes.agent import AllocationRefused
from lazarus.domain.activity_refs import CANCEL_ALLOCATION, GROW_ALLOCATION, SUBMIT_ALLOCATION
from lazarus.domain.contracts import (
    AllocationGranted,
    AllocationsCancelled,
    GrowAllocationRequest,
    SubmitAllocationRequest,
)


class _Progress:
    """The latest progress line, for the heartbeat's details."""

    def __init__(self) -> None:
        self.line = "asking Slurm"

    def __call__(self, line: str) -> None:
        self.line = line


async def _waiting(
    work: Callable[[_Progress], AllocationGranted], cancel: threading.Event | None = None
) -> AllocationGranted:
    progress = _Progress()
    try:
        return await in_thread_heartbeating(
            lambda: work(progress), lambda: progress.line, cancel=cancel
        )
    except (AllocationRefused, TimeoutError) as exc:
        raise ApplicationError(str(exc), type=type(exc).__name__, non_retryable=True) from exc


@activity.defn(name=SUBMIT_ALLOCATION.name)
async def submit_allocation(request: SubmitAllocationRequest) -> AllocationGranted:
    """Submit the job's first allocation, or release the ending one and submit its
    successor, and wait for it to run. Cancelled while it waits, it gives back what
    it submitted before it ends."""
    cancel = threading.Event()
    return await _waiting(lambda progress: allocation.submit(request, progress, cancel), cancel)


@activity.defn(name=CANCEL_ALLOCATION.name)
async def cancel_allocation(request: SubmitAllocationRequest) -> AllocationsCancelled:
    """Give back what ``request`` submitted (this user's jobs named as its holder)."""
    cancelled = await in_thread_heartbeating(lambda: allocation.cancel_submitted(request))
    return AllocationsCancelled(job_ids=cancelled)


@activity.defn(name=GROW_ALLOCATION.name)
async def grow_allocation(request: GrowAllocationRequest) -> AllocationGranted:
    """Add nodes to the running allocation (Slurm job expansion)."""
    return await _waiting(lambda progress: allocation.grow(request, progress))
