"""Issue 12 §3: a checkpoint is verified in full once, when the housekeeping watch
first reports it; a relaunch re-checks only sizes and mtimes of what was verified,
and hashes whatever was never verified or has changed since."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from activities.checkpoints import storage
from activities.checkpoints.find import search_verified
from activities.checkpoints.verified_once import still_as_verified, verify_once
from activities.checkpoints.watch import watch_checkpoints
from lazarus.domain.checkpoint_layout import MANIFEST
from lazarus.domain.contracts import (
    FindVerifiedCheckpointRequest,
    VerifiedCheckpoint,
    WatchCheckpointsRequest,
)
from tests.checkpoint_helpers import clean_rank_env, flip_byte, write_checkpoint

pytestmark = pytest.mark.usefixtures("clean_rank_env")
__all__ = ["clean_rank_env"]

FILES = {"model.pt": 96 * 1024, "optim/rank0.pt": 32 * 1024}


def watched(root: Path, newer_than: int | None = None) -> VerifiedCheckpoint:
    found = asyncio.run(
        watch_checkpoints(
            WatchCheckpointsRequest(checkpoint_dir=str(root), newer_than_step=newer_than)
        )
    )
    assert found is not None and found.verified is not None, found
    return found.verified


def no_hashing(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every sha256 of a local file fail loudly, and record the attempts."""
    hashed: list[str] = []

    def refuse(self: storage.LocalStore, name: str, relpath: str) -> str:
        hashed.append(relpath)
        raise AssertionError(f"{relpath} was hashed again")

    monkeypatch.setattr(storage.LocalStore, "sha256", refuse)
    return hashed


def search(root: Path, trusted: list[VerifiedCheckpoint]) -> FindVerifiedCheckpointRequest:
    return FindVerifiedCheckpointRequest(
        checkpoint_dir=str(root), include_durable=False, trusted=trusted
    )


def test_the_watch_verifies_and_stamps_every_file(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, 10, FILES)
    record = watched(tmp_path)
    assert record.step == 10 and record.path == str(path)
    assert set(record.files) == {MANIFEST, *FILES}
    for relpath, stamp in record.files.items():
        st = os.stat(path / relpath)
        assert (stamp.size, stamp.mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_the_watch_vouches_for_nothing_corrupt(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, 10, FILES)
    flip_byte(path / "model.pt")
    found = asyncio.run(watch_checkpoints(WatchCheckpointsRequest(checkpoint_dir=str(tmp_path))))
    assert found is not None and found.step == 10, "still reported, for tiering to decide"
    assert found.verified is None


def test_the_watch_can_leave_verification_off(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 10, FILES)
    request = WatchCheckpointsRequest(checkpoint_dir=str(tmp_path), verify=False)
    found = asyncio.run(watch_checkpoints(request))
    assert found is not None and found.verified is None


def test_a_trusted_checkpoint_is_accepted_without_reading_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_checkpoint(tmp_path, 10, FILES)
    record = watched(tmp_path)
    hashed = no_hashing(monkeypatch)
    result = search_verified(search(tmp_path, [record]))
    assert result.chosen is not None and result.chosen.step == 10
    assert result.chosen.path == str(path)
    assert hashed == []


def test_an_untrusted_checkpoint_is_still_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_checkpoint(tmp_path, 10, FILES)
    hashed = no_hashing(monkeypatch)
    with pytest.raises(AssertionError, match="hashed again"):
        search_verified(search(tmp_path, []))
    assert hashed, "a checkpoint never verified must be hashed"


@pytest.mark.parametrize("change", ["mtime", "size"])
def test_changed_stamps_fall_back_to_full_verification(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    path = write_checkpoint(tmp_path, 10, FILES)
    record = watched(tmp_path)
    target = path / "model.pt"
    st = os.stat(target)
    if change == "mtime":
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    else:
        with open(target, "ab") as handle:
            handle.write(b"x")
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime, other size
    assert not still_as_verified(path, 10, [record])
    if change == "size":  # verified in full again: the size is wrong
        result = search_verified(search(tmp_path, [record]), move_aside_corrupt=False)
        assert result.chosen is None
        assert any("too long" in p for p in result.skipped[0].problems)
        return
    hashed = no_hashing(monkeypatch)  # same size: only the hash can tell
    with pytest.raises(AssertionError, match="hashed again"):
        search_verified(search(tmp_path, [record]))
    assert hashed


def test_corruption_after_trust_is_detected(tmp_path: Path) -> None:
    """Same size, rewritten (mtime moved): the stamps no longer vouch, the hash fails."""
    write_checkpoint(tmp_path, 8, FILES)
    path = write_checkpoint(tmp_path, 10, FILES)
    record = watched(tmp_path)
    target = path / "optim" / "rank0.pt"
    st = os.stat(target)
    flip_byte(target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000))
    result = search_verified(search(tmp_path, [record]), move_aside_corrupt=False)
    assert result.chosen is not None and result.chosen.step == 8, "fell back to the older one"
    [skipped] = result.skipped
    assert skipped.step == 10 and any("sha256 mismatch" in p for p in skipped.problems)


def test_a_record_for_another_place_or_step_vouches_for_nothing(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, 10, FILES)
    record = verify_once(path, 10)
    assert record is not None
    assert still_as_verified(path, 10, [record])
    assert not still_as_verified(path, 11, [record])
    moved = record.model_copy(update={"path": str(tmp_path / "elsewhere" / path.name)})
    assert not still_as_verified(path, 10, [moved])
    without_manifest = record.model_copy(
        update={"files": {k: v for k, v in record.files.items() if k != MANIFEST}}
    )
    assert not still_as_verified(path, 10, [without_manifest])
