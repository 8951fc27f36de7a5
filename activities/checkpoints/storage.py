"""Where checkpoints live: a local or shared filesystem, or S3 (and S3-compatible stores).

Both backends present one shape: a *root* holding ``step-NNNNNNNN`` checkpoints,
each a set of files addressed by their path relative to the step (``state.pt``,
``shard/0.pt``, ``manifest.json``, ``COMMITTED``). Verification, tiering,
restore, retention and listing are written once against :class:`CheckpointStore`.

S3 credentials come only from the standard AWS chain (environment variables,
``~/.aws``, instance or pod roles); nothing here accepts a key. ``endpoint_url``
selects an S3-compatible store, and ``AWS_ENDPOINT_URL``/``AWS_ENDPOINT_URL_S3``
work too when it is not given.

No temporalio here: this is plain I/O, used by activities and the CLI alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lazarus.domain.checkpoint_layout import (
    COMMIT_MARKER,
    MANIFEST,
    TEMP_SUFFIX,
    fsync_directory,
    parse_step_dir,
    resolves_inside,
)

CHUNK_BYTES = 8 << 20
"""Read size for hashing and copying: large enough to amortise syscalls."""
SHA256_METADATA = "sha256"
"""S3 user metadata key (``x-amz-meta-sha256``) holding a file's manifest sha256."""


class CheckpointInputError(ValueError):
    """A path or URI that names nothing usable (bad input, not a corrupt checkpoint)."""


class DurableStoreUnavailable(RuntimeError):
    """The durable store could not be reached or refused a request; worth retrying."""


class CheckpointCorrupt(RuntimeError):
    """A checkpoint failed verification; retrying the same copy will not help."""

    def __init__(self, location: str, problems: list[str]) -> None:
        super().__init__(f"{location}: " + "; ".join(problems))
        self.location = location
        self.problems = problems


@dataclass(frozen=True)
class ObjectInfo:
    size: int
    sha256: str | None = None
    """The sha256 recorded as S3 metadata at upload (None on filesystems)."""
    etag: str | None = None
    kms: bool = False
    """Server-side KMS encryption: the ETag is then not an MD5 of the content."""
    mtime: float | None = None


