"""Finding the checkpoint to resume from.

``find_verified_checkpoint`` walks checkpoints newest first, in the run's memory
tier (when the request names it), locally and (if configured) in the durable tier,
and returns the newest one that is committed *and* matches its manifest, listing
every newer one it had to pass over and why, so the workflow can record an incident
and the steps it cost.
"""

from __future__ import annotations

import logging

from temporalio import activity

from activities.checkpoints.memory_tier import search_memory
from activities.checkpoints.storage import (
    CheckpointStore,
    LocalStore,
    open_store,
    store_errors,
)
from activities.checkpoints.verified_once import still_as_verified
from activities.checkpoints.verify import Level, owner_problem, verify_in_store
from activities.heartbeat import in_thread_heartbeating
from lazarus.domain.checkpoint_layout import (
    COMMIT_MARKER,
    CORRUPT_DIR,
    MANIFEST,
    is_committed,
    move_aside,
    parse_step_dir,
)
from lazarus.domain.contracts import (
    CheckpointRef,
    CheckpointSearch,
    FindVerifiedCheckpointRequest,
    SkippedCheckpoint,
)
from lazarus.domain.spec import CheckpointsSpec

log = logging.getLogger(__name__)


def durable_store(checkpoints: CheckpointsSpec, *, max_attempts: int = 3) -> CheckpointStore | None:
    if checkpoints.durable_uri is None:
        return None
    return open_store(
        checkpoints.durable_uri,
        endpoint_url=checkpoints.endpoint_url,
        region=checkpoints.region,
        max_connections=checkpoints.upload_concurrency,
        max_attempts=max_attempts,
    )


def search_verified(
    request: FindVerifiedCheckpointRequest, *, move_aside_corrupt: bool = True
) -> CheckpointSearch:
    """The newest resume point across the memory, local and durable tiers.

    The memory tier is searched first (sizes only, on every relaunch node: see
    :mod:`activities.checkpoints.memory_tier`); the disk tiers then only look
    at steps newer than its choice, so a memory resume never waits on hashing a disk
    checkpoint it would not use. At equal steps the memory copy wins. With
    ``move_aside_corrupt`` (a real relaunch, not a preview), the buddies' replicas a
    memory choice needs are copied onto the nodes that lack it (a spare) first. ``skipped`` holds
    what was passed over in every tier above the chosen step, newest first."""
    memory = search_memory(request, restore=move_aside_corrupt)
    floor = memory.chosen.step if memory.chosen is not None else None
    disk = _search_disk(request, move_aside_corrupt=move_aside_corrupt, above_step=floor)
    chosen = disk.chosen if disk.chosen is not None else memory.chosen
    above = chosen.step if chosen is not None else None
    skipped = sorted(
        [*disk.skipped, *(s for s in memory.skipped if above is None or s.step > above)],
        key=lambda s: s.step,
        reverse=True,
    )
    location = disk.location if disk.chosen is not None else ("memory" if chosen else None)
    return disk.model_copy(
        update={
            "chosen": chosen,
            "location": location,
            "skipped": skipped,
            "memory_unavailable": memory.unavailable,
            "memory_restored": memory.restored if location == "memory" else [],
        }
    )


