"""Copying a committed, verified local checkpoint to the durable tier.

``upload_checkpoint`` never blocks training: it runs beside it, and a store
outage only fails the activity with a retryable error (Temporal retries it).

S3 protocol (the same order makes a filesystem copy safe):

1. verify the local checkpoint (sha256, or sizes when ``verify_hashes`` is off);
   a corrupt one fails the activity for good (``CheckpointCorrupt``);
2. upload every data file: small ones in one PUT, large ones as multipart
   uploads, parts in parallel (``upload_concurrency`` threads); every request
   carries Content-MD5, so S3 refuses bytes that changed in transit;
3. complete each multipart upload; HEAD every object uploaded: its size, the
   sha256 from the manifest stored as object metadata (``x-amz-meta-sha256``),
   and its ETag against the one computed from the local bytes (md5, or md5 of
   part md5s with ``-N``; skipped under SSE-KMS where the ETag is no md5);
4. upload ``manifest.json``, check every listed object's size and recorded
   sha256 against it (one HEAD per file), and only then write ``COMMITTED``:
   a reader never trusts a remote checkpoint without the marker.

Resuming: the heartbeat details (:class:`UploadProgress`) carry the multipart
upload ids, the acknowledged parts and the finished files. A retried attempt
(after a worker crash or an outage) lists each upload's parts in S3, checks each
listed part's ETag against the md5 of the local bytes, and sends only what is
missing; objects already present with the manifest's size and sha256 metadata
are not sent again even without heartbeat details.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.checkpoints.activity_errors import as_activity_errors
from activities.checkpoints.find import durable_store
from activities.checkpoints.storage import (
    CheckpointCorrupt,
    CheckpointInputError,
    LocalStore,
    S3Store,
    file_sha256,
    multipart_etag,
)
from activities.checkpoints.verify import (
    Level,
    owner_problem,
    verify_directory,
    verify_in_store,
)
from activities.heartbeat import in_thread_heartbeating
from activities.observe import observe
from lazarus.domain.checkpoint_layout import COMMIT_MARKER, MANIFEST
from lazarus.domain.contracts import (
    MultipartState,
    UploadCheckpointRequest,
    UploadProgress,
    UploadResult,
)

MAX_PARTS = 10_000
MIB = 1 << 20


class UploadCancelled(Exception):
    pass


class UploadTracker:
    """The upload's resumable state, shared by worker threads and the heartbeat loop."""

    def __init__(self, step: int, uri: str, resume: UploadProgress | None = None) -> None:
        if resume is not None and (resume.step != step or resume.uri != uri):
            resume = None  # details of another upload: start afresh
        self.step, self.uri = step, uri
        self._lock = threading.Lock()
        self.done_files: list[str] = list(resume.done_files) if resume else []
        self.upload_ids: dict[str, str] = (
            {rel: m.upload_id for rel, m in resume.multipart.items()} if resume else {}
        )
        self.parts: dict[str, dict[int, str]] = (
            {rel: dict(m.parts) for rel, m in resume.multipart.items()} if resume else {}
        )
        self.bytes_total = 0
        self.bytes_done = 0
        self.bytes_sent = 0
        self.phase = "verifying local copy"

    def started(self, relpath: str, upload_id: str) -> None:
        with self._lock:
            self.upload_ids[relpath] = upload_id
            self.parts[relpath] = {}

    def part_done(self, relpath: str, number: int, etag: str, size: int, sent: bool) -> None:
        with self._lock:
            self.parts.setdefault(relpath, {})[number] = etag
            self.bytes_done += size
            if sent:
                self.bytes_sent += size

    def file_done(self, relpath: str, size: int, *, sent: bool, counted: bool = False) -> None:
        with self._lock:
            if relpath not in self.done_files:
                self.done_files.append(relpath)
            self.upload_ids.pop(relpath, None)
            self.parts.pop(relpath, None)
            if not counted:
                self.bytes_done += size
            if sent:
                self.bytes_sent += size

    def forget_file(self, relpath: str) -> None:
        with self._lock:
            if relpath in self.done_files:
                self.done_files.remove(relpath)

    def snapshot(self) -> UploadProgress:
        with self._lock:
            return UploadProgress(
                step=self.step,
                uri=self.uri,
                done_files=list(self.done_files),
                multipart={
                    rel: MultipartState(upload_id=uid, parts=dict(self.parts.get(rel, {})))
                    for rel, uid in self.upload_ids.items()
                },
                bytes_total=self.bytes_total,
                bytes_done=self.bytes_done,
                bytes_sent=self.bytes_sent,
                phase=self.phase,
            )


