"""Noticing new checkpoints, so the workflow can tier, collect and trust them.

The workflow cannot see the checkpoint directory, and polling it with one short
activity per look would fill history with nothing. This activity long-polls
instead: it returns once a committed checkpoint newer than the newest handled one
exists *and* ``min_interval_s`` has passed since the last report, so a job that
checkpoints every few seconds still costs one report per interval (the newest
checkpoint then; older ones in between are superseded).

The checkpoint it reports is verified in full here, off the recovery path
(:mod:`.verified_once`): its file stamps come back in ``CheckpointRef.verified``,
and a relaunch then re-checks only sizes and mtimes instead of hashing it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from functools import partial
from pathlib import Path

from temporalio import activity

from activities.checkpoints.verified_once import verify_once
from activities.heartbeat import in_thread_heartbeating
from activities.observe import observe
from lazarus.domain.checkpoint_layout import committed_steps
from lazarus.domain.contracts import CheckpointRef, WatchCheckpointsRequest

POLL_S = 0.5


def newest_newer_than(checkpoint_dir: str, step: int | None) -> CheckpointRef | None:
    found = committed_steps(Path(checkpoint_dir))
    if not found or (step is not None and found[-1][0] <= step):
        return None
    newest, path = found[-1]
    return CheckpointRef(step=newest, path=str(path))


def with_verification(found: CheckpointRef) -> CheckpointRef:
    """``found`` with its stamps when it verifies in full; as it is otherwise (a
    corrupt or vanished checkpoint is still reported: tiering and retention decide
    about it, and the recovery's own search skips it)."""
    try:
        verified = verify_once(Path(found.path), found.step)
    except OSError:  # unreadable now (permissions, a directory being deleted)
        return found
    return found if verified is None else found.model_copy(update={"verified": verified})


@activity.defn(name="watch_checkpoints")
async def watch_checkpoints(request: WatchCheckpointsRequest) -> CheckpointRef | None:
    """The newest committed checkpoint newer than ``newer_than_step``, verified in
    full when ``request.verify``; None after ``max_wait_s`` without one (the caller
    simply asks again)."""
    started = time.monotonic()
    while True:
        elapsed = time.monotonic() - started
        if elapsed >= request.min_interval_s:
            found = await asyncio.to_thread(
                newest_newer_than, request.checkpoint_dir, request.newer_than_step
            )
            if found is not None:
                if not request.verify:
                    return found
                verify_started = time.monotonic()
                checked = await in_thread_heartbeating(partial(with_verification, found))
                if checked.verified is not None:
                    hashed = sum(stamp.size for stamp in checked.verified.files.values())
                    seconds = time.monotonic() - verify_started
                    observe("checkpoint_verify", seconds, size_bytes=hashed)
                return checked
        if elapsed >= request.max_wait_s:
            return None
        with contextlib.suppress(RuntimeError):  # outside an activity (tests)
            activity.heartbeat()
        await asyncio.sleep(POLL_S)
