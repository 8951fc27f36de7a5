"""The disk tiers read the timeline too (issue 37): real checkpoints of the rank helper.

A rollback retires a checkpoint by identity, the step and the generation its manifest
names (N10): every copy of that state is passed over, while a later generation's own
fresh checkpoint of the same step is resumed from. A cut abandons an older
generation's disk checkpoint above it, as it does a memory snapshot. Both are passed
over quietly (``skipped`` lists faults, and these are none).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from activities.checkpoints.find import search_verified
from activities.checkpoints.rollback import retire_newest
from lazarus.domain import environment
from lazarus.domain.contracts import FindVerifiedCheckpointRequest
from lazarus.domain.timeline import RetiredCheckpoint, TimelineCut
from tests.checkpoint_helpers import clean_rank_env, write_checkpoint

pytestmark = pytest.mark.usefixtures("clean_rank_env")
__all__ = ["clean_rank_env"]


def write_by(root: Path, step: int, generation: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkpoint of ``step`` committed by a rank of ``generation``."""
    monkeypatch.setenv(environment.GENERATION, str(generation))
    return write_checkpoint(root, step, {"state.pt": 1024}, hash_files=False)


def search(root: Path, **fields: object) -> tuple[int | None, list[int]]:
    """The chosen step and the skipped ones of a disk-only search."""
    found = search_verified(
        FindVerifiedCheckpointRequest(
            checkpoint_dir=str(root),
            include_durable=False,
            **fields,
        ),
        move_aside_corrupt=False,
    )
    return (found.chosen.step if found.chosen else None), [s.step for s in found.skipped]


def test_a_rollback_retires_a_state_not_a_step_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ckpt"
    write_by(root, 100, 1, monkeypatch)
    diverged = write_by(root, 150, 1, monkeypatch)
    kept = tmp_path / "durable-copy-of-150"
    shutil.copytree(diverged, kept)

    rolled = retire_newest(str(root))
    [retired] = rolled.retired
    assert (retired.step, retired.generation) == (150, 1)
    identity = [RetiredCheckpoint(step=150, generation=1)]
    cuts = [TimelineCut(generation=1, step=0), TimelineCut(generation=2, step=100)]

    # Generation 1's state at 150 comes back (a restore of its durable copy): refused.
    shutil.copytree(kept, diverged)
    assert search(root, retired=identity) == (100, [])
    # Generation 2 writes its own checkpoint of step 150: that one serves.
    shutil.rmtree(diverged)
    write_by(root, 150, 2, monkeypatch)
    assert search(root, retired=identity, timeline=cuts) == (150, [])
    # The same by number (a rollback recorded before identities) loses it.
    assert search(root, exclude_steps=[150], timeline=cuts) == (100, [])


def test_a_cut_keeps_an_older_generations_disk_checkpoint_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Generation 2 resumed from 100 (a rollback's bound, or a fallback): generation
    1's disk 120 is on the timeline the job left; generation 2's own 110 is not."""
    root = tmp_path / "ckpt"
    write_by(root, 100, 1, monkeypatch)
    write_by(root, 120, 1, monkeypatch)
    assert search(root) == (120, [])
    cuts = [TimelineCut(generation=1, step=0), TimelineCut(generation=2, step=100)]
    assert search(root, timeline=cuts) == (100, [])
    write_by(root, 110, 2, monkeypatch)
    assert search(root, timeline=cuts) == (110, [])
