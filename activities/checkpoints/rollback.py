"""Rolling back past a checkpoint that may hold a divergence.

A NaN loss is often the end of a slide that began steps earlier, so the newest
checkpoint may already carry the bad weights. Rolling back *moves it aside*
(``.rolled-back/step-N.<n>``) instead of deleting it: nothing is lost for a
person who wants to look, the next ``find`` cannot pick it, and the ranks can
write a fresh checkpoint of the same step without clashing with the old one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio import activity

from activities.contracts import CheckpointRef, RollbackRequest, RollbackResult
from lazarus.checkpoint_layout import committed_steps

RETIRED_DIR = ".rolled-back"


def retire_newest(checkpoint_dir: str) -> RollbackResult:
    root = Path(checkpoint_dir)
    found = committed_steps(root)
    if len(found) < 1:
        return RollbackResult(retired=[], resume=None)
    step, path = found[-1]
    graveyard = root / RETIRED_DIR
    graveyard.mkdir(exist_ok=True)
    index = sum(1 for _ in graveyard.glob(f"{path.name}.*"))
    target = graveyard / f"{path.name}.{index}"
    path.rename(target)
    remaining = found[:-1]
    resume = CheckpointRef(step=remaining[-1][0], path=str(remaining[-1][1])) if remaining else None
    return RollbackResult(retired=[CheckpointRef(step=step, path=str(target))], resume=resume)


@activity.defn(name="roll_back_checkpoint")
async def roll_back_checkpoint(request: RollbackRequest) -> RollbackResult:
    """Not idempotent by itself (each call retires one more), so the workflow runs it
    with no retries; a failed attempt leaves at worst the newest one in place."""
    return await asyncio.to_thread(retire_newest, request.checkpoint_dir)
