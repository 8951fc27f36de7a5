"""Hang and straggler clocks run on the controller's clock only (issue 10, defect 16),
and a job with no progress signal is never called hung (defect 17).

A scripted agent reports heartbeats stamped by a node whose clock is off; a fake
controller clock moves one poll at a time. No processes, no sleeping.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.nodes.agent import NodeStatus, RankRecord
from activities.supervise_observer import GenerationObserver
from activities.supervise_rules import Observation, evaluate
from lazarus.domain.contracts import SuperviseOutcome, SuperviseRequest
from lazarus.domain.spec import HangBudgetSpec, HealthSpec, NodeSpec, StragglerSpec
from tests.fake_nodes import FakeAgent, FakeClock

HANG_S = 10.0
STARTUP_S = 20.0


def request(tmp_path: Path, world_size: int = 1, **overrides: object) -> SuperviseRequest:
    base: dict[str, object] = {
        "job_id": "j",
        "generation": 1,
        "run_dir": str(tmp_path / "gen-00001"),
        "world_size": world_size,
        "nproc_per_node": world_size,
        # The clock-skew rules, against the fixed timeout: the learned budget (issue 38)
        # dates intervals on the same clocks, and tests/unit/test_hang_budget.py has it.
        "health": HealthSpec(
            hang_timeout_s=HANG_S,
            startup_timeout_s=STARTUP_S,
            hang_budget=HangBudgetSpec(mode="off"),
        ),
        "report_after_s": 1e9,
    }
    return SuperviseRequest.model_validate({**base, **overrides})


class Job:
    """One node, ``world_size`` ranks, all alive; heartbeats written by a node whose
    clock reads ``skew_s`` off the controller's."""

    def __init__(self, tmp_path: Path, world_size: int = 1, **overrides: object) -> None:
        self.request = request(tmp_path, world_size, **overrides)
        self.clock = FakeClock()
        self.agent = FakeAgent(NodeSpec())
        self.heartbeats: dict[int, dict[str, object] | None] = dict.fromkeys(range(world_size))
        self.started_at = self.clock.wall()
        self.observer = GenerationObserver(self.request, [self.agent], clock=self.clock)

    def beat(self, rank: int, step: int, skew_s: float, **extra: object) -> None:
        self.heartbeats[rank] = {"step": step, "time": self.clock.wall() + skew_s, **extra}

    def observe(self) -> Observation:
        self.agent.reply = NodeStatus(
            node="local",
            reachable=True,
            observed_at=self.clock.wall(),
            ranks=[
                RankRecord(rank=r, pid=100 + r, alive=True, heartbeat=hb)
                for r, hb in self.heartbeats.items()
            ],
        )
        return self.observer.observe()

    def poll(self) -> SuperviseOutcome | None:
        return evaluate(self.request, self.observe(), self.started_at)


@pytest.mark.parametrize("skew_s", [-10.5, 10.5, -3600.0])
def test_a_skewed_node_is_hung_only_when_its_step_stops(tmp_path: Path, skew_s: float) -> None:
    job = Job(tmp_path)
    for step in range(1, 41):  # 40 s of training, one step per second
        job.beat(0, step, skew_s)
        assert job.poll() is None, f"step {step} advances: not a hang (node clock {skew_s:+} s)"
        job.clock.advance(1.0)
    stalled_at = job.clock.wall() - 1.0  # the last new step was seen one poll ago
    outcome = None
    while outcome is None:
        outcome = job.poll()
        assert job.clock.wall() - stalled_at <= HANG_S + 1.0, "the stall was not noticed"
        job.clock.advance(1.0)
    assert outcome.failure is not None and outcome.failure.kind == "hang"
    silent = job.clock.wall() - 1.0 - stalled_at
    assert silent > HANG_S, "declared hung before hang_timeout_s of silence"
    assert outcome.progress_signal == "heartbeat"


def test_the_straggler_window_holds_a_skewed_nodes_samples(tmp_path: Path) -> None:
    straggler = StragglerSpec(
        enabled=True, slowdown_factor=1.5, window_s=10, min_samples=4, mad_threshold=3
    )
    job = Job(tmp_path, world_size=2, straggler=straggler)
    outcome = None
    for step in range(1, 12):
        job.beat(0, step, 0.0, compute_s=0.05)
        job.beat(1, step, -60.0, compute_s=0.10)  # rank 1's node is a minute behind
        outcome = job.poll()
        if outcome is not None:
            break
        job.clock.advance(1.0)
    assert outcome is not None and outcome.straggler is not None, "the slow rank was missed"
    assert outcome.straggler.rank == 1
    assert job.clock.wall() - 11 <= outcome.straggler.slow_since <= job.clock.wall()