def durable_location(durable_uri: str, name: str) -> str:
    return f"{durable_uri.rstrip('/')}/{name}"


def resume_details(details: Any) -> UploadProgress | None:
    """The newest heartbeat details of a previous attempt, if they are an upload's."""
    if not details:
        return None
    last = details[-1] if isinstance(details, list | tuple) else details
    if isinstance(last, UploadProgress):
        return last
    try:
        return UploadProgress.model_validate(last)
    except ValueError:
        return None


def upload_checkpoint_sync(
    request: UploadCheckpointRequest,
    tracker: UploadTracker,
    cancel: threading.Event | None = None,
) -> UploadResult:
    """The whole upload (see the module docstring); blocking."""
    cancel = cancel or threading.Event()
    started = time.monotonic()
    spec = request.checkpoints
    if spec.durable_uri is None:
        raise CheckpointInputError("checkpoints.durable_uri is not set: nowhere to upload to")
    source = Path(request.checkpoint.path)
    name = source.name
    local = verify_directory(source, step=request.checkpoint.step, hashes=spec.verify_hashes)
    if not local.ok:
        raise CheckpointCorrupt(str(source), local.problems)
    manifest_bytes = (source / MANIFEST).read_bytes()
    marker_bytes = (source / COMMIT_MARKER).read_bytes()
    files: dict[str, dict[str, Any]] = json.loads(manifest_bytes)["files"]
    tracker.bytes_total = sum(int(e["size"]) for e in files.values())
    store = durable_store(spec)
    assert store is not None
    job_id = json.loads(manifest_bytes).get("job_id")
    owner = owner_problem(store, name, job_id if isinstance(job_id, str) else None)
    if owner is not None and store.stat(name, COMMIT_MARKER) is not None:
        # Never overwrite, nor count as uploaded, another job's durable copy.
        raise CheckpointInputError(
            f"{store.location(name)}: {owner}, not by {job_id}: give each job its own "
            "checkpoints.durable_uri (e.g. s3://bucket/{job_id})"
        )
    if isinstance(store, S3Store):
        skipped = _upload_s3(
            store,
            source,
            name,
            files,
            tracker,
            cancel,
            spec.upload_part_size_mb,
            spec.upload_concurrency,
        )
        tracker.phase = "committing"
        _check_cancel(cancel)
        store.put_bytes(name, MANIFEST, manifest_bytes, hashlib.sha256(manifest_bytes).hexdigest())
        remote = verify_in_store(store, name, "metadata", require_marker=False)
        if not remote.ok:
            raise CheckpointCorrupt(remote.path, remote.problems)
        store.put_bytes(name, COMMIT_MARKER, marker_bytes)
    else:
        assert isinstance(store, LocalStore)
        skipped = _upload_local(store, source, name, files, tracker, cancel, spec.verify_hashes)
        tracker.phase = "committing"
        store.put_file(name, MANIFEST, source / MANIFEST)
        level: Level = "hashes" if spec.verify_hashes else "sizes"
        remote = verify_in_store(store, name, level, require_marker=False)
        if not remote.ok:
            raise CheckpointCorrupt(remote.path, remote.problems)
        store.put_file(name, COMMIT_MARKER, source / COMMIT_MARKER)
    tracker.phase = "done"
    return UploadResult(
        step=request.checkpoint.step,
        uri=store.location(name),
        files=len(files),
        size_bytes=tracker.bytes_total,
        bytes_sent=tracker.bytes_sent,
        skipped_files=skipped,
        seconds=round(time.monotonic() - started, 3),
        verified=True,
    )