def is_s3_uri(target: str) -> bool:
    return target.startswith("s3://")


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` -> ``("bucket", "a/b")``."""
    if not is_s3_uri(uri):
        raise CheckpointInputError(f"{uri}: not an s3:// URI")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise CheckpointInputError(f"{uri}: an s3 URI needs a bucket: s3://bucket/prefix")
    return bucket, prefix.strip("/")


class CheckpointStore(ABC):
    """A root of ``step-NNNNNNNN`` checkpoints."""

    root: str

    @abstractmethod
    def location(self, name: str, relpath: str = "") -> str:
        """A printable address: a path or an ``s3://`` URI."""

    @abstractmethod
    def list_names(self) -> list[str]:
        """Every checkpoint name under the root (committed or not), unsorted."""

    @abstractmethod
    def exists(self, name: str) -> bool:
        """Anything at all is stored under this checkpoint name."""

    @abstractmethod
    def read_small(self, name: str, relpath: str) -> bytes | None:
        """A small file's bytes (manifest, marker), or None if it is missing."""

    @abstractmethod
    def stat(self, name: str, relpath: str) -> ObjectInfo | None:
        """Size and metadata of one file, or None if it is missing."""

    @abstractmethod
    def list_files(self, name: str) -> dict[str, int]:
        """Every file of a checkpoint (relative path to size), unfinished writes excluded."""

    @abstractmethod
    def iter_chunks(self, name: str, relpath: str) -> Iterator[bytes]:
        """A file's content, in chunks, for hashing."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Remove a checkpoint, its commit marker first, so a half-finished delete
        leaves an uncommitted directory rather than a committed torn one."""

    def escapes(self, name: str, relpath: str) -> bool:
        """``relpath`` of checkpoint ``name`` leads outside it (only a filesystem's
        symlinks can; object keys are literal)."""
        return False

    def steps(self) -> list[tuple[int, str]]:
        """``(step, name)`` of every checkpoint, oldest first."""
        found = [(step, n) for n in self.list_names() if (step := parse_step_dir(n)) is not None]
        return sorted(found)

    def sha256(self, name: str, relpath: str) -> str:
        digest = hashlib.sha256()
        for chunk in self.iter_chunks(name, relpath):
            digest.update(chunk)
        return digest.hexdigest()


# --------------------------------------------------------------------------- filesystem


class LocalStore(CheckpointStore):
    """A directory on a local or shared (NFS, Lustre, ...) filesystem."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.path = Path(root)
        self.root = str(self.path)

    def location(self, name: str, relpath: str = "") -> str:
        target = self.path / name
        return str(target / relpath) if relpath else str(target)

    def list_names(self) -> list[str]:
        if not self.path.is_dir():
            return []
        return [c.name for c in self.path.iterdir() if c.is_dir() and parse_step_dir(c.name)]

    def exists(self, name: str) -> bool:
        return (self.path / name).is_dir()

    def escapes(self, name: str, relpath: str) -> bool:
        return not resolves_inside(self.path / name, relpath)

    def read_small(self, name: str, relpath: str) -> bytes | None:
        try:
            return (self.path / name / relpath).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def stat(self, name: str, relpath: str) -> ObjectInfo | None:
        try:
            st = (self.path / name / relpath).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return ObjectInfo(size=st.st_size, mtime=st.st_mtime)

    def list_files(self, name: str) -> dict[str, int]:
        base = self.path / name
        return {
            f.relative_to(base).as_posix(): f.stat().st_size
            for f in base.rglob("*")
            if f.is_file() and not f.name.endswith(TEMP_SUFFIX)
        }

    def iter_chunks(self, name: str, relpath: str) -> Iterator[bytes]:
        with open(self.path / name / relpath, "rb") as handle:
            while chunk := handle.read(CHUNK_BYTES):
                yield chunk

    def sha256(self, name: str, relpath: str) -> str:
        return file_sha256(self.path / name / relpath)

    def delete(self, name: str) -> None:
        target = self.path / name
        with contextlib.suppress(FileNotFoundError):
            (target / COMMIT_MARKER).unlink()
        if target.exists():
            shutil.rmtree(target)

    def put_file(self, name: str, relpath: str, source: Path) -> None:
        """Copy ``source`` in durably: temp name, fsync, rename, fsync the directory."""
        target = self.path / name / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(
            f".{target.name}.{os.getpid()}.{threading.get_ident()}{TEMP_SUFFIX}"
        )
        try:
            with open(source, "rb") as src, open(temp, "wb") as dst:
                shutil.copyfileobj(src, dst, CHUNK_BYTES)
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(temp, target)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        fsync_directory(target.parent)


def file_sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


# --------------------------------------------------------------------------- S3


def s3_client(
    endpoint_url: str | None = None,
    region: str | None = None,
    *,
    max_connections: int = 10,
    max_attempts: int = 3,
    connect_timeout_s: float = 5.0,
    read_timeout_s: float = 60.0,
) -> Any:
    """A boto3 S3 client using the standard credential chain only. Path-style
    addressing with a custom endpoint (what MinIO, Ceph and moto expect)."""
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"max_attempts": max_attempts, "mode": "standard"},
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        max_pool_connections=max(10, max_connections),
        s3={"addressing_style": "path"} if endpoint_url else {},
    )
    session = boto3.session.Session()
    return session.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)


def store_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean the durable store is unavailable (retry later)."""
    from botocore.exceptions import BotoCoreError, ClientError

    return (BotoCoreError, ClientError, DurableStoreUnavailable)


def _client_error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def is_not_found(exc: BaseException) -> bool:
    return _client_error_code(exc) in ("404", "NoSuchKey", "NotFound", "NoSuchUpload")


class S3Store(CheckpointStore):
    """``s3://bucket/prefix``: checkpoint ``step-N`` is every key under ``prefix/step-N/``."""

    def __init__(self, uri: str, client: Any) -> None:
        self.bucket, self.prefix = split_s3_uri(uri)
        self.root = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self.client = client

    def key(self, name: str, relpath: str = "") -> str:
        parts = [p for p in (self.prefix, name, relpath) if p]
        return "/".join(parts)

    def location(self, name: str, relpath: str = "") -> str:
        return f"s3://{self.bucket}/{self.key(name, relpath)}"

    def _paginate(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        paginator = self.client.get_paginator("list_objects_v2")
        yield from paginator.paginate(Bucket=self.bucket, **kwargs)

    def list_names(self) -> list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        names: list[str] = []
        for page in self._paginate(Prefix=base, Delimiter="/"):
            for common in page.get("CommonPrefixes", []):
                name = str(common["Prefix"])[len(base) :].rstrip("/")
                if parse_step_dir(name) is not None:
                    names.append(name)
        return names

    def exists(self, name: str) -> bool:
        response = self.client.list_objects_v2(
            Bucket=self.bucket, Prefix=self.key(name) + "/", MaxKeys=1
        )
        return bool(response.get("KeyCount", 0))

    def read_small(self, name: str, relpath: str) -> bytes | None:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self.key(name, relpath))
        except store_errors() as exc:
            if is_not_found(exc):
                return None
            raise
        return bytes(response["Body"].read())

    def stat(self, name: str, relpath: str) -> ObjectInfo | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.key(name, relpath))
        except store_errors() as exc:
            if is_not_found(exc):
                return None
            raise
        metadata = head.get("Metadata") or {}
        modified = head.get("LastModified")
        return ObjectInfo(
            size=int(head["ContentLength"]),
            sha256=metadata.get(SHA256_METADATA),
            etag=str(head.get("ETag", "")).strip('"') or None,
            kms=head.get("ServerSideEncryption") == "aws:kms",
            mtime=modified.timestamp() if modified is not None else None,
        )

    def list_files(self, name: str) -> dict[str, int]:
        base = self.key(name) + "/"
        return {
            str(item["Key"])[len(base) :]: int(item["Size"])
            for page in self._paginate(Prefix=base)
            for item in page.get("Contents", [])
        }

    def iter_chunks(self, name: str, relpath: str) -> Iterator[bytes]:
        response = self.client.get_object(Bucket=self.bucket, Key=self.key(name, relpath))
        body = response["Body"]
        try:
            while chunk := body.read(CHUNK_BYTES):
                yield bytes(chunk)
        finally:
            body.close()

    def delete(self, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.key(name, COMMIT_MARKER))
        keys = [self.key(name, rel) for rel in self.list_files(name)]
        for start in range(0, len(keys), 1000):
            batch = keys[start : start + 1000]
            self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
            )

    def put_bytes(self, name: str, relpath: str, data: bytes, sha256: str | None = None) -> str:
        """One PUT with Content-MD5 (S3 refuses the object if the bytes changed in
        transit); returns the ETag."""
        response = self.client.put_object(
            Bucket=self.bucket,
            Key=self.key(name, relpath),
            Body=data,
            ContentMD5=md5_base64(data),
            Metadata={SHA256_METADATA: sha256} if sha256 else {},
        )
        return str(response.get("ETag", "")).strip('"')

    def create_multipart(self, name: str, relpath: str, sha256: str | None) -> str:
        response = self.client.create_multipart_upload(
            Bucket=self.bucket,
            Key=self.key(name, relpath),
            Metadata={SHA256_METADATA: sha256} if sha256 else {},
        )
        return str(response["UploadId"])

    def upload_part(self, name: str, relpath: str, upload_id: str, number: int, data: bytes) -> str:
        """Send one part with Content-MD5 (S3 rejects it if the bytes changed in
        transit); returns its ETag."""
        response = self.client.upload_part(
            Bucket=self.bucket,
            Key=self.key(name, relpath),
            UploadId=upload_id,
            PartNumber=number,
            Body=data,
            ContentMD5=md5_base64(data),
        )
        return str(response["ETag"]).strip('"')

    def list_parts(
        self, name: str, relpath: str, upload_id: str
    ) -> dict[int, tuple[str, int]] | None:
        """Parts S3 holds for an unfinished upload (number to ETag and size), or
        None if the upload no longer exists (completed, aborted or expired)."""
        parts: dict[int, tuple[str, int]] = {}
        marker = 0
        while True:
            try:
                response = self.client.list_parts(
                    Bucket=self.bucket,
                    Key=self.key(name, relpath),
                    UploadId=upload_id,
                    PartNumberMarker=marker,
                )
            except store_errors() as exc:
                if is_not_found(exc):
                    return None
                raise
            for part in response.get("Parts", []):
                parts[int(part["PartNumber"])] = (str(part["ETag"]).strip('"'), int(part["Size"]))
            if not response.get("IsTruncated"):
                return parts
            marker = int(response["NextPartNumberMarker"])

    def complete_multipart(
        self, name: str, relpath: str, upload_id: str, etags: dict[int, str]
    ) -> None:
        self.client.complete_multipart_upload(
            Bucket=self.bucket,
            Key=self.key(name, relpath),
            UploadId=upload_id,
            MultipartUpload={
                "Parts": [{"PartNumber": n, "ETag": f'"{etags[n]}"'} for n in sorted(etags)]
            },
        )

    def abort_multipart(self, name: str, relpath: str, upload_id: str) -> None:
        with contextlib.suppress(*store_errors()):
            self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=self.key(name, relpath), UploadId=upload_id
            )

    def delete_object(self, name: str, relpath: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.key(name, relpath))


def multipart_etag(part_md5_hex: list[str]) -> str:
    """The ETag S3 gives a multipart object: md5 of the parts' binary md5s, ``-N``."""
    joined = b"".join(bytes.fromhex(h) for h in part_md5_hex)
    return f"{hashlib.md5(joined, usedforsecurity=False).hexdigest()}-{len(part_md5_hex)}"


def md5_base64(data: bytes) -> str:
    import base64

    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


# --------------------------------------------------------------------------- opening


def open_store(
    uri: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    max_connections: int = 10,
    max_attempts: int = 3,
) -> CheckpointStore:
    """The store for a root: ``s3://bucket/prefix`` or a filesystem path."""
    if is_s3_uri(uri):
        client = s3_client(
            endpoint_url, region, max_connections=max_connections, max_attempts=max_attempts
        )
        return S3Store(uri, client)
    if "://" in uri:
        raise CheckpointInputError(
            f"{uri}: unsupported scheme; use s3://bucket/prefix or a filesystem path"
        )
    return LocalStore(uri)


def locate(
    target: str, *, endpoint_url: str | None = None, region: str | None = None
) -> tuple[CheckpointStore, str | None]:
    """Split a user's target into ``(store, checkpoint name)``: a target whose last
    segment is ``step-NNNNNNNN`` names one checkpoint, anything else a root
    (name None). Raises :class:`CheckpointInputError` for a local path that does
    not exist."""
    stripped = target.rstrip("/")
    if is_s3_uri(stripped):
        bucket, prefix = split_s3_uri(stripped)
        head, _, last = prefix.rpartition("/")
        if parse_step_dir(last) is not None:
            root = f"s3://{bucket}/{head}" if head else f"s3://{bucket}"
            return open_store(root, endpoint_url=endpoint_url, region=region), last
        return open_store(stripped, endpoint_url=endpoint_url, region=region), None
    path = Path(target).expanduser()
    if not path.exists():
        raise CheckpointInputError(f"{target}: no such file or directory")
    if not path.is_dir():
        raise CheckpointInputError(f"{target}: not a directory (give a checkpoint or its root)")
    path = path.resolve()
    is_step = parse_step_dir(path.name) is not None
    is_checkpoint = is_step or (path / MANIFEST).exists() or (path / COMMIT_MARKER).exists()
    if is_checkpoint:
        return LocalStore(path.parent), path.name
    return LocalStore(path), None
