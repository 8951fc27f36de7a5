"""The housekeeping decisions are pure: checked here without a server."""

from __future__ import annotations

import pytest

from lazarus.domain.contracts import CheckpointRef
from lazarus.domain.spec import CheckpointsSpec
from workflows.housekeeping import (
    collection_summary,
    durable_after_upload,
    must_rewatch,
    protected_steps,
)


def ref(step: int) -> CheckpointRef:
    return CheckpointRef(step=step, path=f"/ckpt/step-{step}")


@pytest.mark.parametrize(
    ("durable", "step", "keep", "after"),
    [
        ([], 10, 2, [10]),
        ([10, 20], 30, 2, [20, 30]),
        ([10, 20], 30, 0, [30]),  # the newest verified copy is never forgotten
        ([10], 20, 5, [10, 20]),
    ],
)
def test_durable_steps_keep_the_newest(
    durable: list[int], step: int, keep: int, after: list[int]
) -> None:
    before = list(durable)
    assert durable_after_upload(durable, step, keep) == after
    assert durable == before  # a new list: the state's is replaced, never mutated


def test_collection_protects_the_new_checkpoint_and_the_resume_point() -> None:
    assert protected_steps(50, ref(30)) == [50, 30]
    assert protected_steps(50, None) == [50]


@pytest.mark.parametrize(
    ("housekept", "resume", "rewatch"),
    [
        (None, ref(10), False),  # nothing tiered yet
        (None, None, False),
        (40, ref(40), False),
        (40, ref(50), False),
        (40, ref(30), True),  # a rollback or a fallback below the newest tiered
        (40, None, True),  # back to scratch
    ],
)
def test_the_watch_restarts_only_below_the_newest_tiered_step(
    housekept: int | None, resume: CheckpointRef | None, rewatch: bool
) -> None:
    assert must_rewatch(housekept, resume) is rewatch


def test_the_collection_summary_names_what_is_kept() -> None:
    local = CheckpointsSpec(keep_local=3)
    assert collection_summary(local) == "keep the newest 3 local checkpoints"
    tiered = CheckpointsSpec(keep_local=2, keep_durable=5, durable_uri="s3://bucket/prefix")
    assert collection_summary(tiered) == "keep the newest 2 local and 5 durable checkpoints"