def _check_cancel(cancel: threading.Event) -> None:
    if cancel.is_set():
        raise UploadCancelled("upload cancelled")


def _upload_local(
    store: LocalStore,
    source: Path,
    name: str,
    files: dict[str, dict[str, Any]],
    tracker: UploadTracker,
    cancel: threading.Event,
    hashes: bool,
) -> int:
    tracker.phase = "uploading"
    if store.stat(name, COMMIT_MARKER) is not None:
        existing = verify_in_store(store, name, "hashes" if hashes else "sizes")
        if existing.ok:
            for rel, entry in files.items():
                tracker.file_done(rel, int(entry["size"]), sent=False)
            return len(files)
        (store.path / name / COMMIT_MARKER).unlink(missing_ok=True)
    skipped = 0
    for rel, entry in sorted(files.items()):
        _check_cancel(cancel)
        size, sha = int(entry["size"]), entry.get("sha256")
        target = store.path / name / rel
        if (
            target.is_file()
            and target.stat().st_size == size
            and (not hashes or sha is None or file_sha256(target) == sha)
        ):
            tracker.file_done(rel, size, sent=False)
            skipped += 1
            continue
        store.put_file(name, rel, source / rel)
        tracker.file_done(rel, size, sent=True)
    return skipped


@dataclass(frozen=True)
class _Part:
    relpath: str
    upload_id: str
    number: int
    offset: int
    length: int
    known_etag: str | None
    """An ETag S3 already holds for this part (from a previous attempt): checked
    against the local bytes and sent again only if they differ."""


def _upload_s3(
    store: S3Store,
    source: Path,
    name: str,
    files: dict[str, dict[str, Any]],
    tracker: UploadTracker,
    cancel: threading.Event,
    part_size_mb: int,
    concurrency: int,
) -> int:
    tracker.phase = "uploading"
    if store.stat(name, COMMIT_MARKER) is not None:
        existing = verify_in_store(store, name, "metadata")
        if existing.ok:
            for rel, entry in files.items():
                tracker.file_done(rel, int(entry["size"]), sent=False)
            return len(files)
        # A broken durable copy must stop counting before it is repaired.
        store.delete_object(name, COMMIT_MARKER)
    small: list[str] = []
    parts: list[_Part] = []
    multipart: dict[str, tuple[str, int]] = {}
    skipped = 0
    for rel, entry in sorted(files.items()):
        _check_cancel(cancel)
        size, sha = int(entry["size"]), entry.get("sha256")
        info = store.stat(name, rel)
        if info is not None and info.size == size and (sha is None or info.sha256 == sha):
            tracker.file_done(rel, size, sent=False)
            skipped += 1
            continue
        tracker.forget_file(rel)
        part_size = max(part_size_mb * MIB, math.ceil(size / MAX_PARTS))
        if size <= part_size:
            small.append(rel)
            continue
        count = math.ceil(size / part_size)
        upload_id = tracker.upload_ids.get(rel)
        held = store.list_parts(name, rel, upload_id) if upload_id else None
        if upload_id is None or held is None:
            upload_id = store.create_multipart(name, rel, sha)
            tracker.started(rel, upload_id)
            held = {}
        multipart[rel] = (upload_id, count)
        for number in range(1, count + 1):
            offset = (number - 1) * part_size
            length = min(part_size, size - offset)
            etag_and_size = held.get(number)
            known = etag_and_size[0] if etag_and_size and etag_and_size[1] == length else None
            parts.append(_Part(rel, upload_id, number, offset, length, known))

    etags: dict[str, dict[int, str]] = {rel: {} for rel in multipart}
    small_etags: dict[str, str] = {}
    lock = threading.Lock()

    def put_small(rel: str) -> None:
        _check_cancel(cancel)
        data = (source / rel).read_bytes()
        etag = store.put_bytes(name, rel, data, files[rel].get("sha256"))
        expected = hashlib.md5(data, usedforsecurity=False).hexdigest()
        with lock:
            small_etags[rel] = expected if etag == expected else f"mismatch:{etag}"
        tracker.file_done(rel, len(data), sent=True)

    def put_part(part: _Part) -> None:
        _check_cancel(cancel)
        with open(source / part.relpath, "rb") as handle:
            handle.seek(part.offset)
            data = handle.read(part.length)
        md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
        sent = part.known_etag != md5
        if sent:
            etag = store.upload_part(name, part.relpath, part.upload_id, part.number, data)
            if etag != md5:
                raise RuntimeError(
                    f"{store.location(name, part.relpath)}: part {part.number}: "
                    f"S3 acknowledged ETag {etag}, the local md5 is {md5}"
                )
        with lock:
            etags[part.relpath][part.number] = md5
        tracker.part_done(part.relpath, part.number, md5, part.length, sent)

    work: list[Any] = [*small, *parts]
    if work:
        with ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix="lazarus-upload"
        ) as pool:
            futures: list[Future[None]] = [
                pool.submit(put_small, item)
                if isinstance(item, str)
                else pool.submit(put_part, item)
                for item in work
            ]
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f.exception() for f in done if f.exception() is not None]
            if failed:
                for future in pending:
                    future.cancel()  # queued parts never start; running ones finish
                wait(pending)
                assert failed[0] is not None
                raise failed[0]

    tracker.phase = "completing"
    for rel, (upload_id, count) in multipart.items():
        _check_cancel(cancel)
        md5s = etags[rel]
        store.complete_multipart(name, rel, upload_id, md5s)
        tracker.file_done(rel, int(files[rel]["size"]), sent=False, counted=True)
        _check_remote(
            store, name, rel, files[rel], multipart_etag([md5s[n] for n in range(1, count + 1)])
        )
    for rel, expected_etag in small_etags.items():
        _check_remote(store, name, rel, files[rel], expected_etag)
    return skipped


