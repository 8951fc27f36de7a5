"""Verify a checkpoint once, when the controller first sees it committed.

Hashing a checkpoint costs about a second per gigabyte per core, and a recovery
used to pay it on its critical path, for a checkpoint the housekeeping loop had
already seen minutes earlier. So the housekeeping watch verifies every newly
committed checkpoint in full (marker, manifest, sizes, sha256) and records each
file's size and mtime (:class:`VerifiedCheckpoint`); the workflow keeps those
records, and at relaunch ``find_verified_checkpoint`` re-checks only the stamps
of a trusted checkpoint. Anything never verified, or whose stamps moved, is
hashed as before.

What this trusts: a file rewritten in place keeps neither its mtime nor (usually)
its size, so corruption by a later write is caught; a change that preserves both
(bit rot under the filesystem, a deliberate ``touch -d`` back-dating) is not.
``checkpoints.verify_hashes: false`` skips hashing altogether, so this is the
middle ground: every byte hashed once, never again on the recovery path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from activities.checkpoints.storage import LocalStore
from activities.checkpoints.verify import read_manifest, verify_in_store
from lazarus.domain.checkpoint_layout import MANIFEST
from lazarus.domain.contracts import FileStamp, VerifiedCheckpoint

__all__ = ["file_stamps", "still_as_verified", "verify_once"]


def file_stamps(path: Path) -> dict[str, FileStamp] | None:
    """Size and mtime of the manifest and of every file it lists; None when the
    manifest is unreadable or a listed file is missing (nothing to vouch for)."""
    store = LocalStore(path.parent)
    manifest, _ = read_manifest(store, path.name)
    if manifest is None:
        return None
    stamps: dict[str, FileStamp] = {}
    for relpath in [MANIFEST, *sorted(manifest["files"])]:
        try:
            st = os.stat(path / relpath)
        except OSError:
            return None
        stamps[relpath] = FileStamp(size=st.st_size, mtime_ns=st.st_mtime_ns)
    return stamps


def verify_once(path: Path, step: int) -> VerifiedCheckpoint | None:
    """Verify the checkpoint at ``path`` in full and return its stamps; None when it
    fails verification or changed while being hashed (then nothing is trusted and
    the next search hashes it again). The stamps are taken before hashing and
    compared after, so a file rewritten mid-hash is never vouched for."""
    before = file_stamps(path)
    if before is None:
        return None
    result = verify_in_store(LocalStore(path.parent), path.name, "hashes", step=step)
    if not result.ok or file_stamps(path) != before:
        return None
    return VerifiedCheckpoint(step=step, path=str(path), files=before, verified_at=time.time())


def _same_place(a: str, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def still_as_verified(path: Path, step: int, trusted: Iterable[VerifiedCheckpoint]) -> bool:
    """Whether a record in ``trusted`` vouches for the checkpoint at ``path``: same
    step and place, and every stamped file (the manifest included) still has its
    recorded size and mtime. Costs one ``stat`` per file, no reads."""
    return any(
        record.step == step
        and MANIFEST in record.files
        and _same_place(record.path, path)
        and _stamps_hold(path, record.files)
        for record in trusted
    )


def _stamps_hold(path: Path, stamps: dict[str, FileStamp]) -> bool:
    for relpath, stamp in stamps.items():
        try:
            st = os.stat(path / relpath)
        except OSError:
            return False
        if st.st_size != stamp.size or st.st_mtime_ns != stamp.mtime_ns:
            return False
    return True
