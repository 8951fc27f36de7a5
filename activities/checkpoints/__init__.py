"""Checkpoints you can trust: finding, verifying, tiering, restoring and retiring them.

One package for every checkpoint concern:

- :mod:`.storage`: the backends (a local or shared filesystem, S3 and
  S3-compatible stores) behind one interface;
- :mod:`.verify`: :func:`verify_checkpoint`, the marker + manifest + size +
  sha256 check (plain I/O, used by ``lazarus verify``);
- :mod:`.find`: ``find_verified_checkpoint`` (newest committed *and* verified, with
  the skipped ones listed);
- :mod:`.tiering`: ``upload_checkpoint`` to the durable tier, multipart, parallel,
  resumable from its heartbeat;
- :mod:`.restore`: ``restore_checkpoint`` from the durable tier, verified before
  it counts;
- :mod:`.retention`: ``collect_garbage``, which never deletes the newest verified
  checkpoint;
- :mod:`.listing`: :func:`list_checkpoints` for ``lazarus checkpoints``.
"""

from __future__ import annotations

from activities.checkpoints.find import (
    find_verified_checkpoint,
    search_verified,
)
from activities.checkpoints.restore import restore_checkpoint, restore_checkpoint_sync
from activities.checkpoints.retention import collect_garbage, collect_garbage_sync
from activities.checkpoints.storage import (
    CheckpointCorrupt,
    CheckpointInputError,
    DurableStoreUnavailable,
    open_store,
)
from activities.checkpoints.tiering import upload_checkpoint, upload_checkpoint_sync
from activities.checkpoints.verify import verify_checkpoint, verify_in_store

__all__ = [
    "CheckpointCorrupt",
    "CheckpointInputError",
    "DurableStoreUnavailable",
    "collect_garbage",
    "collect_garbage_sync",
    "find_verified_checkpoint",
    "open_store",
    "restore_checkpoint",
    "restore_checkpoint_sync",
    "search_verified",
    "upload_checkpoint",
    "upload_checkpoint_sync",
    "verify_checkpoint",
    "verify_in_store",
]
