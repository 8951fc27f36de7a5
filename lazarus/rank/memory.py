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

Standard library only: the torch side is :func:`lazarus.rank.torch.snapshot`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import lazarus.rank as lazarus_rank
from lazarus.domain import checkpoint_layout, environment

__all__ = ["DEFAULT_KEEP", "commit", "directory", "due", "is_writer", "keep", "usable_snapshots"]

DEFAULT_KEEP = 2
"""Two, not one: a node commits step k only after every node wrote k, so when a node
dies between that barrier and its own commit, step k-1 is the newest step every
node still holds committed."""


def directory() -> Path | None:
    """This node's snapshot directory, or None when the memory tier is off."""
    raw = os.environ.get(environment.MEMORY_CHECKPOINT_DIR)
    return Path(raw) if raw else None


def keep() -> int:
    """How many committed snapshots to keep (``LAZARUS_MEMORY_KEEP``, default 2)."""
    value = lazarus_rank._env_int(environment.MEMORY_KEEP, DEFAULT_KEEP)
    if value < 1:
        raise ValueError(f"environment variable {environment.MEMORY_KEEP}={value} must be >= 1")
    return value


def due(step: int) -> bool:
    """Whether completed step ``step`` gets a snapshot (the tier is on and ``step``
    is a multiple of :func:`lazarus.rank.memory_every_steps`)."""
    return lazarus_rank._on_interval(step, lazarus_rank.memory_every_steps())


def is_writer() -> bool:
    """Each node's local rank 0 writes that node's copy; other ranks only wait."""
    return lazarus_rank.info().local_rank == 0


def write_dir(step: int) -> Path:
    """The directory to write ``step``'s files into (a hidden re-save when the step
    is committed already), cleared of temp files a killed writer left: this node has
    one writer, and its previous write has finished, so any temp file is garbage
    that would otherwise hold RAM."""
    target = lazarus_rank._write_dir(_root(), step)
    for leftover in target.glob(f"*{checkpoint_layout.TEMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            leftover.unlink()
    return target


def commit(step: int) -> Path:
    """Seal ``step``'s snapshot (after the cross-node barrier), then prune."""
    root = _root()
    final, _ = lazarus_rank._commit(
        root,
        step,
        lazarus_rank.info(),
        hash_files=False,
        request=None,
        tier=checkpoint_layout.MEMORY_TIER,
    )
    prune(root)
    return final


def prune(root: Path) -> list[Path]:
    """Delete committed snapshots beyond the newest :func:`keep`, and uncommitted
    step directories older than the newest commit (torn writes of a dead process),
    except the one this process resumed from. Returns what was deleted."""
    committed = checkpoint_layout.committed_steps(root)
    if not committed:
        return []
    newest = committed[-1][0]
    doomed = [path for _, path in committed[: -keep()]]
    for child in root.iterdir():
        step = checkpoint_layout.parse_step_dir(child.name)
        if step is not None and step < newest and not checkpoint_layout.is_committed(child):
            doomed.append(child)
    protected = {path.resolve() for path in _resume_dirs()}
    deleted = []
    for path in doomed:
        if path.resolve() in protected:
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
    me = lazarus_rank.info().job_id
    usable = []
    for step, path in checkpoint_layout.committed_steps(root):
        if checkpoint_layout.size_problem(path) is not None:
            continue
        if _manifest_job(path) != me:
            continue
        usable.append((step, path))
    return usable


def _manifest_job(path: Path) -> str | None:
    try:
        manifest = json.loads((path / checkpoint_layout.MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    owner = manifest.get("job_id") if isinstance(manifest, dict) else None
    return owner if isinstance(owner, str) and owner else None


def _resume_dirs() -> list[Path]:
    dirs = []
    if lazarus_rank._resumed_from_dir is not None:
        dirs.append(lazarus_rank._resumed_from_dir)
    raw = os.environ.get(environment.RESUME_FROM)
    if raw:
        dirs.append(Path(raw))
    return dirs


def _root() -> Path:
    root = directory()
    if root is None:
        raise RuntimeError(f"the memory tier is off: {environment.MEMORY_CHECKPOINT_DIR} is unset")
    return root
