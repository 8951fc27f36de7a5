"""The disk checkpoint's commit protocol (shared by the memory tier): where ranks
write a step's files, and how rank 0 seals it (manifest, then the ``COMMITTED``
marker, each atomic and fsynced), re-saves a committed step without tearing it, and
answers the controller's request, holding for the planned stop that follows."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from lazarus.domain import chaos_points, checkpoint_layout, environment, phases
from lazarus.rank import control
from lazarus.rank.atomic_files import TEMP_SUFFIX, _atomic_write, _temp_counter
from lazarus.rank.heartbeats import flush_heartbeat
from lazarus.rank.identity import RankInfo, checkpoint_dir, info
from lazarus.rank.save_timing import _save_ended, _save_starts
from lazarus.rank.slow_phases import enter_slow_phase, exit_slow_phase, slow_phase

_HASH_CHUNK_BYTES = 1 << 20
HOLD_AFTER_REQUESTED_CHECKPOINT_S = 30.0
RESAVE_SUFFIX = checkpoint_layout.RESAVE_SUFFIX
"""``.step-NNNNNNNN.resave``: where a committed step is saved again (hidden from readers)."""


def _checkpoint_root() -> Path:
    root = checkpoint_dir()
    if root is None:
        raise RuntimeError(
            f"no checkpoint directory: set {environment.CHECKPOINT_DIR} or call "
            "lazarus.rank.configure(checkpoint_dir=...)"
        )
    return root


def _resave_dir(root: Path, step: int) -> Path:
    return root / f".{checkpoint_layout.step_dir_name(step)}{RESAVE_SUFFIX}"


def checkpoint_path(step: int) -> Path:
    """Create (if needed) and return the directory every rank writes its files for
    ``step`` into before rank 0 commits: ``<checkpoint_dir>/step-NNNNNNNN``.

    When that step is already committed (a relaunch re-saving a step it had saved
    before, or a just-in-time request landing on a saved step), the files go to a
    hidden sibling instead, which :func:`commit_checkpoint` renames over the old
    copy once it is sealed: the old copy stays whole until the new one is, and new
    bytes never end up under the old manifest. The first call for a step starts the
    clock of that save (see :func:`record_checkpoint_save`)."""
    root = _checkpoint_root()
    if _save_starts(step):
        # A save is slower than a step by design: the supervisor's learned hang budget
        # gives way to this phase's until the commit (or the next step, on a rank that
        # never commits).
        enter_slow_phase(phases.CHECKPOINT_SAVE, until_step=step)
    return _write_dir(root, step)


def _write_dir(root: Path, step: int) -> Path:
    """:func:`checkpoint_path` under any root (the disk or the memory tier)."""
    directory = root / checkpoint_layout.step_dir_name(step)
    if checkpoint_layout.is_committed(directory):
        directory = _resave_dir(root, step)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def commit_checkpoint(step: int, *, hash_files: bool = True) -> Path:
    """Seal the checkpoint for ``step``: write ``manifest.json``, then the
    ``COMMITTED`` marker, each atomically and fsynced, marker last.

    Call it on rank 0 only, after a barrier, once every rank's files are written:
    the marker is what tells the controller the directory is safe to resume from,
    so it must not exist before the data is durable. A step saved again after it
    was committed (see :func:`checkpoint_path`) is sealed in its hidden directory
    and then replaces the old copy by rename; calling it again for a committed step
    with nothing re-saved does nothing, so a retried commit is harmless.
    ``hash_files`` records each file's sha256 (set False for very large
    checkpoints; sizes are always recorded)."""
    me = info()
    if me.rank != 0:
        raise RuntimeError(f"commit_checkpoint must run on rank 0 only (this is rank {me.rank})")
    request = control._unanswered_request
    final, sealed = _commit(
        _checkpoint_root(), step, me, hash_files=hash_files, request=request, tier=None
    )
    _save_ended(step, sealed)  # before any hold: waiting for the stop is not the save
    exit_slow_phase(phases.CHECKPOINT_SAVE)
    if sealed and request is not None:
        _answered(request)
    return final


def _commit(
    root: Path,
    step: int,
    me: RankInfo,
    *,
    hash_files: bool,
    request: int | None,
    tier: str | None,
) -> tuple[Path, bool]:
    """The commit protocol of both tiers: seal ``step``'s directory under ``root``
    (or its re-save, then swap it in). Returns the final directory and whether
    anything was sealed (False: already committed, nothing re-saved)."""
    final = root / checkpoint_layout.step_dir_name(step)
    resave = _resave_dir(root, step)
    if resave.is_dir():
        directory = resave
    elif checkpoint_layout.is_committed(final):
        return final, False
    else:
        directory = final
        directory.mkdir(parents=True, exist_ok=True)
    _seal(directory, step, me, hash_files, request=request, tier=tier)
    if directory == resave:
        _replace(final, resave)
    return final, True


def _seal(
    directory: Path,
    step: int,
    me: RankInfo,
    hash_files: bool,
    *,
    request: int | None,
    tier: str | None,
) -> None:
    """Write the manifest and then the marker into ``directory``. ``request`` is the
    just-in-time request this checkpoint answers (recorded in the manifest);
    ``tier`` is recorded for non-disk tiers, whose commits skip the chaos point
    placed on the disk commit."""
    # A marker left by an earlier seal of this directory must not vouch for the new
    # bytes while the new manifest is being written.
    (directory / checkpoint_layout.COMMIT_MARKER).unlink(missing_ok=True)
    files: dict[str, dict[str, Any]] = {}
    directories_to_sync = {directory}
    for file in sorted(directory.rglob("*")):
        name = file.relative_to(directory).as_posix()
        if (
            not file.is_file()
            or name in (checkpoint_layout.MANIFEST, checkpoint_layout.COMMIT_MARKER)
            or name.endswith(TEMP_SUFFIX)
        ):
            continue
        files[name] = _describe_and_sync(file, hash_files)
        directories_to_sync.add(file.parent)
    for synced in sorted(directories_to_sync):
        checkpoint_layout.fsync_directory(synced)
    # The step directory's own entry in the root must survive a crash too.
    checkpoint_layout.fsync_directory(directory.parent)
    manifest = {
        "step": step,
        "world_size": me.world_size,
        "generation": me.generation,
        "job_id": me.job_id,
        "created_at": time.time(),
        "files": files,
    }
    if request is not None:
        manifest["checkpoint_request"] = request
    if tier is not None:
        manifest["tier"] = tier
    _atomic_write(
        directory / checkpoint_layout.MANIFEST,
        json.dumps(manifest, indent=2, sort_keys=True).encode(),
        durable=True,
    )
    if tier is None:
        chaos_points.chaos_point(chaos_points.CHECKPOINT_BEFORE_COMMIT)
    marker = {"step": step, "committed_at": time.time()}
    _atomic_write(
        directory / checkpoint_layout.COMMIT_MARKER,
        json.dumps(marker).encode(),
        durable=True,
    )


def _replace(final: Path, resave: Path) -> None:
    """Put the sealed re-save in place of the committed ``final``. Two renames (POSIX
    has no portable directory swap); a crash between them leaves the step absent,
    never torn, and the older checkpoints still resume. The old copy is deleted
    marker first, like every deletion of a checkpoint."""
    old = final.with_name(f".{final.name}.replaced.{os.getpid()}.{next(_temp_counter)}")
    if final.exists():
        os.rename(final, old)
    os.rename(resave, final)
    checkpoint_layout.fsync_directory(final.parent)
    with contextlib.suppress(OSError):
        (old / checkpoint_layout.COMMIT_MARKER).unlink()
    shutil.rmtree(old, ignore_errors=True)


def _answered(request: int) -> None:
    """A controller's checkpoint request always precedes a planned stop (pause, drain,
    node swap). Holding here, right after the commit, keeps every rank at this step
    (the others wait in their next collective) until the stop arrives, so the stop
    costs zero steps. The hold is bounded: if no stop comes, training goes on."""
    control._unanswered_request = None
    if not control._hold_after_commit:
        return
    control._hold_after_commit = False
    flush_heartbeat()
    deadline = time.monotonic() + HOLD_AFTER_REQUESTED_CHECKPOINT_S
    with slow_phase(phases.PLANNED_STOP_HOLD):
        while time.monotonic() < deadline:
            time.sleep(0.05)


def _describe_and_sync(file: Path, hash_files: bool) -> dict[str, Any]:
    # Other ranks may have closed these files without fsync; syncing here makes
    # the data durable before the marker that vouches for it.
    digest = hashlib.sha256() if hash_files else None
    with open(file, "rb") as handle:
        if digest is not None:
            while chunk := handle.read(_HASH_CHUNK_BYTES):
                digest.update(chunk)
        os.fsync(handle.fileno())
        size = os.fstat(handle.fileno()).st_size
    return {"size": size, "sha256": digest.hexdigest() if digest is not None else None}
