"""Blocking work in a thread while the activity heartbeats from its event loop: the
one way every activity does it (launch, stop, supervise's polls, checkpoint search,
transfers and garbage collection).

Temporal notices a dead worker by missing heartbeats, and ``activity.heartbeat``
must be called from the activity's event loop, so the blocking work runs in a
thread and the loop beats meanwhile. That is what lets a retry (on any worker)
come within the heartbeat timeout instead of the whole start-to-close timeout.
Work that carries resumable state publishes it through ``details``, which the
loop sends with every beat, and once more when the work fails so that the retry
starts from the freshest state.

Polling loops that do a short blocking call per tick (``watch_checkpoints``,
``checkpoint_now``) beat between ticks themselves: they are not this shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

from temporalio import activity

T = TypeVar("T")

MAX_HEARTBEAT_INTERVAL_S = 1.0
"""Beat at least this often; more often when the heartbeat timeout is short."""
MIN_HEARTBEAT_INTERVAL_S = 0.1


def _no_details() -> object | None:
    return None


def heartbeat_interval() -> float:
    """A third of the activity's heartbeat timeout, so two beats may be late before
    Temporal gives up on this worker; ``MAX_HEARTBEAT_INTERVAL_S`` without one, or
    outside an activity."""
    try:
        timeout = activity.info().heartbeat_timeout
    except RuntimeError:  # not inside an activity (tests, the CLI)
        return MAX_HEARTBEAT_INTERVAL_S
    if timeout is None:
        return MAX_HEARTBEAT_INTERVAL_S
    return max(MIN_HEARTBEAT_INTERVAL_S, min(MAX_HEARTBEAT_INTERVAL_S, timeout.total_seconds() / 3))


def _beat(details: Callable[[], object | None]) -> None:
    snapshot = details()
    with contextlib.suppress(RuntimeError):  # not inside an activity: nobody to tell
        if snapshot is None:
            activity.heartbeat()
        else:
            activity.heartbeat(snapshot)


async def in_thread_heartbeating(
    work: Callable[[], T],
    details: Callable[[], object | None] = _no_details,
    *,
    cancel: threading.Event | None = None,
) -> T:
    """``work()`` in a thread; heartbeat ``details()`` every :func:`heartbeat_interval`
    until it returns, and once more if it raises (``None`` beats without details).

    Cancellation: with a ``cancel`` event (that ``work`` watches), a cancelled
    activity sets it and waits for the thread before re-raising, so nothing (an
    upload, a download) keeps running behind it. Without one the cancellation
    propagates at once and the thread runs to its end on its own (a thread cannot
    be interrupted).

    Outside an activity (tests, the CLI) it simply runs the work.
    """
    task = asyncio.ensure_future(asyncio.to_thread(work))
    interval = heartbeat_interval()
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=interval)
            if done:
                if task.exception() is not None:
                    _beat(details)
                return task.result()
            _beat(details)
    except asyncio.CancelledError:
        if cancel is not None:
            cancel.set()
            with contextlib.suppress(BaseException):
                await task
        raise
