"""A hostile durable copy (moto's S3 on loopback): restore and verify refuse a manifest
path that leaves the checkpoint, before anything is downloaded (issue 10, defect 12);
and a durable copy another job wrote is never resumed from nor overwritten (defect 2)."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.checkpoints import restore_checkpoint, search_verified, verify_checkpoint
from activities.checkpoints.storage import CheckpointInputError
from activities.checkpoints.tiering import UploadTracker, upload_checkpoint_sync
from lazarus.domain import environment
from lazarus.domain.contracts import (
    CheckpointRef,
    FindVerifiedCheckpointRequest,
    RestoreCheckpointRequest,
    UploadCheckpointRequest,
)
from lazarus.domain.spec import CheckpointsSpec
from tests.checkpoint_helpers import BUCKET, MotoS3, clean_rank_env, moto_s3, write_checkpoint

pytestmark = pytest.mark.usefixtures("clean_rank_env")
__all__ = ["clean_rank_env", "moto_s3"]

PREFIX = "jobs/hostile"


def _spec(server: MotoS3) -> CheckpointsSpec:
    return CheckpointsSpec(durable_uri=f"s3://{BUCKET}/{PREFIX}", endpoint_url=server.endpoint)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", ["../../../pwned", "/tmp/lazarus-pwned-abs"])
async def test_restore_refuses_a_hostile_s3_manifest(
    tmp_path: Path, moto_s3: MotoS3, bad: str
) -> None:
    client = boto3.client("s3", endpoint_url=moto_s3.endpoint, region_name="us-east-1")
    base = f"{PREFIX}/step-00000010"
    manifest = {"step": 10, "world_size": 1, "files": {bad: {"size": 3, "sha256": None}}}
    client.put_object(Bucket=BUCKET, Key=f"{base}/manifest.json", Body=json.dumps(manifest))
    client.put_object(Bucket=BUCKET, Key=f"{base}/{bad.lstrip('/')}", Body=b"bad")
    client.put_object(Bucket=BUCKET, Key=f"{base}/COMMITTED", Body=b'{"committed_at": 1}')
    uri = f"s3://{BUCKET}/{base}"
    local = tmp_path / "a" / "b" / "ckpt"
    with pytest.raises(ApplicationError) as failed:
        await ActivityEnvironment().run(
            restore_checkpoint,
            RestoreCheckpointRequest(
                uri=uri, checkpoint_dir=str(local), checkpoints=_spec(moto_s3)
            ),
        )
    assert failed.value.type == "CheckpointCorrupt" and failed.value.non_retryable
    assert uri in str(failed.value) and repr(bad) in str(failed.value)
    assert not (tmp_path / "pwned").exists() and not Path(bad).exists()
    assert not local.exists()  # refused before anything was created or downloaded
    remote = verify_checkpoint(uri, endpoint_url=moto_s3.endpoint)
    assert not remote.ok and f"refused file path {bad!r}" in remote.problems[0]


@pytest.mark.timeout(60)
def test_another_jobs_durable_copy_is_skipped_and_never_overwritten(
    tmp_path: Path, moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec(moto_s3)
    monkeypatch.setenv(environment.JOB_ID, "job-b")
    theirs = write_checkpoint(tmp_path / "b", 20)
    monkeypatch.setenv(environment.JOB_ID, "job-a")
    mine = write_checkpoint(tmp_path / "a", 20)
    monkeypatch.delenv(environment.JOB_ID)

    def upload(path: Path) -> None:
        upload_checkpoint_sync(
            UploadCheckpointRequest(
                checkpoint=CheckpointRef(step=20, path=str(path)), checkpoints=spec
            ),
            UploadTracker(20, f"{spec.durable_uri}/step-00000020"),
        )

    upload(theirs)
    with pytest.raises(CheckpointInputError, match="written by job job-b, not by job-a"):
        upload(mine)
    empty = tmp_path / "empty"
    found = search_verified(
        FindVerifiedCheckpointRequest(checkpoint_dir=str(empty), checkpoints=spec, job_id="job-a")
    )
    assert found.chosen is None
    assert [(s.location, s.problems) for s in found.skipped] == [
        ("durable", ["written by job job-b"])
    ]
