"""Bringing a durable checkpoint back to a machine that lacks it (a spare, a new node).

The copy is downloaded into a hidden temporary directory next to the target,
verified (every sha256, unless ``verify_hashes`` is off), and only then renamed
to ``step-NNNNNNNN``: a torn or corrupt download never looks like a checkpoint.
A retried attempt keeps the files already downloaded whole, so an outage in the
middle of a large restore costs only what was missing.

The manifest comes from storage the job does not fully control, so a manifest
path that is absolute, holds a ``..`` segment or resolves outside the checkpoint
is refused (``CheckpointCorrupt``, naming the checkpoint and the path) before
anything is created or downloaded.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from temporalio import activity

from activities.checkpoints.activity_errors import as_activity_errors
from activities.checkpoints.storage import (
    CheckpointCorrupt,
    CheckpointInputError,
    CheckpointStore,
    LocalStore,
    S3Store,
    file_sha256,
    locate,
)
from activities.checkpoints.verify import read_manifest, verify_directory
from activities.heartbeat import in_thread_heartbeating
from lazarus.domain.checkpoint_layout import (
    COMMIT_MARKER,
    MANIFEST,
    TEMP_SUFFIX,
    fsync_directory,
    parse_step_dir,
    resolves_inside,
)
from lazarus.domain.contracts import CheckpointRef, RestoreCheckpointRequest


class RestoreProgress:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bytes_total = 0
        self.bytes_done = 0
        self.files_done = 0

    def add(self, size: int) -> None:
        with self.lock:
            self.bytes_done += size
            self.files_done += 1

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {
                "bytes_total": self.bytes_total,
                "bytes_done": self.bytes_done,
                "files_done": self.files_done,
            }


def restore_checkpoint_sync(
    request: RestoreCheckpointRequest,
    progress: RestoreProgress | None = None,
    cancel: threading.Event | None = None,
) -> CheckpointRef:
    progress = progress or RestoreProgress()
    cancel = cancel or threading.Event()
    spec = request.checkpoints
    store, name = locate(request.uri, endpoint_url=spec.endpoint_url, region=spec.region)
    if name is None:
        raise CheckpointInputError(f"{request.uri}: not a checkpoint (expected .../step-NNNNNNNN)")
    step = parse_step_dir(name)
    assert step is not None
    if store.stat(name, COMMIT_MARKER) is None:
        raise CheckpointCorrupt(store.location(name), [f"{COMMIT_MARKER}: missing"])
    manifest, problem = read_manifest(store, name)
    if manifest is None:
        raise CheckpointCorrupt(store.location(name), [str(problem)])
    files: dict[str, Any] = manifest["files"]
    progress.bytes_total = sum(int(e.get("size", 0)) for e in files.values())

    root = Path(request.checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    target = root / name
    if target.is_dir():
        existing = verify_directory(target, hashes=spec.verify_hashes)
        if existing.ok:
            return CheckpointRef(step=step, path=str(target))
    temp = root / f".{name}.restore{TEMP_SUFFIX}"
    temp.mkdir(exist_ok=True)
    for rel, entry in sorted(files.items()):
        if cancel.is_set():
            raise RuntimeError("restore cancelled")
        size, sha = int(entry["size"]), entry.get("sha256")
        if not resolves_inside(temp, rel):  # read_manifest refused '..' and absolute paths
            problem = f"{MANIFEST}: refused file path {rel!r}: leaves the checkpoint"
            raise CheckpointCorrupt(store.location(name), [problem])
        dest = temp / rel
        if (
            dest.is_file()
            and dest.stat().st_size == size
            and (not spec.verify_hashes or sha is None or file_sha256(dest) == sha)
        ):
            progress.add(size)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        _download(store, name, rel, dest, spec.upload_part_size_mb, spec.upload_concurrency)
        progress.add(size)
    for small in (MANIFEST, COMMIT_MARKER):  # the marker last, as everywhere
        data = store.read_small(name, small)
        if data is None:
            raise CheckpointCorrupt(store.location(name), [f"{small}: vanished during the restore"])
        _write_durably(temp / small, data)
    result = verify_directory(temp, step=step, hashes=spec.verify_hashes)
    if not result.ok:
        raise CheckpointCorrupt(store.location(name), result.problems)
    if target.exists():
        # A broken local copy: keep it aside for forensics; readers ignore the name.
        target.rename(root / f"{name}.corrupt-{int(time.time())}")
    os.rename(temp, target)
    fsync_directory(root)
    return CheckpointRef(step=step, path=str(target))


def _download(
    store: CheckpointStore, name: str, rel: str, dest: Path, part_mb: int, concurrency: int
) -> None:
    if isinstance(store, S3Store):
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(
            multipart_threshold=part_mb << 20,
            multipart_chunksize=part_mb << 20,
            max_concurrency=concurrency,
        )
        # download_file writes a temporary name and renames it when complete.
        store.client.download_file(store.bucket, store.key(name, rel), str(dest), Config=config)
        return
    assert isinstance(store, LocalStore)
    _copy(store.path / name / rel, dest)


def _copy(source: Path, dest: Path) -> None:
    import shutil

    partial = dest.with_name(f".{dest.name}.partial{TEMP_SUFFIX}")
    with open(source, "rb") as src, open(partial, "wb") as dst:
        shutil.copyfileobj(src, dst, 8 << 20)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(partial, dest)


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    fsync_directory(path.parent)


@activity.defn(name="restore_checkpoint")
async def restore_checkpoint(request: RestoreCheckpointRequest) -> CheckpointRef:
    """Download a durable checkpoint into ``checkpoint_dir`` and return the local
    reference, verified. A corrupt remote copy fails for good
    (``CheckpointCorrupt``: search again and pick an older one); an unreachable
    store fails with ``DurableStoreUnavailable`` (retryable)."""
    progress = RestoreProgress()
    cancel = threading.Event()
    with as_activity_errors(f"durable store unavailable for {request.uri}"):
        return await in_thread_heartbeating(
            lambda: restore_checkpoint_sync(request, progress, cancel),
            progress.snapshot,
            cancel=cancel,
        )
