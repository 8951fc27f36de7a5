"""Issue 26: a dead rank is reported as soon as its exit record exists.

No assertion here is about time: each checks *what* ended a round (an exit record
that arrived), so the tests hold on a busy machine.
"""

from __future__ import annotations

from pathlib import Path

from lazarus.activities.nodes.agent import NodeStatus, RankRecord
from lazarus.activities.supervise import (
    VANISHED_GRACE_S,
    GenerationObserver,
    Observation,
    awaiting_exit_record,
    evaluate,
)
from lazarus.domain.contracts import RankStatus, SuperviseRequest
from lazarus.domain.spec import HealthSpec, NodeSpec
from tests.fake_nodes import FakeAgent, FakeClock


def request(tmp_path: Path) -> SuperviseRequest:
    return SuperviseRequest.model_validate(
        {
            "job_id": "j",
            "generation": 1,
            "run_dir": str(tmp_path / "gen-00001"),
            "world_size": 2,
            "nproc_per_node": 2,
            "health": HealthSpec(hang_timeout_s=30, startup_timeout_s=60),
            "report_after_s": 1e9,
        }
    )


def status(records: list[RankRecord], at: float) -> NodeStatus:
    return NodeStatus(node="local", reachable=True, observed_at=at, ranks=records)


def live(rank: int) -> RankRecord:
    return RankRecord(rank=rank, pid=100 + rank, alive=True, heartbeat={"step": 5, "time": 1.0})


def test_a_crash_caught_before_its_exit_record_is_reported_when_the_record_lands(
    tmp_path: Path,
) -> None:
    """The cause of issue 26: the first poll saw rank 1 dead before its wrapper wrote
    the record; the next one found the record, yet the crash waited out the whole
    vanished-rank grace (1.5 s) before it was reported."""
    clock = FakeClock()
    agent = FakeAgent(NodeSpec())
    observer = GenerationObserver(request(tmp_path), [agent], clock=clock)
    dead = RankRecord(rank=1, pid=101, alive=False, heartbeat={"step": 5, "time": 1.0})
    agent.reply = status([live(0), dead], clock.wall())
    first = observer.observe()
    assert awaiting_exit_record(first)
    assert evaluate(request(tmp_path), first, started_at=clock.wall()) is None

    clock.advance(VANISHED_GRACE_S / 30)
    ended = {"exit_code": -9, "signal": "SIGKILL", "ended_at": clock.wall() - 0.01}
    agent.reply = status([live(0), dead.model_copy(update={"exit": ended})], clock.wall())
    second = observer.observe()
    assert not awaiting_exit_record(second)
    outcome = evaluate(request(tmp_path), second, started_at=clock.wall())
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "crash" and outcome.failure.rank == 1


def test_a_record_that_arrived_ends_the_wait_even_with_an_old_dead_since() -> None:
    """The pure rule, for observations restored from an older worker's memory."""
    ranks = [
        RankStatus(rank=0, pid=100, alive=True, step=5, last_progress_at=999.0),
        RankStatus(rank=1, pid=101, alive=False, exit_code=-9, signal="SIGKILL", ended_at=999.9),
    ]
    obs = Observation(now=1000.0, launched_at=900.0, ranks=ranks, dead_since={1: 999.95})
    assert not awaiting_exit_record(obs)
    outcome = evaluate(request(Path("/nonexistent")), obs, started_at=990.0)
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "crash"
