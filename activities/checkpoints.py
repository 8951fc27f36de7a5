"""Finding the checkpoint to resume from. Only committed checkpoints count: a save
that crashed before its marker was written is invisible here."""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio import activity

from activities.contracts import CheckpointRef, FindCheckpointRequest
from lazarus.checkpoint_layout import committed_steps


def newest_committed(checkpoint_dir: str) -> CheckpointRef | None:
    found = committed_steps(Path(checkpoint_dir))
    if not found:
        return None
    step, path = found[-1]
    return CheckpointRef(step=step, path=str(path))


@activity.defn(name="find_checkpoint")
async def find_checkpoint(request: FindCheckpointRequest) -> CheckpointRef | None:
    return await asyncio.to_thread(newest_committed, request.checkpoint_dir)