def _search_disk(
    request: FindVerifiedCheckpointRequest, *, move_aside_corrupt: bool, above_step: int | None
) -> CheckpointSearch:
    """The newest committed and verified checkpoint on disk (local, then durable)
    newer than ``above_step`` (see the module docstring).

    At a step held by both tiers the local copy wins; a durable copy is checked
    with one HEAD per file (sizes and the sha256 recorded at upload), because
    ``restore_checkpoint`` verifies every byte anyway before it counts. A durable
    store that cannot be reached is noted and ignored: it never blocks a restart.

    A checkpoint off the job's timeline (retired by a rollback, or written above a
    cut by an older generation: ``request.off_timeline``) is passed over quietly:
    not a fault, the state the job chose to leave. So is a step in
    ``exclude_steps`` (retired by number, before identities). A checkpoint another
    job wrote is skipped ("written by job X"), never touched.
    A committed local checkpoint that fails verification is moved to
    ``<checkpoint_dir>/.corrupt/`` (``move_aside_corrupt``; off for a read-only
    preview): kept for a person, and out of the way of the re-save of its step,
    which would otherwise write new bytes under the old, broken manifest."""
    checkpoints = request.checkpoints
    local = LocalStore(request.checkpoint_dir)
    level: Level = "hashes" if checkpoints.verify_hashes else "sizes"
    local_names = {step: name for step, name in local.steps()}
    durable: CheckpointStore | None = None
    durable_names: dict[int, str] = {}
    unavailable: str | None = None
    if request.include_durable and checkpoints.durable_uri is not None:
        try:
            durable = durable_store(checkpoints, max_attempts=2)
            assert durable is not None
            durable_names = {step: name for step, name in durable.steps()}
        except store_errors() as exc:
            durable, unavailable = None, f"{checkpoints.durable_uri}: {exc}"
    skipped: list[SkippedCheckpoint] = []
    candidates = request.disk_candidates(set(local_names) | set(durable_names), above_step)
    for step in candidates:
        if step in local_names:
            found = _check_local(request, local, local_names[step], level, move_aside_corrupt)
            if isinstance(found, CheckpointRef):
                return CheckpointSearch(
                    chosen=found, location="local", skipped=skipped, durable_unavailable=unavailable
                )
            if found is not None:
                skipped.append(found)
        if durable is not None and step in durable_names:
            name = durable_names[step]
            try:
                if durable.stat(name, COMMIT_MARKER) is None:
                    continue  # an upload still in progress, or abandoned: never a resume point
                owner = owner_problem(durable, name, request.job_id)
                if owner is not None:
                    skipped.append(
                        SkippedCheckpoint(
                            step=step,
                            path=durable.location(name),
                            location="durable",
                            problems=[owner],
                        )
                    )
                    continue
                result = verify_in_store(
                    durable, name, "metadata", expected_world_size=request.expected_world_size
                )
            except store_errors() as exc:
                durable, unavailable = None, f"{checkpoints.durable_uri}: {exc}"
                continue
            if not result.ok:
                skipped.append(
                    SkippedCheckpoint(
                        step=step, path=result.path, location="durable", problems=result.problems
                    )
                )
                continue
            off = request.off_timeline(result.generation, step)
            if off is not None:
                log.info("durable checkpoint step %d passed over: %s", step, off)
                continue
            return CheckpointSearch(
                chosen=CheckpointRef(step=step, path=result.path),
                location="durable",
                skipped=skipped,
                durable_unavailable=unavailable,
            )
    return CheckpointSearch(skipped=skipped, durable_unavailable=unavailable)


def _check_local(
    request: FindVerifiedCheckpointRequest,
    local: LocalStore,
    name: str,
    level: Level,
    move_aside_corrupt: bool,
) -> CheckpointRef | SkippedCheckpoint | None:
    """The local checkpoint ``name`` as a resume point, why it is skipped, or None
    when it is off the job's timeline (passed over, left where it is)."""
    step = parse_step_dir(name)
    assert step is not None
    path = local.location(name)
    owner = owner_problem(local, name, request.job_id)
    if owner is not None:
        return SkippedCheckpoint(step=step, path=path, problems=[owner])
    # Verified in full once already (the housekeeping watch) and unchanged since: the
    # sizes and the marker are re-checked, the bytes are not hashed again.
    trusted = still_as_verified(local.path / name, step, request.trusted)
    result = verify_in_store(local, name, "sizes" if trusted else level)
    if not result.ok:
        moved: str | None = None
        if move_aside_corrupt and is_committed(local.path / name):
            moved = str(move_aside(local.path, local.path / name, CORRUPT_DIR))
        return SkippedCheckpoint(step=step, path=path, problems=result.problems, moved_to=moved)
    off = request.off_timeline(result.generation, step)
    if off is not None:
        log.info("local checkpoint step %d passed over: %s", step, off)
        return None
    expected = request.expected_world_size
    if expected is not None and result.world_size != expected:
        # Sound, but for another world size (an elastic shrink): kept where it is.
        return SkippedCheckpoint(
            step=step,
            path=path,
            problems=[
                f"{MANIFEST}: written by a world of {result.world_size} ranks, expected {expected}"
            ],
        )
    return CheckpointRef(step=step, path=path)


@activity.defn(name="find_verified_checkpoint")
async def find_verified_checkpoint(request: FindVerifiedCheckpointRequest) -> CheckpointSearch:
    """Newest committed and verified checkpoint, and the newer ones skipped.

    Hashing a large checkpoint takes a while (about 1 s/GB per core), so give the
    activity a start-to-close timeout to match; it heartbeats while it works."""
    return await in_thread_heartbeating(lambda: search_verified(request))
