"""Rolling back past a checkpoint that may hold a divergence.

A NaN loss is often the end of a slide that began steps earlier, so the newest
checkpoint may already carry the bad weights. Rolling back *moves it aside*
(``.rolled-back/step-N.<n>``) instead of deleting it: nothing is lost for a
person who wants to look, the next ``find`` cannot pick it, and the ranks can
write a fresh checkpoint of the same step without clashing with the old one. The
retired checkpoint is reported with the generation that wrote it: the workflow
keeps every copy of that state out (its durable upload too) and lets the fresh
checkpoint of the same step serve.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio import activity

from activities.checkpoints.storage import LocalStore
from activities.checkpoints.verify import read_manifest, written_by_other_job
from lazarus.domain.checkpoint_layout import ROLLED_BACK_DIR, committed_steps, move_aside
from lazarus.domain.contracts import CheckpointRef, RollbackRequest, RollbackResult
from lazarus.domain.timeline import manifest_generation

RETIRED_DIR = ROLLED_BACK_DIR


def retire_newest(checkpoint_dir: str, job_id: str | None = None) -> RollbackResult:
    """Move the newest committed checkpoint of ``job_id`` aside. Checkpoints another
    job wrote (a directory shared by mistake) are neither retired nor resumed from."""
    root = Path(checkpoint_dir)
    found = [
        (step, path)
        for step, path in committed_steps(root)
        if written_by_other_job(path, job_id) is None
    ]
    if len(found) < 1:
        return RollbackResult(retired=[], resume=None)
    step, path = found[-1]
    # Who wrote it, read before the move: the workflow retires this state by identity
    # (every copy of it, in any tier), not the step number (issue 37, N10).
    manifest, _ = read_manifest(LocalStore(root), path.name)
    generation = manifest_generation(manifest) if manifest is not None else None
    target = move_aside(root, path, RETIRED_DIR)
    remaining = found[:-1]
    resume = CheckpointRef(step=remaining[-1][0], path=str(remaining[-1][1])) if remaining else None
    retired = CheckpointRef(step=step, path=str(target), generation=generation)
    return RollbackResult(retired=[retired], resume=resume)


@activity.defn(name="roll_back_checkpoint")
async def roll_back_checkpoint(request: RollbackRequest) -> RollbackResult:
    """Not idempotent by itself (each call retires one more), so the workflow runs it
    with no retries; a failed attempt leaves at worst the newest one in place."""
    return await asyncio.to_thread(retire_newest, request.checkpoint_dir, request.job_id)
