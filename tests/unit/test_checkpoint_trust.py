"""Verification, the verified search, retention and the offline CLI, on local disks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from activities.checkpoints import (
    CheckpointInputError,
    collect_garbage_sync,
    search_verified,
    verify_checkpoint,
)
from activities.checkpoints.listing import list_checkpoints
from lazarus.app import cli
from lazarus.domain.checkpoint_layout import COMMIT_MARKER, MANIFEST
from lazarus.domain.contracts import FindVerifiedCheckpointRequest, GarbageCollectionRequest
from lazarus.domain.spec import CheckpointsSpec
from tests.checkpoint_helpers import clean_rank_env, flip_byte, write_checkpoint

pytestmark = pytest.mark.usefixtures("clean_rank_env")
__all__ = ["clean_rank_env"]

FILES = {"state.pt": 200_000, "shards/rank-1.pt": 50_000}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "ckpt"


def test_a_good_checkpoint_verifies(root: Path) -> None:
    path = write_checkpoint(root, 10, FILES)
    result = verify_checkpoint(path)
    assert result.ok and result.problems == []
    assert (result.step, result.files, result.size_bytes) == (10, 2, 250_000)
    assert result.hashed and result.world_size == 1 and result.committed_at is not None


def test_truncated_file_is_named(root: Path) -> None:
    path = write_checkpoint(root, 10, FILES)
    with open(path / "state.pt", "r+b") as handle:
        handle.truncate(1000)
    result = verify_checkpoint(path, hashes=False)
    assert not result.ok
    assert result.problems == ["state.pt: truncated: 1000 bytes, the manifest says 200000"]


def test_flipped_byte_needs_hashes(root: Path) -> None:
    path = write_checkpoint(root, 10, FILES)
    flip_byte(path / "shards" / "rank-1.pt")
    assert verify_checkpoint(path, hashes=False).ok  # sizes cannot see it
    result = verify_checkpoint(path)
    assert not result.ok
    assert len(result.problems) == 1
    assert result.problems[0].startswith("shards/rank-1.pt: sha256 mismatch")


def test_missing_marker_manifest_and_file(root: Path) -> None:
    path = write_checkpoint(root, 10, FILES)
    (path / COMMIT_MARKER).unlink()
    (path / "state.pt").unlink()
    result = verify_checkpoint(path)
    assert result.problems == [
        "COMMITTED: missing (the save never finished, or was torn)",
        "state.pt: missing",
    ]
    (path / MANIFEST).unlink()
    assert verify_checkpoint(path).problems[-1] == "manifest.json: missing"
    (path / MANIFEST).write_text("{not json")
    assert verify_checkpoint(path).problems[-1].startswith("manifest.json: not valid JSON")


def test_unexpected_world_size(root: Path) -> None:
    path = write_checkpoint(root, 10)
    result = verify_checkpoint(path, expected_world_size=4)
    assert result.problems == ["manifest.json: written by a world of 1 ranks, expected 4"]


def test_bad_input_raises(tmp_path: Path, root: Path) -> None:
    with pytest.raises(CheckpointInputError, match="no such file"):
        verify_checkpoint(tmp_path / "nope")
    write_checkpoint(root, 10)
    with pytest.raises(CheckpointInputError, match="not a checkpoint"):
        verify_checkpoint(root)  # a root, not one checkpoint


def test_search_falls_back_past_torn_and_corrupt(root: Path) -> None:
    write_checkpoint(root, 10, FILES)
    corrupt = write_checkpoint(root, 20, FILES)
    flip_byte(corrupt / "state.pt")
    torn = write_checkpoint(root, 30, FILES)
    (torn / COMMIT_MARKER).unlink()
    no_manifest = write_checkpoint(root, 40, FILES)
    (no_manifest / MANIFEST).unlink()
    # Sizes only (a preview that moves nothing): the flipped byte passes, so 20 wins.
    sizes = search_verified(
        FindVerifiedCheckpointRequest(
            checkpoint_dir=str(root), checkpoints=CheckpointsSpec(verify_hashes=False)
        ),
        move_aside_corrupt=False,
    )
    assert sizes.chosen is not None and sizes.chosen.step == 20
    found = search_verified(FindVerifiedCheckpointRequest(checkpoint_dir=str(root)))
    assert found.chosen is not None and found.chosen.step == 10 and found.location == "local"
    assert [s.step for s in found.skipped] == [40, 30, 20]
    assert "manifest.json: missing" in found.skipped[0].problems
    assert found.skipped[1].problems[0].startswith("COMMITTED: missing")
    assert found.skipped[2].problems[0].startswith("state.pt: sha256 mismatch")
    # Committed but corrupt: moved aside for a person; the torn save stays (GC's).
    assert [s.moved_to for s in found.skipped] == [
        str(root / ".corrupt" / "step-00000040.0"),
        None,
        str(root / ".corrupt" / "step-00000020.0"),
    ]
    assert _steps(root) == [10, 30]


def test_search_of_an_empty_dir(tmp_path: Path) -> None:
    found = search_verified(FindVerifiedCheckpointRequest(checkpoint_dir=str(tmp_path / "x")))
    assert found.chosen is None and found.skipped == []


def _gc(root: Path, keep: int, protect: list[int] | None = None) -> list[int]:
    result = collect_garbage_sync(
        GarbageCollectionRequest(
            checkpoint_dir=str(root),
            checkpoints=CheckpointsSpec(keep_local=keep),
            protect_steps=protect or [],
        )
    )
    assert result.problems == []
    return sorted(ref.step for ref in result.deleted_local)


def _steps(root: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in root.iterdir() if p.name.startswith("step-"))


def test_gc_keeps_the_newest_n(root: Path) -> None:
    for step in (10, 20, 30, 40):
        write_checkpoint(root, step)
    assert _gc(root, 2) == [10, 20]
    assert _steps(root) == [30, 40]


def test_gc_never_deletes_the_newest_verified(root: Path) -> None:
    for step in (10, 20, 30):
        write_checkpoint(root, step)
    flip_byte(root / "step-00000030" / "state.pt")
    torn = write_checkpoint(root, 40)
    (torn / COMMIT_MARKER).unlink()
    # keep 0: everything older than the newest verified (20) goes; 20 and newer stay.
    assert _gc(root, 0) == [10]
    assert _steps(root) == [20, 30, 40]
    assert _gc(root, 0) == []


def test_gc_removes_old_torn_saves_and_respects_protection(root: Path) -> None:
    torn = write_checkpoint(root, 5)
    (torn / COMMIT_MARKER).unlink()
    for step in (10, 20, 30):
        write_checkpoint(root, step)
    assert _gc(root, 1, protect=[10]) == [5, 20]
    assert _steps(root) == [10, 30]


def test_gc_deletes_nothing_when_nothing_verifies(root: Path) -> None:
    for step in (10, 20):
        flip_byte(write_checkpoint(root, step) / "state.pt")
    assert _gc(root, 0) == []


def test_listing(root: Path) -> None:
    write_checkpoint(root, 10)
    flip_byte(write_checkpoint(root, 20) / "state.pt")
    (write_checkpoint(root, 30) / COMMIT_MARKER).unlink()
    rows = list_checkpoints(str(root), hashes=True)
    assert [(r.step, r.local, r.durable) for r in rows] == [
        (30, "uncommitted", None),
        (20, "corrupt", None),
        (10, "verified", None),
    ]
    assert rows[2].size_bytes == 64 * 1024 and rows[2].time is not None


runner = CliRunner()


def test_cli_verify_exit_codes(root: Path, tmp_path: Path, worker_here: list[object]) -> None:
    """The worker reads the checkpoints (issue 40): here in this process."""
    good = write_checkpoint(root, 10)
    result = runner.invoke(cli.app, ["verify", str(good)])
    assert result.exit_code == 0, result.output
    assert "ok" in result.output
    bad = write_checkpoint(root, 20)
    flip_byte(bad / "state.pt")
    result = runner.invoke(cli.app, ["verify", str(bad), "--json"])
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    assert payload[0]["ok"] is False and "sha256 mismatch" in payload[0]["problems"][0]
    assert runner.invoke(cli.app, ["verify", str(bad), "--sizes-only"]).exit_code == 0
    missing = runner.invoke(cli.app, ["verify", str(tmp_path / "nope")])
    assert missing.exit_code == 2
    assert "no such file or directory" in missing.output
    # A root verifies every checkpoint under it; one bad one fails the command.
    everything = runner.invoke(cli.app, ["verify", str(root), "--json"])
    assert everything.exit_code == 1
    assert [c["step"] for c in json.loads(everything.stdout)] == [20, 10]
    shutil.rmtree(bad)
    assert runner.invoke(cli.app, ["verify", str(root)]).exit_code == 0


def test_cli_checkpoints_of_a_directory(
    root: Path, worker_here: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_checkpoint(root, 10)
    write_checkpoint(root, 20)
    result = runner.invoke(cli.app, ["checkpoints", "--dir", str(root), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["step"], r["verified"], r["durable"]) for r in rows] == [
        (20, True, None),
        (10, True, None),
    ]
    table = runner.invoke(cli.app, ["checkpoints", "--dir", str(root)])
    assert table.exit_code == 0 and "step" in table.output
    assert runner.invoke(cli.app, ["checkpoints"]).exit_code == 2
    # A relative path is the user's shell's: the worker (its own directory) gets it whole.
    monkeypatch.chdir(root.parent)
    relative = runner.invoke(cli.app, ["checkpoints", "--dir", root.name, "--json"])
    assert relative.exit_code == 0 and len(json.loads(relative.stdout)) == 2, relative.output
    assert getattr(worker_here[-1], "checkpoint_dir", None) == str(root)


async def test_activities_wrap_the_same_logic(root: Path) -> None:
    from temporalio.testing import ActivityEnvironment

    from activities.checkpoints import collect_garbage, find_verified_checkpoint

    for step in (10, 20, 30):
        write_checkpoint(root, step)
    flip_byte(root / "step-00000030" / "state.pt")
    env = ActivityEnvironment()
    found = await env.run(
        find_verified_checkpoint, FindVerifiedCheckpointRequest(checkpoint_dir=str(root))
    )
    assert found.chosen is not None and found.chosen.step == 20
    assert [s.step for s in found.skipped] == [30]
    collected = await env.run(
        collect_garbage,
        GarbageCollectionRequest(
            checkpoint_dir=str(root), checkpoints=CheckpointsSpec(keep_local=0)
        ),
    )
    assert [r.step for r in collected.deleted_local] == [10]
    assert collected.newest_verified_local == 20


def test_a_rollback_search_stays_below_the_retired_step(
    tmp_path: Path, clean_rank_env: None
) -> None:
    root = tmp_path / "ckpt"
    for step in (10, 20, 30):
        write_checkpoint(root, step)
    found = search_verified(FindVerifiedCheckpointRequest(checkpoint_dir=str(root), below_step=30))
    assert found.chosen is not None and found.chosen.step == 20
    assert found.skipped == []
