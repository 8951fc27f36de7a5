"""δ for ``checkpoints.interval: auto``: the rank helper times the blocking part of its
disk saves and reports it in the heartbeat; the supervisor passes the slowest rank's
up in its outcome."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import lazarus.rank as lazarus_rank
from activities.nodes.agent import NodeStatus, RankRecord
from activities.supervise_observer import GenerationObserver
from activities.supervise_rules import evaluate
from lazarus.domain import environment
from lazarus.domain.contracts import SuperviseRequest
from lazarus.domain.spec import HealthSpec, NodeSpec
from lazarus.rank import reset
from tests.fake_nodes import FakeAgent, FakeClock

pytestmark = pytest.mark.timeout(30)

_CONTRACT_VARIABLES = [
    value for name, value in vars(environment).items() if name.isupper() and isinstance(value, str)
]


@pytest.fixture(autouse=True)
def under_lazarus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Rank 0 of a job, fresh module state; yields its heartbeat file."""
    for variable in _CONTRACT_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    heartbeat = tmp_path / "rank-0.heartbeat.json"
    monkeypatch.setenv(environment.JOB_ID, "j")
    monkeypatch.setenv(environment.HEARTBEAT_FILE, str(heartbeat))
    monkeypatch.setenv(environment.HEARTBEAT_INTERVAL, "0")
    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path / "ckpt"))
    reset._reset_state()
    yield heartbeat
    reset._reset_state()


def _save(step: int, blocked_s: float) -> None:
    directory = lazarus_rank.checkpoint_path(step)
    time.sleep(blocked_s)
    (directory / "state.bin").write_bytes(b"x" * 10)
    lazarus_rank.commit_checkpoint(step)


def _beat(path: Path) -> dict[str, object]:
    document = json.loads(path.read_text())
    assert isinstance(document, dict)
    return document


def test_a_save_from_checkpoint_path_to_commit_is_timed_and_sent(under_lazarus: Path) -> None:
    lazarus_rank.heartbeat(1)
    assert environment.HEARTBEAT_CHECKPOINT_SAVE_S not in _beat(under_lazarus)
    _save(2, 0.05)
    lazarus_rank.heartbeat(2)
    save_s = _beat(under_lazarus)[environment.HEARTBEAT_CHECKPOINT_SAVE_S]
    assert isinstance(save_s, float) and save_s >= 0.05
    assert lazarus_rank.checkpoint_save_s() == save_s


def test_the_median_of_the_last_saves_is_reported() -> None:
    for seconds in (9.0, 1.0, 2.0, 3.0, 100.0, 2.5):
        lazarus_rank.record_checkpoint_save(seconds)
    # The first (9.0) fell out: median of 1, 2, 3, 100, 2.5.
    assert lazarus_rank.checkpoint_save_s() == 2.5


def test_reported_times_replace_the_helpers_own(under_lazarus: Path) -> None:
    lazarus_rank.record_checkpoint_save(0.01)  # an async save: only the copy blocks
    _save(3, 0.05)
    assert lazarus_rank.checkpoint_save_s() == 0.01
    lazarus_rank.heartbeat(3)
    assert _beat(under_lazarus)[environment.HEARTBEAT_CHECKPOINT_SAVE_S] == 0.01


def test_a_commit_of_a_step_already_committed_times_nothing() -> None:
    _save(4, 0.0)
    before = lazarus_rank.checkpoint_save_s()
    lazarus_rank.commit_checkpoint(4)  # retried commit: nothing re-saved
    assert lazarus_rank.checkpoint_save_s() == before


def test_the_supervisor_reports_the_slowest_ranks_save(tmp_path: Path) -> None:
    request = SuperviseRequest(
        job_id="j",
        generation=1,
        run_dir=str(tmp_path / "gen-00001"),
        world_size=2,
        nproc_per_node=2,
        health=HealthSpec(),
        report_after_s=0.0,
    )
    clock = FakeClock()
    agent = FakeAgent(NodeSpec())
    observer = GenerationObserver(request, [agent], clock=clock)
    agent.reply = NodeStatus(
        node=agent.node.name,
        reachable=True,
        observed_at=clock.wall(),
        ranks=[
            RankRecord(
                rank=0,
                pid=10,
                alive=True,
                heartbeat={"step": 5, "time": 1.0, environment.HEARTBEAT_CHECKPOINT_SAVE_S: 1.5},
            ),
            RankRecord(
                rank=1,
                pid=11,
                alive=True,
                heartbeat={"step": 5, "time": 1.0, environment.HEARTBEAT_CHECKPOINT_SAVE_S: 2.5},
            ),
        ],
    )
    outcome = evaluate(request, observer.observe(), started_at=clock.wall() - 1.0)
    assert outcome is not None and outcome.kind == "progress"
    assert outcome.checkpoint_save_s == 2.5


def test_without_saves_the_outcome_says_nothing(tmp_path: Path) -> None:
    request = SuperviseRequest(
        job_id="j",
        generation=1,
        run_dir=str(tmp_path / "gen-00001"),
        world_size=1,
        health=HealthSpec(),
        report_after_s=0.0,
    )
    clock = FakeClock()
    agent = FakeAgent(NodeSpec())
    observer = GenerationObserver(request, [agent], clock=clock)
    agent.reply = NodeStatus(
        node=agent.node.name,
        reachable=True,
        observed_at=clock.wall(),
        ranks=[RankRecord(rank=0, pid=10, alive=True, heartbeat={"step": 5, "time": 1.0})],
    )
    outcome = evaluate(request, observer.observe(), started_at=clock.wall() - 1.0)
    assert outcome is not None and outcome.checkpoint_save_s is None
