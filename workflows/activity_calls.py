"""Calling an activity from the workflow through its typed reference.

One place turns an :class:`~lazarus.domain.activity_refs.ActivityRef` into
Temporal's by-name call with the right result type, so the workflow reads as
``await execute(LAUNCH, request, ...)`` and mypy checks the request and result.
The command recorded in history is the same as calling the function itself: a
``ScheduleActivityTask`` with the activity's name.
"""

from __future__ import annotations

from typing import Any, TypeVar

from temporalio import workflow

from lazarus.domain.activity_refs import ActivityRef

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
