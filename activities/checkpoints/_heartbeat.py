"""Running blocking checkpoint work in a thread while the activity heartbeats, and
mapping its failures onto retryable or final activity errors.

Temporal's heartbeat must be called from the activity's event loop, so the work
runs in a thread and publishes its resumable state through a snapshot function
that the loop sends as heartbeat details every couple of seconds (and once more
when the work fails, so a retry starts from the freshest state)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from lazarus.activities.checkpoints.storage import (
    CheckpointCorrupt,
    CheckpointInputError,
    store_errors,
)

T = TypeVar("T")

MAX_HEARTBEAT_INTERVAL_S = 2.0


def _interval() -> float:
    timeout = activity.info().heartbeat_timeout
    if timeout is None:
        return MAX_HEARTBEAT_INTERVAL_S
    return max(0.1, min(MAX_HEARTBEAT_INTERVAL_S, timeout.total_seconds() / 3))


async def run_with_heartbeats(
    work: Callable[[threading.Event], T], details: Callable[[], object | None]
) -> T:
    """Run ``work(cancel_event)`` in a thread; heartbeat ``details()`` meanwhile.
    On cancellation the event is set and the thread is awaited before re-raising,
    so no upload keeps running behind a cancelled activity."""
    cancel = threading.Event()
    task = asyncio.ensure_future(asyncio.to_thread(work, cancel))
    interval = _interval()

    def beat() -> None:
        snapshot = details()
        if snapshot is None:
            activity.heartbeat()
        else:
            activity.heartbeat(snapshot)

    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=interval)
            if done:
                if task.exception() is not None:
                    beat()
                return task.result()
            beat()
    except asyncio.CancelledError:
        cancel.set()
        with contextlib.suppress(BaseException):
            await task
        raise


@contextlib.contextmanager
def as_activity_errors(unavailable: str) -> Iterator[None]:
    """Map checkpoint failures onto what Temporal should do with them: a corrupt
    checkpoint or a bad request fails for good; a store that cannot be reached
    (``unavailable`` says which) is retried."""
    try:
        yield
    except CheckpointCorrupt as exc:
        raise ApplicationError(
            str(exc), exc.problems, type="CheckpointCorrupt", non_retryable=True
        ) from exc
    except CheckpointInputError as exc:
        raise ApplicationError(str(exc), type="CheckpointInputError", non_retryable=True) from exc
    except store_errors() as exc:
        raise ApplicationError(f"{unavailable}: {exc}", type="DurableStoreUnavailable") from exc
