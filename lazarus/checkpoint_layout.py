"""On-disk layout of a committed checkpoint, shared by writer and reader.

The rank helper writes checkpoints in this layout and the ``find_checkpoint``
activity reads it. A checkpoint is a directory ``step-NNNNNNNN/`` that counts
only once its commit marker exists: the marker is written last, atomically, by
rank 0 after every rank has finished writing, so a crash mid-save leaves a
directory without a marker, which readers skip.

Standard library only: this module is imported inside training ranks.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

COMMIT_MARKER = "COMMITTED"
MANIFEST = "manifest.json"
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
