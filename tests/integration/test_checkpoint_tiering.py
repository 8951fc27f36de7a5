"""Tiering checkpoints to S3 (moto's server on loopback): upload, outage, resume,
restore, the durable search and retention."""

from __future__ import annotations

import dataclasses
import shutil
import threading
from pathlib import Path
from typing import Any

import boto3
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.checkpoints import (
    collect_garbage_sync,
    restore_checkpoint,
    search_verified,
    upload_checkpoint,
    upload_checkpoint_sync,
    verify_checkpoint,
)
from activities.checkpoints.listing import list_checkpoints
from activities.checkpoints.storage import S3Store
from activities.checkpoints.tiering import UploadTracker
from lazarus.domain.checkpoint_layout import COMMIT_MARKER
from lazarus.domain.contracts import (
    CheckpointRef,
    FindVerifiedCheckpointRequest,
    GarbageCollectionRequest,
    RestoreCheckpointRequest,
    UploadCheckpointRequest,
    UploadProgress,
)
from tests.checkpoint_helpers import (
    BUCKET,
    MotoS3,
    clean_rank_env,
    flip_byte,
    moto_s3,
    s3_keys,
    spec_for,
    upload,
    write_checkpoint,
)

pytestmark = pytest.mark.usefixtures("clean_rank_env")
__all__ = ["clean_rank_env", "moto_s3"]

MIB = 1 << 20
BIG = {"state.pt": 26 * MIB, "optim.pt": 3 * MIB, "meta/extra.json": 1000}
"""state.pt is 6 parts of 5 MiB (the last one 1 MiB); the others single PUTs."""
ORIGINAL_UPLOAD_PART = S3Store.upload_part


def count_parts(monkeypatch: pytest.MonkeyPatch, fail_after: int | None = None) -> list[int]:
    """Record every part sent; optionally raise after ``fail_after`` of them."""
    sent: list[int] = []
    lock = threading.Lock()
    real = ORIGINAL_UPLOAD_PART

    def counting(self: S3Store, name: str, rel: str, upload_id: str, n: int, data: bytes) -> str:
        with lock:
            if fail_after is not None and len(sent) >= fail_after:
                raise ConnectionError("simulated worker crash")
        etag = real(self, name, rel, upload_id, n, data)
        with lock:
            sent.append(n)
        return etag

    monkeypatch.setattr(S3Store, "upload_part", counting)
    return sent


def test_upload_then_verify_remote(tmp_path: Path, moto_s3: MotoS3) -> None:
    path = write_checkpoint(tmp_path / "ckpt", 20, BIG)
    spec = spec_for(moto_s3)
    result = upload(path, 20, spec)
    assert result.verified and result.files == 3 and result.skipped_files == 0
    assert result.bytes_sent == result.size_bytes == sum(BIG.values())
    assert result.uri == f"s3://{BUCKET}/jobs/demo/step-00000020"
    assert s3_keys(moto_s3, "jobs/demo/") == [
        f"jobs/demo/step-00000020/{n}"
        for n in ("COMMITTED", "manifest.json", "meta/extra.json", "optim.pt", "state.pt")
    ]
    remote = verify_checkpoint(result.uri, endpoint_url=moto_s3.endpoint)  # downloads, hashes
    assert remote.ok and remote.hashed, remote.problems
    # Idempotent: a second upload sends nothing.
    again = upload(path, 20, spec)
    assert again.bytes_sent == 0 and again.skipped_files == 3


