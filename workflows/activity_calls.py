"""Calling an activity from the workflow through its typed reference.

One place turns an :class:`~lazarus.domain.activity_refs.ActivityRef` into
Temporal's by-name call with the right result type, so the workflow reads as
``await execute(LAUNCH, request, ...)`` and mypy checks the request and result.
The command recorded in history is the same as calling the function itself: a
``ScheduleActivityTask`` with the activity's name.

The retry policies and timeouts the workflow calls activities with live here too, so
the state machine (``job``) and the housekeeping loop (``housekeeping``) share them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy

from lazarus.domain.activity_refs import ActivityRef
from lazarus.domain.spec import JobSpec

QUICK_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=5)
)
END_OF_RUN_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=5), maximum_attempts=5
)
"""The end-of-run cleanup: a few tries, then the run ends anyway (what is left is
noted). An idle zygote wastes memory, not correctness; a run that never ends is worse."""
LAUNCH_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=5,
    non_retryable_error_types=["LaunchRefused"],
)
HOOK_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=60)
)
"""Unlimited attempts: an escalation must reach a person even if their webhook is down."""
NO_RETRY = RetryPolicy(maximum_attempts=1)
UPLOAD_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    non_retryable_error_types=["CheckpointCorrupt", "CheckpointInputError", "NoDurableStore"],
)
"""Store outages are waited out (training never waits for an upload); a corrupt local
copy or a bad configuration is not."""


def worker_loss_timeout(spec: JobSpec) -> timedelta:
    """How long a silent long-running activity may go before Temporal retries it
    elsewhere: the same bound for uploads as for supervision."""
    return timedelta(seconds=spec.health.supervisor_heartbeat_timeout_s)


def cause(err: BaseException) -> str:
    """The innermost message of an activity failure: what actually went wrong."""
    while err.__cause__ is not None:
        err = err.__cause__
    return str(err)


RequestT = TypeVar("RequestT")
ResultT = TypeVar("ResultT")


async def execute(
    ref: ActivityRef[RequestT, ResultT], request: RequestT, **options: Any
) -> ResultT:
    """Run the activity and return its typed result (options as ``execute_activity``)."""
    result: ResultT = await workflow.execute_activity(
        ref.name, request, result_type=ref.result_type, **options
    )
    return result


def start(
    ref: ActivityRef[RequestT, ResultT], request: RequestT, **options: Any
) -> workflow.ActivityHandle[ResultT]:
    """Start the activity and return its handle (options as ``start_activity``)."""
    handle: workflow.ActivityHandle[ResultT] = workflow.start_activity(
        ref.name, request, result_type=ref.result_type, **options
    )
    return handle
