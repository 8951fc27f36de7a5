"""Just-in-time checkpoints and rollbacks, on real directories (no ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import lazarus.rank as lazarus_rank
from activities.checkpoints.just_in_time import answering
from activities.checkpoints.rollback import RETIRED_DIR, retire_newest
from lazarus.domain import environment
from lazarus.domain.checkpoint_layout import committed_steps
from lazarus.rank import reset


def commit(root: Path, step: int, request: int | None = None) -> None:
    directory = root / f"step-{step:08d}"
    directory.mkdir(parents=True)
    manifest: dict[str, object] = {"step": step, "files": {}}
    if request is not None:
        manifest["checkpoint_request"] = request
    (directory / "manifest.json").write_text(json.dumps(manifest))
    (directory / "COMMITTED").write_text("{}")


def test_only_the_checkpoint_answering_the_request_counts_until_the_wait_is_over(
    tmp_path: Path,
) -> None:
    commit(tmp_path, 10)
    commit(tmp_path, 20)  # a periodic save that landed after the request was written
    assert answering(str(tmp_path), 7, newer_than=10, any_newer=False) is None
    late = answering(str(tmp_path), 7, newer_than=10, any_newer=True)
    assert late is not None and late.step == 20
    commit(tmp_path, 23, request=7)
    found = answering(str(tmp_path), 7, newer_than=10, any_newer=False)
    assert found is not None and found.step == 23


def test_rollback_retires_the_newest_and_keeps_it_for_a_person(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        commit(tmp_path, step)
    result = retire_newest(str(tmp_path))
    assert [r.step for r in result.retired] == [30]
    assert result.resume is not None and result.resume.step == 20
    assert [s for s, _ in committed_steps(tmp_path)] == [10, 20]
    assert (tmp_path / RETIRED_DIR / "step-00000030.0" / "COMMITTED").exists()
    commit(tmp_path, 30)  # training reaches step 30 again and saves it anew
    assert retire_newest(str(tmp_path)).retired[0].path.endswith("step-00000030.1")


@pytest.fixture
def rank_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    control = tmp_path / "control.json"
    monkeypatch.setenv(environment.CONTROL_FILE, str(control))
    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path / "ckpt"))
    monkeypatch.setenv(environment.HEARTBEAT_FILE, str(tmp_path / "hb.json"))
    reset._reset_state()
    yield control
    reset._reset_state()


def test_a_requested_checkpoint_records_its_request_and_holds(
    rank_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rank_env.write_text(json.dumps({"checkpoint_request": 4, "then": "hold"}))
    assert lazarus_rank.should_checkpoint()
    monkeypatch.setattr(lazarus_rank.checkpoints, "HOLD_AFTER_REQUESTED_CHECKPOINT_S", 0.2)
    (lazarus_rank.checkpoint_path(12) / "w.bin").write_bytes(b"x")
    directory = lazarus_rank.commit_checkpoint(12)
    assert json.loads((directory / "manifest.json").read_text())["checkpoint_request"] == 4
    (lazarus_rank.checkpoint_path(13) / "w.bin").write_bytes(b"y")
    later = lazarus_rank.commit_checkpoint(13)  # a periodic save: answers nothing
    assert "checkpoint_request" not in json.loads((later / "manifest.json").read_text())


def test_compute_time_is_averaged_per_step_into_the_heartbeat(rank_env: Path) -> None:
    heartbeat_file = rank_env.parent / "hb.json"
    lazarus_rank.record_compute_time(0.1)
    lazarus_rank.record_compute_time(0.1)  # two timed blocks in one step add up
    lazarus_rank.heartbeat(1)
    assert json.loads(heartbeat_file.read_text())["compute_s"] == pytest.approx(0.2)
    with lazarus_rank.compute_timer():
        pass
    lazarus_rank.heartbeat(2)  # throttled: folded into the next write
    lazarus_rank.flush_heartbeat()
    record = json.loads(heartbeat_file.read_text())
    assert record["step"] == 2 and record["compute_s"] < 0.01
