"""A hang is judged at ``hang_timeout_s`` after the rank's last progress (issue 30):
the supervisor's round comes when the earliest hang clock runs out, not up to one
``poll_interval_s`` later, and on a node that shares the controller's clock the
progress is dated at its heartbeat's write, not at the poll that saw it.

Pure rules and a scripted agent with a fake clock: no processes, no sleeping.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from activities.nodes.agent import NodeStatus, RankRecord
from activities.supervise import until_hang_check
from activities.supervise_observer import GenerationObserver
from activities.supervise_rules import (
    HANG_CHECK_SLACK_S,
    NodeObservation,
    Observation,
    evaluate,
    next_hang_check,
)
from lazarus.domain.contracts import RankStatus, SuperviseRequest
from lazarus.domain.spec import HealthSpec, NodeSpec
from tests.fake_nodes import FakeAgent, FakeClock

HANG_S = 10.0


def request(tmp_path: Path | None = None, world_size: int = 2) -> SuperviseRequest:
    return SuperviseRequest.model_validate(
        {
            "job_id": "j",
            "generation": 1,
            "run_dir": str((tmp_path or Path("/nonexistent")) / "gen-00001"),
            "world_size": world_size,
            "nproc_per_node": world_size,
            "health": HealthSpec(hang_timeout_s=HANG_S, startup_timeout_s=60),
            "report_after_s": 1e9,
        }
    )


def rank(r: int, **fields: object) -> RankStatus:
    base: dict[str, object] = {"rank": r, "pid": 100 + r, "alive": True, "node": "local"}
    return RankStatus.model_validate({**base, **fields})


def obs(*ranks: RankStatus, now: float = 1000.0, **extra: object) -> Observation:
    return Observation(now=now, launched_at=900.0, ranks=list(ranks), **extra)  # type: ignore[arg-type]


# ------------------------------------------------------------------ the deadline


def test_the_deadline_is_the_earliest_last_progress_plus_the_timeout() -> None:
    o = obs(rank(0, step=40, last_progress_at=995.0), rank(1, step=41, last_progress_at=993.5))
    assert next_hang_check(request(), o) == 993.5 + HANG_S


def test_ranks_that_are_not_judged_set_no_deadline() -> None:
    dead = rank(0, alive=False, exit_code=1, step=3, last_progress_at=990.0)
    never_stepped = rank(1)  # the startup clock is the rounds' business
    assert next_hang_check(request(), obs(dead, never_stepped)) is None
    waiting = obs(
        rank(0, step=3, last_progress_at=990.0),
        rank(1, step=3, last_progress_at=991.0),
        nodes={"local": NodeObservation(reachable=True, waiting=True)},
    )
    assert next_hang_check(request(), waiting) is None, "a node whose poll is out is not judged"
    off = obs(rank(0, step=3, last_progress_at=990.0), progress_signal="none")
    assert next_hang_check(request(), off) is None, "no progress signal: no hang detection"


def test_a_round_at_the_deadline_plus_the_slack_finds_the_hang() -> None:
    """The round the deadline schedules is the one that judges: the rule is "silent for
    more than hang_timeout_s", and the slack puts the round past it."""
    last = 995.0
    ranks = (rank(0, step=40, last_progress_at=last), rank(1, step=40, last_progress_at=last))
    before = obs(*ranks, now=last + 2.0)
    assert evaluate(request(), before, started_at=900.0) is None
    wait_s = until_hang_check(request(), before, before.now)
    assert wait_s == pytest.approx(HANG_S - 2.0 + HANG_CHECK_SLACK_S)
    at_deadline = obs(*ranks, now=before.now + wait_s)
    outcome = evaluate(request(), at_deadline, started_at=900.0)
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "hang"


def test_no_clock_running_leaves_the_wait_to_the_rounds() -> None:
    o = obs(rank(0), rank(1))
    assert until_hang_check(request(), o, o.now) == math.inf


