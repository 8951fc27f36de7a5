"""What ``lazarus start`` tells the operator before a job starts: where it resumes.

A job silently resuming from a checkpoint left by an earlier run (of the demo, or
of the same spec under another name) trains nothing and looks like success. So
``start`` runs the same search the workflow will run, read-only, and says which
step it will resume from, which job wrote it and when; ``start --fresh`` first
moves every existing checkpoint of the directory aside, keeping them.

Plain I/O, no temporalio: start's check on the worker calls it
(:mod:`activities.start_checks`; the CLI runs no checkpoint code). It sees the
checkpoint directory as the worker sees it, which is the ranks' view on a local stack
or a shared filesystem.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from activities.checkpoints.find import durable_store, search_verified
from activities.checkpoints.storage import LocalStore, S3Store, store_errors
from activities.checkpoints.verify import owner_problem, read_manifest
from lazarus.domain.checkpoint_layout import (
    COMMIT_MARKER,
    RESAVE_SUFFIX,
    fsync_directory,
    parse_step_dir,
)
from lazarus.domain.checkpoint_views import PREVIOUS_PREFIX, ResumePlan, SetAside
from lazarus.domain.contracts import FindVerifiedCheckpointRequest
from lazarus.domain.spec import JobSpec


def plan_resume(spec: JobSpec) -> ResumePlan:
    """The search the workflow's first launch runs, without side effects: sizes only
    (hashing a large checkpoint is the workflow's job, not a CLI's), nothing moved."""
    checkpoints = spec.checkpoints.model_copy(update={"verify_hashes": False})
    search = search_verified(
        FindVerifiedCheckpointRequest(
            checkpoint_dir=spec.checkpoint_dir,
            checkpoints=checkpoints,
            expected_world_size=spec.world_size,
            job_id=spec.job_id,
        ),
        move_aside_corrupt=False,
    )
    base = ResumePlan(
        checkpoint_dir=spec.checkpoint_dir,
        skipped=search.skipped,
        durable_unavailable=search.durable_unavailable,
    )
    if search.chosen is None:
        return base
    written_by, written_at = _provenance(spec, search.chosen.path, search.location == "durable")
    return base.model_copy(
        update={
            "step": search.chosen.step,
            "path": search.chosen.path,
            "location": search.location,
            "written_by": written_by,
            "written_at": written_at,
        }
    )


def _provenance(spec: JobSpec, path: str, durable: bool) -> tuple[str | None, float | None]:
    """``(job id, commit time)`` of a checkpoint, from its manifest and marker."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    try:
        store = durable_store(spec.checkpoints) if durable else LocalStore(Path(path).parent)
        assert store is not None
        manifest, _ = read_manifest(store, name)
        marker = store.read_small(name, COMMIT_MARKER)
    except store_errors():
        return None, None
    job = manifest.get("job_id") if manifest else None
    when: float | None = None
    try:
        when = float(json.loads(marker or b"")["committed_at"])
    except (ValueError, KeyError, TypeError):
        created = manifest.get("created_at") if manifest else None
        when = float(created) if isinstance(created, int | float) else None
    return (job if isinstance(job, str) else None), when


def set_aside(checkpoint_dir: str, now: float | None = None) -> SetAside:
    """Move every checkpoint (committed or not, and unfinished re-saves) of
    ``checkpoint_dir`` into ``.previous-<UTC time>/``: kept, not deleted, and out of
    every search. Renames only, within the directory, so it is instant."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return SetAside(moved_to=None)
    movable = sorted(
        child
        for child in root.iterdir()
        if child.is_dir() and (parse_step_dir(child.name) is not None or _is_resave(child.name))
    )
    if not movable:
        return SetAside(moved_to=None)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now if now is not None else time.time()))
    target = root / f"{PREVIOUS_PREFIX}{stamp}"
    suffix = 0
    while target.exists():
        suffix += 1
        target = root / f"{PREVIOUS_PREFIX}{stamp}.{suffix}"
    target.mkdir()
    steps: list[int] = []
    for child in movable:
        child.rename(target / child.name)
        step = parse_step_dir(child.name)
        if step is not None:
            steps.append(step)
    fsync_directory(root)
    return SetAside(moved_to=str(target), steps=sorted(steps))


def _is_resave(name: str) -> bool:
    # ".step-NNNNNNNN.resave" (lazarus.rank): a re-save that never committed.
    return (
        name.startswith(".")
        and name.endswith(RESAVE_SUFFIX)
        and parse_step_dir(name[1 : -len(RESAVE_SUFFIX)]) is not None
    )


class FreshRefused(Exception):
    """``--fresh`` cannot keep its promise: the durable tier would still resume the job."""


def start_fresh(spec: JobSpec) -> list[SetAside]:
    """``start --fresh``: set aside the local checkpoints, and a filesystem durable
    tier's. An S3 tier holding this job's checkpoints is refused, before anything
    moves: the workflow would restore from it, and moving objects is a copy."""
    durable_uri = spec.checkpoints.durable_uri
    if durable_uri is not None and spec.checkpoints.durable_is_s3:
        store = durable_store(spec.checkpoints, max_attempts=2)
        assert isinstance(store, S3Store)
        try:
            held = [s for s, n in store.steps() if owner_problem(store, n, spec.job_id) is None]
        except store_errors() as exc:
            raise FreshRefused(f"{durable_uri}: cannot check the durable tier: {exc}") from None
        if held:
            raise FreshRefused(
                f"{durable_uri} holds checkpoints of job {spec.job_id} (steps "
                f"{', '.join(map(str, held))}), which the job would restore: move them "
                f"(aws s3 mv --recursive), point checkpoints.durable_uri elsewhere, or "
                f"start under another --name"
            )
    moved = [set_aside(spec.checkpoint_dir)]
    if durable_uri is not None and not spec.checkpoints.durable_is_s3:
        moved.append(set_aside(durable_uri))
    return [m for m in moved if m.moved_to is not None]


__all__ = [
    "PREVIOUS_PREFIX",
    "FreshRefused",
    "ResumePlan",
    "SetAside",
    "plan_resume",
    "set_aside",
    "start_fresh",
]
