"""Deleting old checkpoints without ever losing the last good one.

Each tier keeps its newest ``keep_local`` / ``keep_durable`` committed
checkpoints. Whatever the numbers say (even 0), the newest checkpoint that
passes verification is never deleted, and neither is anything newer than it
(a save or upload in progress, or a corrupt copy worth a look), nor a step the
caller protects. If no checkpoint verifies, nothing is deleted at all. Given the
request's ``job_id``, checkpoints another job wrote are left alone.
Uncommitted leftovers older than the newest verified checkpoint (torn saves,
abandoned uploads) are deleted. Deletion removes the commit marker first.
"""

from __future__ import annotations

from temporalio import activity

from activities.checkpoints.find import durable_store
from activities.checkpoints.storage import CheckpointStore, LocalStore, store_errors
from activities.checkpoints.verify import Level, owner_problem, verify_in_store
from activities.heartbeat import in_thread_heartbeating
from lazarus.domain.checkpoint_layout import COMMIT_MARKER
from lazarus.domain.contracts import (
    CheckpointRef,
    GarbageCollectionRequest,
    GarbageCollectionResult,
)


def plan_deletions(
    store: CheckpointStore, keep: int, level: Level, protect: set[int], job_id: str | None = None
) -> tuple[list[tuple[int, str]], int | None]:
    """``(checkpoints to delete, newest verified step)`` for one tier. Checkpoints
    whose manifest names another job are invisible here: never deleted, and never
    the "newest verified" that would let this job's own be deleted."""
    every = [(s, n) for s, n in store.steps() if owner_problem(store, n, job_id) is None]
    committed = [(s, n) for s, n in every if store.stat(n, COMMIT_MARKER) is not None]
    newest_verified: int | None = None
    for step, name in reversed(committed):
        if verify_in_store(store, name, level).ok:
            newest_verified = step
            break
    if newest_verified is None:
        return [], None
    kept = {s for s, _ in committed[-keep:]} if keep > 0 else set()
    kept |= protect | {newest_verified}
    return [(s, n) for s, n in every if s < newest_verified and s not in kept], newest_verified


def collect_garbage_sync(request: GarbageCollectionRequest) -> GarbageCollectionResult:
    spec = request.checkpoints
    protect = set(request.protect_steps)
    problems: list[str] = []
    local = LocalStore(request.checkpoint_dir)
    level: Level = "hashes" if spec.verify_hashes else "sizes"
    deletions, newest_local = plan_deletions(local, spec.keep_local, level, protect, request.job_id)
    deleted_local = _delete(local, deletions, problems)
    deleted_durable: list[CheckpointRef] = []
    newest_durable: int | None = None
    if spec.durable_uri is not None:
        try:
            durable = durable_store(spec, max_attempts=2)
            assert durable is not None
            deletions, newest_durable = plan_deletions(
                durable, spec.keep_durable, "metadata", protect, request.job_id
            )
            deleted_durable = _delete(durable, deletions, problems)
        except store_errors() as exc:
            problems.append(f"{spec.durable_uri}: {exc}")
    return GarbageCollectionResult(
        deleted_local=deleted_local,
        deleted_durable=deleted_durable,
        newest_verified_local=newest_local,
        newest_verified_durable=newest_durable,
        problems=problems,
    )


def _delete(
    store: CheckpointStore, deletions: list[tuple[int, str]], problems: list[str]
) -> list[CheckpointRef]:
    deleted: list[CheckpointRef] = []
    for step, name in deletions:
        try:
            store.delete(name)
        except (OSError, *store_errors()) as exc:  # type: ignore[misc]
            problems.append(f"{store.location(name)}: not deleted: {exc}")
            continue
        deleted.append(CheckpointRef(step=step, path=store.location(name)))
    return deleted


@activity.defn(name="collect_garbage")
async def collect_garbage(request: GarbageCollectionRequest) -> GarbageCollectionResult:
    """Apply ``keep_local``/``keep_durable``; returns what was deleted. Best effort:
    failures are listed in ``problems`` (the next run retries), never raised."""
    return await in_thread_heartbeating(lambda: collect_garbage_sync(request))
