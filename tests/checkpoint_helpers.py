"""Shared by the checkpoint tests: writing real committed checkpoints, and a moto
S3 server on loopback that can be stopped and restarted on the same port."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import lazarus.rank as lz
from activities.checkpoints import upload_checkpoint_sync
from activities.checkpoints.tiering import UploadTracker
from lazarus.domain import environment
from lazarus.domain.contracts import CheckpointRef, UploadCheckpointRequest, UploadResult
from lazarus.domain.ports import free_port
from lazarus.domain.spec import CheckpointsSpec
from lazarus.rank import reset

BUCKET = "lazarus-test"


def write_checkpoint(
    root: Path,
    step: int,
    files: dict[str, int] | None = None,
    *,
    seed: int = 0,
    hash_files: bool = True,
) -> Path:
    """A checkpoint committed by the real rank helper: ``files`` maps names to sizes."""
    files = files if files is not None else {"state.pt": 64 * 1024}
    reset._reset_state()
    lz.configure(checkpoint_dir=root)
    directory = lz.checkpoint_path(step)
    for index, (name, size) in enumerate(sorted(files.items())):
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(pattern(size, seed + step * 31 + index))
    lz.commit_checkpoint(step, hash_files=hash_files)
    reset._reset_state()
    return directory


def pattern(size: int, seed: int) -> bytes:
    """Deterministic, non-repeating-ish bytes (distinct parts get distinct md5s)."""
    block = bytes((seed * 7 + i * 13) % 251 for i in range(4096))
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += counter.to_bytes(8, "little") + block
        counter += 1
    return bytes(out[:size])


def flip_byte(path: Path, offset: int = 100) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


@pytest.fixture
def clean_rank_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith("LAZARUS_") or name in (environment.RANK, environment.WORLD_SIZE):
            monkeypatch.delenv(name, raising=False)
    reset._reset_state()
    yield
    reset._reset_state()


class MotoS3:
    """moto's S3 in server mode on 127.0.0.1, in this process: its state lives in
    moto's backends, so a stop/start on the same port is an outage, not a wipe."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"
        self._server: object | None = None

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        server.start()
        self._server = server

    def stop(self) -> None:
        server = self._server
        if server is None:
            return
        self._server = None
        server.stop()  # type: ignore[attr-defined]
        inner = server._server  # type: ignore[attr-defined]
        if inner is not None:
            inner.server_close()  # refuse connections, as a dead endpoint does

    @property
    def running(self) -> bool:
        return self._server is not None


@pytest.fixture
def moto_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoS3]:
    """A fresh moto S3 endpoint with bucket ``lazarus-test``; fake credentials only."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    server = MotoS3(free_port())
    server.start()
    try:
        import boto3

        client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.stop()
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        # Forget this test's buckets: moto's backends are process-wide.
        s3_backends[DEFAULT_ACCOUNT_ID]["global"].reset()


def spec_for(server: MotoS3, prefix: str = "jobs/demo", **extra: Any) -> CheckpointsSpec:
    """The checkpoints spec of a job tiering to ``prefix`` in the moto bucket, in
    5 MiB parts."""
    return CheckpointsSpec(
        durable_uri=f"s3://{BUCKET}/{prefix}",
        endpoint_url=server.endpoint,
        upload_part_size_mb=5,
        upload_concurrency=extra.pop("upload_concurrency", 4),
        **extra,
    )


def upload(path: Path, step: int, spec: CheckpointsSpec) -> UploadResult:
    """Upload one committed checkpoint directory, as the tiering activity does."""
    request = UploadCheckpointRequest(
        checkpoint=CheckpointRef(step=step, path=str(path)), checkpoints=spec
    )
    return upload_checkpoint_sync(request, UploadTracker(step, f"{spec.durable_uri}/{path.name}"))


def s3_keys(server: MotoS3, prefix: str) -> list[str]:
    """Every key under ``prefix`` in the moto bucket, sorted."""
    import boto3

    client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return sorted(item["Key"] for item in listed.get("Contents", []))
