"""The memory checkpoint tier, rank side: snapshot directories in a node's tmpfs.

Most crashes kill a process on a healthy node, and ``/dev/shm`` survives that, so
a relaunch on the same nodes can resume from a snapshot taken one step ago instead
of the last disk checkpoint. When the launcher sets
``LAZARUS_MEMORY_CHECKPOINT_DIR`` (the same path on every node, e.g.
``/dev/shm/lazarus/<job>/<run>``), each node's local rank 0 writes its node's copy
there in the disk tier's layout, commits it with the disk tier's protocol
(manifest, then ``COMMITTED``), and keeps only the newest ``LAZARUS_MEMORY_KEEP``
committed snapshots.

Two differences from the disk tier, both because the copy lives in RAM:

* **Sizes, no hashes.** The manifest records each file's size and ``"sha256":
  null``, plus ``"tier": "memory"``: hashing every step would cost more than the
  snapshot, and a torn tmpfs copy shows as a missing marker or a size mismatch.
* **Bounded.** Older snapshots are deleted after each commit (marker first), as
  are torn leftovers below the newest commit; the snapshot named by this process's
  resume point is never deleted. RAM use is ``keep + 1`` copies of the state.

And two guarantees the disk tier gets from its own directory:

* **Private.** The path the launcher gives is under the tier's logical root; the
  files live under ``/dev/shm/lazarus-<uid>`` (:func:`lazarus.domain.memory_tier.on_node`),
  created 0700 and refused when it is a symlink, not this user's, or group- or
  world-writable. Below it no symlink is followed, and snapshot files are 0600.
* **One timeline.** Snapshots an older generation wrote above the step this
  generation resumed from belong to a timeline the job left (a rollback, a
  fallback): the prune deletes them first, so a fresh commit is never pruned in
  their favour (:mod:`lazarus.domain.timeline`; the controller's search refuses
  them too).

Standard library only: the torch side is :func:`lazarus.rank.torch.snapshot`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from pathlib import Path

from lazarus.domain import checkpoint_layout, environment, memory_tier
from lazarus.rank import checkpoints, control, identity, marks

__all__ = [
    "DEFAULT_KEEP",
    "UnsafeMemoryRoot",
    "abandoned",
    "commit",
    "directory",
    "due",
    "is_writer",
    "keep",
    "secure",
    "usable_snapshots",
]

DEFAULT_KEEP = 2
"""Two, not one: a node commits step k only after every node wrote k, so when a node
dies between that barrier and its own commit, step k-1 is the newest step every
node still holds committed."""


def directory() -> Path | None:
    """This node's snapshot directory, or None when the memory tier is off."""
    raw = os.environ.get(environment.MEMORY_CHECKPOINT_DIR)
    return Path(memory_tier.on_node(raw, os.getuid())) if raw else None


class UnsafeMemoryRoot(PermissionError):
    """The tier's private root is not safe to use: nothing is written or read there."""


def secure(run_dir: Path, *, create: bool = True) -> Path:
    """``run_dir`` once every directory from the private root down to it is this
    user's, a real directory (no symlink) and closed to group and others: the root
    and what is missing below it are created 0700 (with ``create``; without it, the
    check stops at the first one missing). Raises :class:`UnsafeMemoryRoot` naming
    the path and the reason otherwise."""
    uid = os.getuid()
    root = Path(memory_tier.private_root(uid))
    if not run_dir.is_relative_to(root):
        return run_dir  # a directory the user chose outside Lazarus: theirs to guard
    current = root
    for part in ("", *run_dir.relative_to(root).parts):
        current = current / part if part else current
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(current, 0o700)
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            if create:
                raise
            return run_dir
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise UnsafeMemoryRoot(f"memory tier: {current} is not a directory (a symlink?)")
        if info.st_uid != uid:
            raise UnsafeMemoryRoot(
                f"memory tier: {current} belongs to uid {info.st_uid}, not this user ({uid})"
            )
        if info.st_mode & 0o077:
            raise UnsafeMemoryRoot(
                f"memory tier: {current} is open to other users "
                f"(mode {stat.S_IMODE(info.st_mode):o}, want 700)"
            )
    return run_dir


def keep() -> int:
    """How many committed snapshots to keep (``LAZARUS_MEMORY_KEEP``, default 2)."""
    value = identity._env_int(environment.MEMORY_KEEP, DEFAULT_KEEP)
    if value < 1:
        raise ValueError(f"environment variable {environment.MEMORY_KEEP}={value} must be >= 1")
    return value


def due(step: int) -> bool:
    """Whether completed step ``step`` gets a snapshot (the tier is on and ``step``
    is a multiple of :func:`lazarus.rank.memory_every_steps`)."""
    return control._on_interval(step, control.memory_every_steps())


def is_writer() -> bool:
    """Each node's local rank 0 writes that node's copy; other ranks only wait."""
    return identity.info().local_rank == 0


