"""Blocking work in a thread while the activity heartbeats from its event loop.

Temporal notices a dead worker by missing heartbeats, so a long ``launch`` or
``stop`` must keep beating for its retry (on any worker) to come within the
heartbeat timeout instead of the whole start-to-close timeout. Checkpoint
transfers, which also carry resumable state and honour cancellation, use
``lazarus.activities.checkpoints._heartbeat`` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TypeVar

from temporalio import activity

T = TypeVar("T")

HEARTBEAT_EVERY_S = 1.0


async def in_thread_heartbeating(work: Callable[[], T], detail: str) -> T:
    """``work()`` in a thread; heartbeat ``detail`` every second until it returns.
    Outside an activity (tests, the CLI) it simply runs the work."""
    task = asyncio.ensure_future(asyncio.to_thread(work))
    while not task.done():
        with contextlib.suppress(RuntimeError):  # not inside an activity
            activity.heartbeat(detail)
        await asyncio.wait({task}, timeout=HEARTBEAT_EVERY_S)
    return task.result()