def test_a_retried_supervisor_keeps_the_hang_clock(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.beat(0, 5, -30.0)
    assert job.poll() is None
    job.clock.advance(6.0)
    assert job.poll() is None
    memory = job.observer.heartbeat_details(job.observe(), None)
    # A worker crash: a new attempt restores the memory and sees the same heartbeat.
    job.observer = GenerationObserver(job.request, [job.agent], clock=job.clock)
    job.observer.restore(memory)
    job.clock.advance(5.0)  # 11 s since step 5 was first seen
    outcome = job.poll()
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "hang"


# ---------------------------------------------------------------- no progress signal


def test_without_heartbeats_or_regex_hang_detection_is_off(tmp_path: Path) -> None:
    job = Job(tmp_path)  # a plain torchrun script: no heartbeat file ever appears
    outcome = job.poll()
    assert outcome is None
    job.clock.advance(STARTUP_S + 1)
    assert job.poll() is None, "no progress signal: never a hang"
    job.clock.advance(10 * STARTUP_S)
    job.request = job.request.model_copy(update={"report_after_s": 0.0})
    outcome = job.poll()
    assert outcome is not None and outcome.kind == "progress"
    assert outcome.progress_signal == "none"
    assert job.observer.heartbeat_details(job.observe(), None).progress_signal == "none"


def test_without_a_progress_signal_crashes_are_still_detected(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.clock.advance(STARTUP_S + 5)
    assert job.poll() is None
    job.agent.reply = NodeStatus(
        node="local",
        reachable=True,
        observed_at=job.clock.wall(),
        ranks=[RankRecord(rank=0, pid=100, exit={"exit_code": 1, "signal": None, "ended_at": 1.0})],
    )
    outcome = evaluate(job.request, job.observer.observe(), job.started_at)
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "crash"


def test_without_a_progress_signal_a_recovery_closes_after_the_startup_timeout(
    tmp_path: Path,
) -> None:
    """No step is ever seen: surviving startup_timeout_s is the first sign of life, or
    every later crash would count toward a crash loop."""
    job = Job(tmp_path, report_first_step=True)
    assert job.poll() is None
    job.clock.advance(STARTUP_S + 1)
    outcome = job.poll()
    assert outcome is not None and outcome.kind == "first_step"
    assert outcome.first_step_at == job.clock.wall()


def test_the_signal_is_unknown_until_the_startup_timeout(tmp_path: Path) -> None:
    job = Job(tmp_path)
    assert job.observe().progress_signal is None
    job.beat(0, 1, 0.0)
    assert job.observe().progress_signal == "heartbeat"


def test_a_progress_regex_keeps_hang_detection_on(tmp_path: Path) -> None:
    health = HealthSpec(
        hang_timeout_s=HANG_S, startup_timeout_s=STARTUP_S, progress_regex=r"step (\d+)"
    )
    job = Job(tmp_path, health=health)
    assert job.poll() is None
    job.clock.advance(STARTUP_S + 1)
    outcome = job.poll()
    assert outcome is not None and outcome.failure is not None, "the regex never matched"
    assert outcome.failure.kind == "hang" and outcome.progress_signal == "log"


def test_log_steps_are_timed_by_the_controller(tmp_path: Path) -> None:
    health = HealthSpec(
        hang_timeout_s=HANG_S, startup_timeout_s=STARTUP_S, progress_regex=r"step (\d+)"
    )
    job = Job(tmp_path, health=health)
    for step in range(1, 30):
        job.agent.logs[0] = "".join(f"step {s}\n" for s in range(1, step + 1))
        assert job.poll() is None
        job.clock.advance(1.0)
    job.clock.advance(HANG_S)
    outcome = job.poll()
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "hang"


def test_heartbeats_that_start_late_give_silent_peers_a_hang_timeout(tmp_path: Path) -> None:
    """Progress first seen after the startup timeout (a slow data load): a rank that
    has not written its first heartbeat yet is not hung at once."""
    job = Job(tmp_path, world_size=2)
    job.clock.advance(STARTUP_S + 30)
    assert job.poll() is None  # no signal yet: off
    job.beat(0, 1, 0.0)
    assert job.poll() is None, "rank 1 gets hang_timeout_s from the first heartbeat"
    job.clock.advance(HANG_S - 1)
    job.beat(0, 2, 0.0)
    assert job.poll() is None
    job.clock.advance(2.0)
    job.beat(0, 3, 0.0)
    outcome = job.poll()
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "hang" and outcome.failure.rank == 1


def test_an_anchored_progress_regex_matches_every_line_of_the_tail(tmp_path: Path) -> None:
    """``^step`` (the pattern most scripts' lines suggest) matches at each line of the
    log's tail, not only its first: the step advances, and a steady job is no hang."""
    health = HealthSpec(
        hang_timeout_s=HANG_S,
        startup_timeout_s=STARTUP_S,
        progress_regex=r"^step (?P<step>\d+)",
        hang_budget=HangBudgetSpec(mode="off"),
    )
    job = Job(tmp_path, health=health)
    for step in range(1, 30):
        job.agent.logs[0] = "".join(f"step {s}\nloss 0.1\n" for s in range(1, step + 1))
        assert job.poll() is None, f"a steady job called hung at step {step}"
        job.clock.advance(HANG_S / 2)
    assert job.observer._regex_steps[0] == 29