def test_a_deadline_the_observation_passed_without_a_hang_does_not_spin() -> None:
    """A crash awaiting its exit record holds the hang back; the hang clock that ran out
    meanwhile must not make every wait zero (the exit-record poll paces that)."""
    o = obs(rank(0, step=4, last_progress_at=980.0), rank(1, step=4, last_progress_at=999.0))
    assert until_hang_check(request(), o, o.now) == math.inf


def test_time_spent_after_the_observation_shortens_the_wait_never_below_the_slack() -> None:
    o = obs(rank(0, step=4, last_progress_at=991.0), rank(1, step=4, last_progress_at=999.0))
    assert math.isclose(until_hang_check(request(), o, o.now + 0.5), 0.5 + HANG_CHECK_SLACK_S)
    assert until_hang_check(request(), o, o.now + 5.0) == HANG_CHECK_SLACK_S


# ------------------------------------------------------------------ dated progress


class Node:
    """One scripted node, two ranks, polled every ``interval_s`` on a fake clock."""

    def __init__(self, tmp_path: Path, shares_clock: bool) -> None:
        self.request = request(tmp_path)
        self.clock = FakeClock()
        self.agent = FakeAgent(NodeSpec())
        self.agent.shares_clock = shares_clock
        self.heartbeats: dict[int, dict[str, object]] = {}
        self.observer = GenerationObserver(self.request, [self.agent], clock=self.clock)

    def beat(self, step: int, written_at: float) -> None:
        for r in (0, 1):
            self.heartbeats[r] = {"step": step, "time": written_at}

    def observe(self) -> Observation:
        self.agent.reply = NodeStatus(
            node="local",
            reachable=True,
            observed_at=self.clock.wall(),
            ranks=[
                RankRecord(rank=r, pid=100 + r, alive=True, heartbeat=self.heartbeats.get(r))
                for r in (0, 1)
            ],
        )
        return self.observer.observe()


def test_on_the_controllers_clock_progress_dates_from_its_write(tmp_path: Path) -> None:
    node = Node(tmp_path, shares_clock=True)
    node.beat(1, node.clock.wall())
    node.observe()
    node.clock.advance(0.5)
    written = node.clock.wall() - 0.4  # written 0.1 s after the last poll
    node.beat(2, written)
    seen = node.observe()
    assert all(r.last_progress_at is not None for r in seen.ranks)
    assert [r.last_progress_at for r in seen.ranks] == pytest.approx([written, written])
    assert next_hang_check(node.request, seen) == pytest.approx(written + HANG_S)


def test_a_write_dated_outside_the_polls_window_is_kept_inside_it(tmp_path: Path) -> None:
    """A wall-clock step (or a stale timestamp) moves the date by at most the window the
    polls prove: after the previous ask, no later than now."""
    node = Node(tmp_path, shares_clock=True)
    node.beat(1, node.clock.wall())
    node.observe()
    previous_ask = node.clock.wall()
    node.clock.advance(0.5)
    node.beat(2, previous_ask - 3600.0)
    assert [r.last_progress_at for r in node.observe().ranks] == pytest.approx([previous_ask] * 2)
    node.clock.advance(0.5)
    node.beat(3, node.clock.wall() + 3600.0)
    assert [r.last_progress_at for r in node.observe().ranks] == pytest.approx(
        [node.clock.wall()] * 2
    )


def test_another_machines_progress_dates_from_the_poll_that_saw_it(tmp_path: Path) -> None:
    """Its clock may be off by any amount: never called hung early for that."""
    node = Node(tmp_path, shares_clock=False)
    node.beat(1, node.clock.wall())
    node.observe()
    node.clock.advance(0.5)
    node.beat(2, node.clock.wall() - 0.4)
    assert {r.last_progress_at for r in node.observe().ranks} == {node.clock.wall()}


def test_the_first_answer_has_no_window_and_dates_from_the_poll(tmp_path: Path) -> None:
    node = Node(tmp_path, shares_clock=True)
    node.beat(1, node.clock.wall() - 5.0)
    assert {r.last_progress_at for r in node.observe().ranks} == {node.clock.wall()}