def _check_remote(
    store: S3Store, name: str, rel: str, entry: dict[str, Any], expected_etag: str
) -> None:
    info = store.stat(name, rel)
    where = store.location(name, rel)
    problems: list[str] = []
    if info is None:
        problems.append("missing after upload")
    else:
        if info.size != int(entry["size"]):
            problems.append(f"size {info.size} after upload, the manifest says {entry['size']}")
        if entry.get("sha256") and info.sha256 != entry["sha256"]:
            problems.append("sha256 metadata differs from the manifest")
        if not info.kms and info.etag != expected_etag:
            problems.append(f"ETag {info.etag}, expected {expected_etag} from the local bytes")
    if problems:
        # Drop the object so the retry uploads it again rather than trusting it.
        store.delete_object(name, rel)
        raise RuntimeError(f"{where}: " + "; ".join(problems))


@activity.defn(name="upload_checkpoint")
async def upload_checkpoint(request: UploadCheckpointRequest) -> UploadResult:
    """Copy one committed, verified local checkpoint to ``checkpoints.durable_uri``.

    Heartbeats :class:`UploadProgress` (give it a heartbeat timeout of ~30 s and
    a retry policy without a low attempt cap: outages are waited out, training
    never waits for this). A corrupt local checkpoint fails it for good
    (``CheckpointCorrupt``, non-retryable); a store that cannot be reached fails
    it with ``DurableStoreUnavailable`` (retryable)."""
    spec = request.checkpoints
    if spec.durable_uri is None:
        raise ApplicationError(
            "checkpoints.durable_uri is not set", type="NoDurableStore", non_retryable=True
        )
    name = Path(request.checkpoint.path).name
    tracker = UploadTracker(
        request.checkpoint.step,
        durable_location(spec.durable_uri, name),
        resume_details(activity.info().heartbeat_details),
    )
    cancel = threading.Event()
    with as_activity_errors(f"durable store {spec.durable_uri} unavailable"):
        result = await in_thread_heartbeating(
            lambda: upload_checkpoint_sync(request, tracker, cancel),
            tracker.snapshot,
            cancel=cancel,
        )
    observe("checkpoint_upload", result.seconds, size_bytes=result.bytes_sent)
    return result
