"""The ledger's S3 tier and retention on sharded (DCP) checkpoint directories written
by every rank of a real FSDP2 run (issue 29): upload, durable verify, retention on
both tiers, a torn durable shard passed over, then a restore from S3 that verifies
and resumes (on one rank: DCP reshards) to the weights of the uninterrupted run.

The checkpoints come from ``examples/train_fsdp.py`` under plain ``torchrun`` on two
ranks, so each directory holds ``.metadata`` and one ``__<rank>_0.distcp`` per rank;
moto's S3 server on loopback stands in for S3 (``tests/checkpoint_helpers.py``).
"""

from __future__ import annotations

import shutil
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
    verify_checkpoint,
)
from infra.reference_run import weights_match
from lazarus.domain.checkpoint_layout import COMMIT_MARKER, MANIFEST
from lazarus.domain.contracts import (
    CheckpointRef,
    FindVerifiedCheckpointRequest,
    GarbageCollectionRequest,
    RestoreCheckpointRequest,
)
from tests.checkpoint_helpers import (
    BUCKET,
    MotoS3,
    clean_rank_env,
    moto_s3,
    s3_keys,
    spec_for,
    upload,
)
from tests.fsdp_example import torchrun_fsdp

pytestmark = [pytest.mark.usefixtures("clean_rank_env"), pytest.mark.timeout(240)]
__all__ = ["clean_rank_env", "moto_s3"]

STEPS = 6
CKPT_EVERY = 2
DCP_FILES = [".metadata", COMMIT_MARKER, "__0_0.distcp", "__1_0.distcp", MANIFEST]
"""What every rank and then rank 0's commit leave in a two-rank DCP directory."""


def step_dir(step: int) -> str:
    return f"step-{step:08d}"


def s3_client(server: MotoS3) -> Any:
    return boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")


def torn_in_s3(server: MotoS3, key: str) -> None:
    """Flip one byte of an object in the bucket (same size): bit rot on the durable copy."""
    client = s3_client(server)
    body = bytearray(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    client.put_object(Bucket=BUCKET, Key=key, Body=bytes(body))


async def test_dcp_directories_tier_to_s3_age_out_and_restore_to_a_resume(
    tmp_path: Path, moto_s3: MotoS3
) -> None:
    local = tmp_path / "checkpoints"
    reference = torchrun_fsdp(tmp_path / "run", local, nproc=2, steps=STEPS, ckpt_every=CKPT_EVERY)
    steps = list(range(CKPT_EVERY, STEPS + 1, CKPT_EVERY))
    assert sorted(p.name for p in local.iterdir()) == [step_dir(s) for s in steps]

    # Upload: every rank's shard, .metadata, the manifest and the marker.
    spec = spec_for(moto_s3, prefix="jobs/fsdp", keep_local=1, keep_durable=2)
    for step in steps:
        result = upload(local / step_dir(step), step, spec)
        assert result.verified and result.files == len(DCP_FILES) - 2, result
    assert s3_keys(moto_s3, "jobs/fsdp/") == [
        f"jobs/fsdp/{step_dir(step)}/{name}" for step in steps for name in sorted(DCP_FILES)
    ]
    newest = f"s3://{BUCKET}/jobs/fsdp/{step_dir(steps[-1])}"
    remote = verify_checkpoint(newest, endpoint_url=moto_s3.endpoint)
    assert remote.ok and remote.hashed, remote.problems

    # Retention: whole DCP directories go, locally and in the bucket.
    collected = collect_garbage_sync(
        GarbageCollectionRequest(checkpoint_dir=str(local), checkpoints=spec)
    )
    assert collected.problems == []
    assert [r.step for r in collected.deleted_local] == steps[:-1]
    assert [r.step for r in collected.deleted_durable] == steps[:-2]
    assert sorted(p.name for p in local.iterdir()) == [step_dir(steps[-1])]
    assert {key.split("/")[2] for key in s3_keys(moto_s3, "jobs/fsdp/")} == {
        step_dir(s) for s in steps[-2:]
    }

    # The node and its disk are gone. On the newest durable copy one rank's shard
    # rotted: the restore hashes what it downloads and refuses it, for good.
    shutil.rmtree(local)
    spare = tmp_path / "spare"
    torn = f"jobs/fsdp/{step_dir(steps[-1])}/__1_0.distcp"
    torn_in_s3(moto_s3, torn)
    with pytest.raises(ApplicationError) as refused:
        await ActivityEnvironment().run(
            restore_checkpoint,
            RestoreCheckpointRequest(uri=newest, checkpoint_dir=str(spare), checkpoints=spec),
        )
    assert refused.value.type == "CheckpointCorrupt" and refused.value.non_retryable
    assert "__1_0.distcp" in str(refused.value.details), refused.value.details
    assert not (spare / step_dir(steps[-1])).exists()
    # Then that shard is lost outright: the search passes the copy over (it checks
    # names and sizes against the manifest, hashing is the restore's) for the one before.
    s3_client(moto_s3).delete_object(Bucket=BUCKET, Key=torn)
    found = search_verified(
        FindVerifiedCheckpointRequest(checkpoint_dir=str(spare), checkpoints=spec)
    )
    assert found.chosen is not None and found.location == "durable", found
    assert found.chosen.step == steps[-2]
    [skipped] = found.skipped
    assert skipped.step == steps[-1] and any("__1_0.distcp" in p for p in skipped.problems)

    # Restore onto a spare, verify, and resume there on one rank to the end.
    restored = await ActivityEnvironment().run(
        restore_checkpoint,
        RestoreCheckpointRequest(
            uri=found.chosen.path, checkpoint_dir=str(spare), checkpoints=spec
        ),
    )
    assert restored == CheckpointRef(step=steps[-2], path=str(spare / step_dir(steps[-2])))
    assert sorted(p.name for p in Path(restored.path).iterdir()) == sorted(DCP_FILES)
    assert verify_checkpoint(restored.path).ok
    resumed = torchrun_fsdp(tmp_path / "resume", spare, nproc=1, steps=STEPS, ckpt_every=CKPT_EVERY)
    # It resumed (no step before the restored one was redone) and ended where the
    # uninterrupted two-rank run did. (The refused restore's hidden temporary directory
    # stays for a retry to reuse what it downloaded whole; readers ignore it.)
    kept = sorted(p.name for p in spare.iterdir() if p.name.startswith("step-"))
    assert kept == [step_dir(s) for s in steps[-2:]]
    assert weights_match(resumed, reference), f"{resumed} differs from {reference}"