def test_remote_corruption_is_found(tmp_path: Path, moto_s3: MotoS3) -> None:
    path = write_checkpoint(tmp_path / "ckpt", 20, {"state.pt": 10_000})
    result = upload(path, 20, spec_for(moto_s3))
    client = boto3.client("s3", endpoint_url=moto_s3.endpoint, region_name="us-east-1")
    key = "jobs/demo/step-00000020/state.pt"
    body = bytearray(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    body[5] ^= 0xFF
    client.put_object(Bucket=BUCKET, Key=key, Body=bytes(body))
    remote = verify_checkpoint(result.uri, endpoint_url=moto_s3.endpoint)
    assert not remote.ok
    assert remote.problems[0].startswith("state.pt: sha256 mismatch")


def test_s3_outage_mid_upload_then_retry_completes(tmp_path: Path, moto_s3: MotoS3) -> None:
    path = write_checkpoint(tmp_path / "ckpt", 30, BIG)
    spec = spec_for(moto_s3, upload_concurrency=1)
    request = UploadCheckpointRequest(
        checkpoint=CheckpointRef(step=30, path=str(path)), checkpoints=spec
    )
    tracker = UploadTracker(30, f"{spec.durable_uri}/step-00000030")
    real = S3Store.upload_part
    calls = 0

    def outage_after_two(self: S3Store, *args: Any) -> str:
        nonlocal calls
        calls += 1
        if calls == 3 and moto_s3.running:
            moto_s3.stop()  # the endpoint dies mid-upload
        return real(self, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(S3Store, "upload_part", outage_after_two)
        with pytest.raises(Exception, match=r"(?i)connect"):
            upload_checkpoint_sync(request, tracker)
    state = tracker.snapshot()
    assert "state.pt" in state.multipart and "state.pt" not in state.done_files
    moto_s3.start()  # back on the same port, with what it had
    retried = upload_checkpoint_sync(request, UploadTracker(30, tracker.uri, state))
    assert retried.verified and retried.bytes_sent < retried.size_bytes
    assert verify_checkpoint(retried.uri, endpoint_url=moto_s3.endpoint).ok


async def test_resume_after_worker_crash_skips_sent_parts(
    tmp_path: Path, moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_checkpoint(tmp_path / "ckpt", 40, {"state.pt": 26 * MIB})
    request = UploadCheckpointRequest(
        checkpoint=CheckpointRef(step=40, path=str(path)),
        checkpoints=spec_for(moto_s3, upload_concurrency=1),
    )
    first = count_parts(monkeypatch, fail_after=3)
    beats: list[Any] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details)
    with pytest.raises(ConnectionError, match="simulated worker crash"):
        await env.run(upload_checkpoint, request)
    assert sorted(first) == [1, 2, 3]
    last = beats[-1][0]
    assert isinstance(last, UploadProgress)
    assert sorted(last.multipart["state.pt"].parts) == [1, 2, 3]

    second = count_parts(monkeypatch)
    retry = ActivityEnvironment()
    # What Temporal hands the next attempt: the last heartbeat, as plain data.
    retry.info = dataclasses.replace(
        retry.info, attempt=2, heartbeat_details=[last.model_dump(mode="json")]
    )
    result = await retry.run(upload_checkpoint, request)
    assert sorted(second) == [4, 5, 6]  # parts 1-3 were not sent again
    assert result.verified and result.bytes_sent == 26 * MIB - 3 * 5 * MIB
    assert verify_checkpoint(result.uri, endpoint_url=moto_s3.endpoint).ok


async def test_corrupt_local_checkpoint_is_not_uploaded(tmp_path: Path, moto_s3: MotoS3) -> None:
    path = write_checkpoint(tmp_path / "ckpt", 50, {"state.pt": 10_000})
    flip_byte(path / "state.pt")
    request = UploadCheckpointRequest(
        checkpoint=CheckpointRef(step=50, path=str(path)), checkpoints=spec_for(moto_s3)
    )
    with pytest.raises(ApplicationError) as failed:
        await ActivityEnvironment().run(upload_checkpoint, request)
    assert failed.value.type == "CheckpointCorrupt" and failed.value.non_retryable
    assert s3_keys(moto_s3, "jobs/") == []


async def test_restore_into_an_empty_dir_and_search(tmp_path: Path, moto_s3: MotoS3) -> None:
    local = tmp_path / "ckpt"
    spec = spec_for(moto_s3)
    for step in (10, 20):
        upload(write_checkpoint(local, step, BIG), step, spec)
    flip_byte(local / "step-00000020" / "state.pt")  # the local copy rots
    found = search_verified(
        FindVerifiedCheckpointRequest(checkpoint_dir=str(local), checkpoints=spec)
    )
    assert found.chosen is not None and found.chosen.step == 20 and found.location == "durable"
    assert [(s.step, s.location) for s in found.skipped] == [(20, "local")]

    spare = tmp_path / "spare"  # a node that never saw these checkpoints
    ref = await ActivityEnvironment().run(
        restore_checkpoint,
        RestoreCheckpointRequest(
            uri=found.chosen.path, checkpoint_dir=str(spare), checkpoints=spec
        ),
    )
    assert ref == CheckpointRef(step=20, path=str(spare / "step-00000020"))
    assert verify_checkpoint(ref.path).ok
    assert sorted(p.name for p in spare.iterdir()) == ["step-00000020"]  # no temp left


def test_search_ignores_an_unreachable_store(tmp_path: Path, moto_s3: MotoS3) -> None:
    local = tmp_path / "ckpt"
    write_checkpoint(local, 10)
    spec = spec_for(moto_s3)
    moto_s3.stop()
    found = search_verified(
        FindVerifiedCheckpointRequest(checkpoint_dir=str(local), checkpoints=spec)
    )
    assert found.chosen is not None and found.chosen.step == 10
    assert found.durable_unavailable is not None


def test_durable_gc_and_listing(tmp_path: Path, moto_s3: MotoS3) -> None:
    local = tmp_path / "ckpt"
    spec = spec_for(moto_s3, keep_local=1, keep_durable=2)
    for step in (10, 20, 30):
        upload(write_checkpoint(local, step), step, spec)
    # An abandoned upload (no marker) newer than everything: kept, not trusted.
    client = boto3.client("s3", endpoint_url=moto_s3.endpoint, region_name="us-east-1")
    client.put_object(Bucket=BUCKET, Key="jobs/demo/step-00000040/state.pt", Body=b"x")
    result = collect_garbage_sync(
        GarbageCollectionRequest(checkpoint_dir=str(local), checkpoints=spec)
    )
    assert result.problems == []
    assert [r.step for r in result.deleted_local] == [10, 20]
    assert [r.step for r in result.deleted_durable] == [10]
    assert (result.newest_verified_local, result.newest_verified_durable) == (30, 30)
    rows = list_checkpoints(str(local), spec.durable_uri, endpoint_url=moto_s3.endpoint)
    assert [(r.step, r.local, r.durable) for r in rows] == [
        (40, None, "uncommitted"),
        (30, "verified", "verified"),
        (20, None, "verified"),
    ]
    # The newest verified durable copy survives keep_durable=0, even with a newer broken one.
    client.delete_object(Bucket=BUCKET, Key=f"jobs/demo/step-00000030/{COMMIT_MARKER}")
    shutil.rmtree(local)
    zero = collect_garbage_sync(
        GarbageCollectionRequest(
            checkpoint_dir=str(local), checkpoints=spec.model_copy(update={"keep_durable": 0})
        )
    )
    assert zero.newest_verified_durable == 20 and zero.deleted_durable == []


def test_cli_verify_and_list_over_s3(
    tmp_path: Path, moto_s3: MotoS3, worker_here: list[object]
) -> None:
    import json

    from typer.testing import CliRunner

    from lazarus.app import cli

    assert worker_here == []  # the worker's reading of the store, in this process
    local = tmp_path / "ckpt"
    spec = spec_for(moto_s3)
    for step in (10, 20):
        upload(write_checkpoint(local, step), step, spec)
    runner = CliRunner()
    endpoint = ["--endpoint-url", moto_s3.endpoint]
    root_uri = str(spec.durable_uri)
    good = runner.invoke(cli.app, ["verify", root_uri, "--json", *endpoint])
    assert good.exit_code == 0, good.output
    assert [c["step"] for c in json.loads(good.stdout)] == [20, 10]
    client = boto3.client("s3", endpoint_url=moto_s3.endpoint, region_name="us-east-1")
    client.put_object(Bucket=BUCKET, Key="jobs/demo/step-00000020/state.pt", Body=b"short")
    bad = runner.invoke(cli.app, ["verify", f"{root_uri}/step-00000020", *endpoint])
    assert bad.exit_code == 1 and "truncated" in bad.output
    absent = runner.invoke(cli.app, ["verify", f"{root_uri}/step-00000099", *endpoint])
    assert absent.exit_code == 2 and "no such checkpoint" in absent.output
    listed = runner.invoke(
        cli.app, ["checkpoints", "--dir", str(local), "--uri", root_uri, "--json", *endpoint]
    )
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert [(r["step"], r["verified"], r["durable"]) for r in rows] == [
        (20, True, False),
        (10, True, True),
    ]