def write_dir(step: int) -> Path:
    """The directory to write ``step``'s files into (a hidden re-save when the step
    is committed already), cleared of temp files a killed writer left: this node has
    one writer, and its previous write has finished, so any temp file is garbage
    that would otherwise hold RAM."""
    target = checkpoints._write_dir(_root(), step)
    target.chmod(0o700)
    for leftover in target.glob(f"*{checkpoint_layout.TEMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            leftover.unlink()
    return target


def commit(step: int) -> Path:
    """Seal ``step``'s snapshot (after the cross-node barrier), then prune."""
    root = _root()
    final, _ = checkpoints._commit(
        root,
        step,
        identity.info(),
        hash_files=False,
        request=None,
        tier=checkpoint_layout.MEMORY_TIER,
    )
    _close_to_others(final)
    prune(root)
    return final


def prune(root: Path) -> list[Path]:
    """Delete the snapshots of a timeline this generation left (see
    :func:`abandoned`), then committed snapshots beyond the newest :func:`keep`, and
    uncommitted step directories older than the newest commit (torn writes of a dead
    process), except the one this process resumed from. Never follows a symlink.
    ``root`` is one :func:`commit` has just checked with :func:`secure` (only this
    user can change a private root, so the check holds). Returns what was deleted."""
    committed = [
        (step, path)
        for step, path in checkpoint_layout.committed_steps(root)
        if not path.is_symlink()
    ]
    if not committed:
        return []
    left = [path for step, path in committed if abandoned(step, path)]
    current = [(step, path) for step, path in committed if path not in left]
    newest = current[-1][0] if current else committed[-1][0]
    doomed = [*left, *(path for _, path in current[: -keep()])]
    for child in root.iterdir():
        step = checkpoint_layout.parse_step_dir(child.name)
        if (
            step is not None
            and step < newest
            and not child.is_symlink()
            and not checkpoint_layout.is_committed(child)
        ):
            doomed.append(child)
    protected = {path.absolute() for path in _resume_dirs()}
    deleted = []
    for path in doomed:
        if path.absolute() in protected or path.is_symlink():
            continue
        # Marker first, like every deletion of a checkpoint: a half-deleted snapshot
        # must read as torn, never as committed.
        with contextlib.suppress(OSError):
            (path / checkpoint_layout.COMMIT_MARKER).unlink()
        shutil.rmtree(path, ignore_errors=True)
        deleted.append(path)
    return deleted


def usable_snapshots() -> list[tuple[int, Path]]:
    """Committed snapshots this job may resume from, oldest first. Skipped: torn
    ones (no marker, or files that do not match the manifest's sizes) and those
    whose manifest names another job than ``LAZARUS_JOB_ID`` (a snapshot written
    under Lazarus is another job's to a run outside it, and vice versa)."""
    root = directory()
    if root is None:
        return []
    me = identity.info().job_id
    usable = []
    for step, path in checkpoint_layout.committed_steps(root):
        if checkpoint_layout.size_problem(path) is not None:
            continue
        if _manifest_job(path) != me:
            continue
        usable.append((step, path))
    return usable


def abandoned(step: int, path: Path) -> bool:
    """Whether the snapshot of ``step`` at ``path`` is on a timeline this process's
    generation left: written by an older generation above the step this one resumed
    from. Unknown (no resume step in the environment, as in a survivor that rejoined
    in place without one): False, and the controller's search still refuses it."""
    resumed = _resume_step()
    generation = identity._generation_now()
    if resumed is None or generation < 1 or step <= resumed:
        return False
    written_by = _manifest_field(path, "generation")
    writer = written_by if isinstance(written_by, int) else 0
    return writer < generation


def _resume_step() -> int | None:
    """The step this generation resumed from, as the launcher (or a rejoin request)
    set it; None when the environment does not say."""
    raw = os.environ.get(environment.RESUME_STEP)
    if raw:
        with contextlib.suppress(ValueError):
            return int(raw)
    path = os.environ.get(environment.RESUME_FROM)
    return checkpoint_layout.parse_step_dir(Path(path).name) if path else None


def _close_to_others(snapshot: Path) -> None:
    """Snapshot files are 0600, whatever the process's umask: another user must not
    read a model's weights, even through a directory someone opened by mistake (the
    private root already keeps them out while the files are written)."""
    if snapshot.is_symlink() or not snapshot.is_dir():
        return
    for file in snapshot.rglob("*"):
        if file.is_file() and not file.is_symlink():
            file.chmod(0o600)


def _manifest_field(path: Path, name: str) -> object:
    try:
        manifest = json.loads((path / checkpoint_layout.MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest.get(name) if isinstance(manifest, dict) else None


def _manifest_job(path: Path) -> str | None:
    try:
        manifest = json.loads((path / checkpoint_layout.MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    owner = manifest.get("job_id") if isinstance(manifest, dict) else None
    return owner if isinstance(owner, str) and owner else None


def _resume_dirs() -> list[Path]:
    dirs = []
    if marks._resumed_from_dir is not None:
        dirs.append(marks._resumed_from_dir)
    raw = os.environ.get(environment.RESUME_FROM)
    if raw:
        dirs.append(Path(raw))
    return dirs


def _root() -> Path:
    root = directory()
    if root is None:
        raise RuntimeError(f"the memory tier is off: {environment.MEMORY_CHECKPOINT_DIR} is unset")
    return secure(root)
