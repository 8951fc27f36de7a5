"""On-disk layout of a committed checkpoint, shared by writer and reader.

The rank helper writes checkpoints in this layout; the checkpoint activities
(find, verify, tier, restore, retire) and ``lazarus checkpoints`` read it.
A checkpoint is a directory ``step-NNNNNNNN/`` that counts only once its commit
marker exists: the marker is written last, atomically, by rank 0 after every
rank has finished writing, so a crash mid-save leaves a directory without a
marker, which readers skip.

Standard library only: this module is imported inside training ranks.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath

COMMIT_MARKER = "COMMITTED"
TEMP_SUFFIX = ".lazarus-tmp"
RESAVE_SUFFIX = ".resave"
"""``.step-N.resave/``: a re-save of a committed step, sealed there and renamed over it."""
"""Files ending in this are unfinished writes (the rank helper's and the controller's
atomic writes): never listed in a manifest, and swept once their writer is dead."""
MANIFEST = "manifest.json"
CORRUPT_DIR = ".corrupt"
"""Where a committed checkpoint that failed verification is moved, kept for a person."""
ROLLED_BACK_DIR = ".rolled-back"
"""Where a numerical rollback retires the checkpoint that may hold the divergence."""
MEMORY_TIER = "memory"
"""The ``tier`` a memory snapshot's manifest records (disk manifests carry no ``tier``)."""
_STEP_DIR = re.compile(r"^step-(\d{8,})$")


def step_dir_name(step: int) -> str:
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return f"step-{step:08d}"


def parse_step_dir(name: str) -> int | None:
    """Return the step a directory name encodes, or None if it is not a checkpoint."""
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def is_committed(path: Path) -> bool:
    return (path / COMMIT_MARKER).is_file()


def committed_steps(root: Path) -> list[tuple[int, Path]]:
    """All committed checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found: list[tuple[int, Path]] = []
    for child in root.iterdir():
        step = parse_step_dir(child.name)
        if step is not None and child.is_dir() and is_committed(child):
            found.append((step, child))
    found.sort()
    return found


def size_problem(directory: Path) -> str | None:
    """Why committed checkpoint ``directory`` is not whole by its manifest's sizes, or
    None if it is: the manifest is readable, names this step, and every file it lists
    exists with the recorded size. The cheap check (no hashing) that tells a torn or
    tampered copy from a good one, e.g. for memory snapshots read at startup."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        return f"{MANIFEST} unreadable: {exc}"

    def size_of(relpath: str) -> int | None:
        try:
            return (directory / relpath).stat().st_size
        except OSError:
            return None

    return manifest_size_problem(manifest, parse_step_dir(directory.name), size_of)


def manifest_size_problem(
    manifest: object, step: int | None, size_of: Callable[[str], int | None]
) -> str | None:
    """:func:`size_problem` given the parsed manifest, the directory's step and each
    file's actual size (None: missing), wherever they were read: the controller
    judges a remote node's snapshot from the sizes that node reports."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return f"{MANIFEST} has no files table"
    if step is not None and manifest.get("step") != step:
        return f"{MANIFEST} names step {manifest.get('step')!r}, the directory step {step}"
    for relpath, entry in manifest["files"].items():
        unsafe = unsafe_relpath(relpath)
        if unsafe is not None:
            return f"{relpath!r}: {unsafe}"
        size = entry.get("size") if isinstance(entry, dict) else None
        if not isinstance(size, int):
            return f"{relpath}: manifest entry has no size"
        actual = size_of(relpath)
        if actual is None:
            return f"{relpath}: missing"
        if actual != size:
            return f"{relpath}: {actual} bytes, the manifest says {size}"
    return None


def fsync_directory(directory: Path) -> None:
    """Make the renames inside ``directory`` durable. A rename is durable only once
    the directory entry is; not every platform lets a directory be opened for this,
    and there the rename is all we have."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def unsafe_relpath(relpath: object) -> str | None:
    """Why a manifest entry cannot name a file of its checkpoint, or None if it can.

    Manifests come from storage a job does not fully control (a shared directory,
    a bucket), and restore turns every entry into a path to write. An entry is a
    relative POSIX path that stays inside its checkpoint: not absolute, no ``..``
    segment, no empty or NUL-bearing name. Symlinks that lead outside are checked
    where the files are (:func:`resolves_inside`)."""
    if not isinstance(relpath, str) or not relpath:
        return "an empty file name"
    if "\x00" in relpath:
        return "a NUL byte in the file name"
    if relpath.startswith(("/", "\\")) or PurePosixPath(relpath).is_absolute():
        return "an absolute path"
    if re.match(r"^[A-Za-z]:", relpath):
        return "an absolute (drive) path"
    if any(part == ".." for part in re.split(r"[/\\]", relpath)):
        return "a '..' segment (it would leave the checkpoint)"
    return None


def resolves_inside(base: Path, relpath: str) -> bool:
    """``base / relpath`` stays inside ``base`` once symlinks are followed."""
    root = base.resolve()
    return (root / relpath).resolve().is_relative_to(root)


def move_aside(root: Path, path: Path, folder: str) -> Path:
    """Rename checkpoint ``path`` to ``root/folder/<name>.<n>`` (the first free n),
    so readers stop seeing it while a person still can. A rename, never a copy:
    ``folder`` lives under the same root, hence on the same filesystem."""
    graveyard = root / folder
    graveyard.mkdir(parents=True, exist_ok=True)
    index = 0
    while True:
        target = graveyard / f"{path.name}.{index}"
        if not target.exists():
            try:
                path.rename(target)
            except OSError:
                if target.exists():  # a concurrent mover took this index
                    index += 1
                    continue
                raise
            fsync_directory(root)
            return target
        index += 1


def temp_path_for(target: Path) -> Path:
    """A unique temporary sibling of ``target`` for write-then-rename.

    Every atomic write Lazarus makes (the rank helper's checkpoints, the rank
    wrapper's pid and exit records, the controller's run-directory files) names its
    temporary file this way, so one rule finds a dead writer's leftovers: a stop
    that has killed a generation sweeps ``*TEMP_SUFFIX`` there, and a manifest
    never lists such a name."""
    return target.with_name(f".{target.name}.{os.getpid()}.{next(_temp_counter)}{TEMP_SUFFIX}")


_temp_counter = itertools.count()
