"""The learned hang budget and slow phases (issue 38): pure arithmetic, the rules, the
observer on a scripted node with a fake clock, and the rank helper's side. No
processes, no sleeping."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import lazarus.rank as lazarus_rank
from activities.nodes.agent import NodeStatus, RankRecord
from activities.progress_cadence import (
    BACKOFF_MEMORY_S,
    LONG_MEMORY_S,
    WARMUP_INTERVALS,
    CadenceLearner,
    backoff_floor,
    budget_from,
    quantile,
)
from activities.supervise_observer import (
    BACKOFF_FILE,
    CADENCE_FILE,
    CADENCE_SAVE_EVERY_S,
    GenerationObserver,
    slow_phase_of,
)
from activities.supervise_rules import (
    NodeObservation,
    Observation,
    SlowPhase,
    allowed_silence,
    evaluate,
    learned_budget_fired,
    next_hang_check,
)
from lazarus.domain import environment, phases
from lazarus.domain.contracts import HangBudget, RankStatus, SuperviseOutcome, SuperviseRequest
from lazarus.domain.spec import HangBudgetSpec, HealthSpec, NodeSpec
from lazarus.rank import heartbeats, reset
from tests.fake_nodes import FakeAgent, FakeClock

HANG_S = 10.0


def health(**budget: object) -> HealthSpec:
    """The learned budget (the default) unless the test names another mode."""
    return HealthSpec(
        hang_timeout_s=HANG_S,
        startup_timeout_s=60,
        hang_budget=HangBudgetSpec.model_validate({"mode": "learned", **budget}),
    )


def request(tmp_path: Path | None = None, **budget: object) -> SuperviseRequest:
    return SuperviseRequest.model_validate(
        {
            "job_id": "j",
            "generation": 1,
            "run_dir": str((tmp_path or Path("/nonexistent")) / "gen-00001"),
            "world_size": 2,
            "nproc_per_node": 2,
            "health": health(**budget),
            "report_after_s": 1e9,
        }
    )


# ------------------------------------------------------------------ the arithmetic


def test_quantile_is_a_nearest_rank_of_real_intervals() -> None:
    values = [float(v) for v in range(1, 101)]
    assert quantile(values, 0.99) == 99.0
    assert quantile(values, 1.0) == 100.0
    assert quantile([0.2], 0.99) == 0.2


def test_until_enough_intervals_the_budget_is_hang_timeout() -> None:
    budget = budget_from(health(), [0.2] * 9, 9, 0.2)
    assert budget.source == "learning" and budget.budget_s == HANG_S
    assert budget.quantile_s == 0.2 and budget.intervals_seen == 9


def test_learned_budget_is_a_multiple_of_the_quantile_above_the_floor() -> None:
    fast = budget_from(health(), [0.2] * 100, 100, 0.2)
    assert fast.source == "learned" and fast.budget_s == 2.0  # 4 x 0.2 = 0.8 < floor
    slow = budget_from(health(), [0.6] * 99 + [0.9], 100, 0.9)
    assert slow.budget_s == pytest.approx(2.4)  # 4 x p99 (0.6)
    assert "learned" in slow.describe() and "p99" in slow.describe()


def test_the_longest_recent_interval_keeps_the_budget_above_it() -> None:
    # An undeclared 3 s pause (a plain script's save) seen once: 1.5 x 3 s from then on.
    budget = budget_from(health(), [0.2] * 100, 100, 3.0)
    assert budget.budget_s == pytest.approx(4.5)


def test_a_plain_scripts_log_progress_has_its_own_floor() -> None:
    # progress_regex lines alone: the script cannot declare its saves, evaluations or
    # data-loader stalls, so a 3 s save must not be called a hang the first time.
    plain = budget_from(health(), [0.5] * 100, 100, 0.6, log_progress=True)
    assert plain.source == "learned" and plain.budget_s == 10.0 == plain.log_floor_s
    assert "floor 10 s for log progress" in plain.describe()
    # ...capped by hang_timeout_s, and lowered by the spec when the script has no pauses
    tight = budget_from(health(log_floor_s=2.0), [0.5] * 100, 100, 0.6, log_progress=True)
    assert tight.budget_s == 2.0
    capped = budget_from(health(log_floor_s=30.0), [0.5] * 100, 100, 0.6, log_progress=True)
    assert capped.budget_s == HANG_S
    # heartbeats (the rank helper declares its phases) keep floor_s
    assert budget_from(health(), [0.5] * 100, 100, 0.6).budget_s == 2.0


def test_the_learned_budget_is_the_default() -> None:
    assert HealthSpec().hang_budget.mode == "learned"
    assert HangBudgetSpec().log_floor_s == 10.0


def test_hang_timeout_caps_every_budget() -> None:
    assert budget_from(health(), [5.0] * 100, 100, 5.0).budget_s == HANG_S
    pinned = budget_from(health(mode="pinned", pinned_s=60.0), [], 0, None)
    assert pinned.source == "pinned" and pinned.budget_s == HANG_S


def test_pinned_applies_from_the_start_and_off_is_hang_timeout() -> None:
    pinned = budget_from(health(mode="pinned", pinned_s=3.0), [], 0, None)
    assert pinned.budget_s == 3.0 and pinned.source == "pinned"
    off = budget_from(health(mode="off"), [0.2] * 100, 100, 0.2)
    assert off.budget_s == HANG_S and off.source == "off"


def test_pinned_needs_a_value() -> None:
    with pytest.raises(ValueError, match="pinned_s"):
        HangBudgetSpec(mode="pinned")


def test_the_learner_skips_warmups_and_slow_phases() -> None:
    learner = CadenceLearner(health())
    for i in range(WARMUP_INTERVALS):  # compilation, the first steps: not the rhythm
        assert not learner.add(0, 30.0, float(i), in_slow_phase=False)
    assert not learner.add(0, 3.0, 10.0, in_slow_phase=True)
    assert learner.add(0, 0.2, 11.0, in_slow_phase=False)
    assert learner.longest_recent(11.0) == 0.2
    assert learner.budget(11.0).intervals_seen == 1


def test_the_longest_interval_is_forgotten_after_the_memory() -> None:
    learner = CadenceLearner(health())
    for i in range(WARMUP_INTERVALS):
        learner.add(0, 0.2, float(i), in_slow_phase=False)
    learner.add(0, 3.0, 100.0, in_slow_phase=False)
    for i in range(200):  # p99 of 201 intervals is not the one long one
        learner.add(0, 0.2, 101.0 + i, in_slow_phase=False)
    assert learner.budget(340.0).budget_s == pytest.approx(4.5)
    assert learner.longest_recent(100.0 + LONG_MEMORY_S + 1) == 0.2
    assert learner.budget(100.0 + LONG_MEMORY_S + 1).budget_s == 2.0


# ------------------------------------------------------------------ the rules


def rank(r: int, **fields: object) -> RankStatus:
    base: dict[str, object] = {"rank": r, "pid": 100 + r, "alive": True, "node": "local"}
    return RankStatus.model_validate({**base, **fields})


LEARNED = HangBudget(
    budget_s=2.0, source="learned", quantile=0.99, quantile_s=0.21, intervals_seen=240
)


def obs(*ranks: RankStatus, now: float = 1000.0, **extra: object) -> Observation:
    return Observation(now=now, launched_at=900.0, ranks=list(ranks), **extra)  # type: ignore[arg-type]


def test_a_learned_budget_calls_a_silent_rank_hung_in_seconds() -> None:
    req = request()
    quiet = obs(rank(0, step=50, last_progress_at=997.5), rank(1, step=51, last_progress_at=999.9))
    assert evaluate(req, quiet, 900.0) is None  # without a budget: hang_timeout_s
    hung = obs(
        rank(0, step=50, last_progress_at=997.5, stopped_by_signal=True),
        rank(1, step=51, last_progress_at=999.9),
        hang_budget=LEARNED,
    )
    outcome = evaluate(req, hung, 900.0)
    assert outcome is not None and outcome.failure is not None
    failure = outcome.failure
    assert failure.kind == "hang" and failure.rank == 0
    assert failure.hang_budget == LEARNED and failure.slow_phase is None
    assert "hang budget 2.00 s learned" in failure.evidence[0]
    assert "240 intervals" in failure.evidence[0]


def test_the_hang_check_comes_at_the_learned_deadline() -> None:
    o = obs(rank(0, step=50, last_progress_at=999.0), hang_budget=LEARNED)
    assert next_hang_check(request(), o) == 1001.0


def test_a_rank_in_a_slow_phase_and_its_peers_get_the_phases_budget() -> None:
    req = request()
    phase = {0: SlowPhase(phases.CHECKPOINT_SAVE)}
    saving = obs(
        rank(0, step=50, last_progress_at=996.0),
        rank(1, step=50, last_progress_at=995.8),  # waits in the save's barrier
        hang_budget=LEARNED,
        slow_phases=phase,
    )
    assert allowed_silence(req, saving, saving.ranks[0]) == (HANG_S, phases.CHECKPOINT_SAVE)
    assert allowed_silence(req, saving, saving.ranks[1]) == (HANG_S, phases.CHECKPOINT_SAVE)
    assert evaluate(req, saving, 900.0) is None
    declared = obs(rank(0, step=50), slow_phases={0: SlowPhase("evaluation", budget_s=4.0)})
    assert allowed_silence(req, declared, declared.ranks[0]) == (4.0, "evaluation")
    capped = obs(rank(0, step=50), slow_phases={0: SlowPhase("evaluation", budget_s=600.0)})
    assert allowed_silence(req, capped, capped.ranks[0])[0] == HANG_S


def test_a_phase_spent_names_the_rank_in_it_not_the_peer_that_waited_longer() -> None:
    hung = obs(
        rank(0, step=50, last_progress_at=994.0),
        rank(1, step=49, last_progress_at=989.0),  # quiet since before rank 0's save began
        hang_budget=LEARNED,
        slow_phases={0: SlowPhase(phases.CHECKPOINT_SAVE, budget_s=5.0)},
    )
    outcome = evaluate(request(), hung, 900.0)
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.rank == 0 and outcome.failure.slow_phase == phases.CHECKPOINT_SAVE
    assert "slow phase 'checkpoint_save' allows 5.00 s" in outcome.failure.evidence[0]


def test_after_a_phase_the_peers_clocks_start_at_its_end() -> None:
    # Rank 1 waited in the save's barrier since 996; the save was last seen open at
    # 999.5: its next heartbeat is a step away, not overdue.
    after = obs(
        rank(0, step=51, last_progress_at=999.6),
        rank(1, step=50, last_progress_at=996.0),
        hang_budget=LEARNED,
        slow_phase_over_at=999.5,
    )
    assert evaluate(request(), after, 900.0) is None
    assert next_hang_check(request(), after) == 1001.5
    still_open = obs(
        rank(0, step=50, last_progress_at=985.0),
        hang_budget=LEARNED,
        slow_phases={0: SlowPhase(phases.CHECKPOINT_SAVE)},
        slow_phase_over_at=1000.0,
    )
    outcome = evaluate(request(), still_open, 900.0)  # a phase open does not reset clocks
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.slow_phase == phases.CHECKPOINT_SAVE


def test_once_a_rank_finished_the_others_get_hang_timeout() -> None:
    # Its peers are in their own last steps: the final save, the barrier, teardown.
    finishing = obs(
        rank(0, step=120, alive=False, exit_code=0),
        rank(1, step=120, last_progress_at=995.0),
        hang_budget=LEARNED,
    )
    assert allowed_silence(request(), finishing, finishing.ranks[1]) == (HANG_S, None)
    assert evaluate(request(), finishing, 900.0) is None


def test_while_a_node_is_silent_its_peers_are_not_hung_by_the_learned_budget() -> None:
    # Survivors blocked in a collective on a dead node's ranks: its loss is for
    # node_timeout_s to judge; called hung first, the loss would be handled as a hang.
    blocked = obs(
        rank(0, step=50, last_progress_at=996.0, node="a"),
        rank(1, step=50, last_progress_at=996.0, node="b"),
        hang_budget=LEARNED,
        nodes={
            "a": NodeObservation(reachable=True),
            "b": NodeObservation(reachable=False, unreachable_since=996.5, failed_polls=1),
        },
    )
    assert allowed_silence(request(), blocked, blocked.ranks[0]) == (HANG_S, None)
    assert evaluate(request(), blocked, 900.0) is None
    waiting = obs(
        rank(0, step=50, last_progress_at=996.0, node="a"),
        hang_budget=LEARNED,
        nodes={"a": NodeObservation(reachable=True), "b": NodeObservation(True, waiting=True)},
    )
    assert allowed_silence(request(), waiting, waiting.ranks[0]) == (HANG_S, None)


def test_slow_but_moving_is_never_a_hang() -> None:
    # A straggler makes progress inside the budget, however slowly it steps.
    o = obs(rank(0, step=50, last_progress_at=998.5), hang_budget=LEARNED)
    assert evaluate(request(), o, 900.0) is None


def test_a_malformed_slow_phase_is_no_phase() -> None:
    assert slow_phase_of({"slow_phase": "saving"}) is None
    assert slow_phase_of({"slow_phase": {"name": ""}}) is None
    assert slow_phase_of({"slow_phase": {"name": "eval", "budget_s": -1}}) == SlowPhase("eval")
    assert slow_phase_of({"slow_phase": {"name": "eval", "budget_s": 3}}) == SlowPhase("eval", 3.0)


# ------------------------------------------------------------------ the observer


class Job:
    """One node, two ranks, heartbeats written on the controller's clock."""

    def __init__(self, tmp_path: Path, **budget: object) -> None:
        self.request = request(tmp_path, **budget)
        self.clock = FakeClock()
        self.agent = FakeAgent(NodeSpec())
        self.beats: dict[int, dict[str, object]] = {}
        self.started_at = self.clock.wall()
        self.observer = GenerationObserver(self.request, [self.agent], clock=self.clock)

    def beat(self, rank: int, step: int, **extra: object) -> None:
        self.beats[rank] = {"step": step, "time": self.clock.wall(), **extra}

    def poll(self) -> SuperviseOutcome | None:
        self.agent.reply = NodeStatus(
            node="local",
            reachable=True,
            observed_at=self.clock.wall(),
            ranks=[
                RankRecord(rank=r, pid=100 + r, alive=True, heartbeat=self.beats.get(r))
                for r in range(2)
            ],
        )
        self.last = self.observer.observe()
        return evaluate(self.request, self.last, self.started_at)

    def train(self, steps: int, every: float = 0.2, first: int = 1) -> None:
        for step in range(first, first + steps):
            self.clock.advance(every)
            self.beat(0, step)
            self.beat(1, step)
            assert self.poll() is None

    def silence(self, limit: float, step: float = 0.05) -> tuple[SuperviseOutcome | None, float]:
        """Poll without new heartbeats until a failure or ``limit`` seconds."""
        quiet_from = self.clock.wall()
        while self.clock.wall() - quiet_from < limit:
            self.clock.advance(step)
            outcome = self.poll()
            if outcome is not None:
                return outcome, self.clock.wall() - quiet_from
        return None, limit


def test_the_observer_learns_the_rhythm_and_finds_a_hang_in_seconds(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.train(40)  # 0.2 s between heartbeats
    budget = job.last.hang_budget
    assert budget is not None and budget.source == "learned"
    assert budget.budget_s == pytest.approx(2.0)
    assert budget.intervals_seen == 2 * (39 - WARMUP_INTERVALS)
    outcome, after = job.silence(HANG_S)
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "hang"
    assert 2.0 < after <= 2.1, f"hung after {after:.2f} s of silence, budget 2 s"


@pytest.mark.parametrize(("shares_clock", "learned_s"), [(True, 0.2), (False, 0.5)])
def test_on_this_machine_the_ranks_own_write_gaps_are_learned(
    tmp_path: Path, shares_clock: bool, learned_s: float
) -> None:
    # Heartbeats every 0.2 s, polls every 0.5 s: the polls see gaps of 0.5 s, but a
    # rank dated at its write is only ever silent for its own 0.2 s between writes. On
    # another machine progress dates from the poll that saw it: 0.5 s it is.
    job = Job(tmp_path, floor_s=0.5)
    job.agent.shares_clock = shares_clock
    for step in range(1, 41):
        job.clock.advance(0.5)
        job.beat(0, step, gap_s=0.2)
        job.beat(1, step, gap_s=0.2)
        assert job.poll() is None
    budget = job.last.hang_budget
    assert budget is not None and budget.quantile_s == pytest.approx(learned_s)
    assert budget.budget_s == pytest.approx(4 * learned_s)  # above the 0.5 s floor


def test_before_enough_intervals_a_hang_takes_hang_timeout(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.train(8)  # a restart's first steps: too few to judge by
    assert job.last.hang_budget is not None and job.last.hang_budget.source == "learning"
    outcome, after = job.silence(HANG_S + 1)
    assert outcome is not None and after > HANG_S


def test_a_declared_3s_save_is_no_hang_with_a_1s_budget(tmp_path: Path) -> None:
    job = Job(tmp_path, floor_s=0.5, multiplier=5.0)
    job.train(40)
    assert job.last.hang_budget is not None
    assert job.last.hang_budget.budget_s == pytest.approx(1.0)
    # Rank 0 saves for 3 s; rank 1 waits in the barrier, silent, without a phase.
    job.clock.advance(0.1)
    job.beat(0, 40, slow_phase={"name": phases.CHECKPOINT_SAVE, "budget_s": None})
    outcome, _ = job.silence(3.0)
    assert outcome is None, outcome and outcome.failure
    job.beat(0, 40)  # the save is over
    job.train(5, first=41)
    budget = job.last.hang_budget
    assert budget is not None
    assert budget.budget_s == pytest.approx(1.0), "the save was learned as rhythm"
    outcome, after = job.silence(5.0)  # an undeclared pause of the same length is a hang
    assert outcome is not None and outcome.failure is not None and after < 1.2


def test_the_next_supervision_of_the_generation_starts_from_what_was_learned(
    tmp_path: Path,
) -> None:
    (tmp_path / "gen-00001").mkdir()
    job = Job(tmp_path)
    job.train(10)
    job.clock.advance(3.0)  # an undeclared 3 s pause, then the rhythm again
    job.train(150, first=11)  # the pause is under 1 % of the intervals: p99 is the rhythm
    first = job.last.hang_budget
    assert first is not None and first.budget_s == pytest.approx(1.5 * 3.2)
    job.clock.advance(CADENCE_SAVE_EVERY_S)
    job.poll()  # writes the learner back
    assert (tmp_path / "gen-00001" / CADENCE_FILE).exists()
    # The next supervise activity (report_interval_s later): no warm-up, no relearning.
    later = GenerationObserver(job.request, [job.agent], clock=job.clock)
    job.observer = later
    job.train(2, first=161)
    again = job.last.hang_budget
    assert again is not None and again.source == "learned"
    assert again.budget_s == pytest.approx(1.5 * 3.2)
    assert again.intervals_seen >= first.intervals_seen


def test_a_hang_the_learned_budget_declared_doubles_the_next_generations(
    tmp_path: Path,
) -> None:
    # A plain script's undeclared pause, longer than the budget, is never learned (its
    # rank is stopped first): without this every generation would be stopped at it.
    (tmp_path / "gen-00001").mkdir()
    job = Job(tmp_path)
    job.train(40)
    outcome, _ = job.silence(HANG_S)
    assert outcome is not None and outcome.failure is not None
    # A stopped process is certainly hung: nothing to back off from.
    assert learned_budget_fired(outcome.failure, HANG_S, culprit_stopped=True) is None
    fired = learned_budget_fired(outcome.failure, HANG_S)
    assert fired is not None and fired == pytest.approx(2.0)
    job.observer.note_learned_hang(fired)
    assert (tmp_path / BACKOFF_FILE).exists()
    next_gen = request(tmp_path).model_copy(update={"run_dir": str(tmp_path / "gen-00002")})
    job.request = next_gen
    job.observer = GenerationObserver(next_gen, [job.agent], clock=job.clock)
    job.train(40, first=100)
    budget = job.last.hang_budget
    assert budget is not None and budget.budget_s == pytest.approx(4.0)
    assert budget.backoff_floor_s == pytest.approx(4.0)
    assert "at least 4 s after a hang" in budget.describe()
    assert backoff_floor([(0.0, 2.0), (10.0, 4.0)], 20.0) == 8.0
    assert backoff_floor([(0.0, 2.0)], BACKOFF_MEMORY_S + 1) is None


def test_only_a_learned_budget_hang_backs_off() -> None:
    req = request()
    by_timeout = obs(rank(0, step=5, last_progress_at=980.0, stopped_by_signal=True))
    outcome = evaluate(req, by_timeout, 900.0)
    assert outcome is not None and outcome.failure is not None
    assert learned_budget_fired(outcome.failure, HANG_S) is None
    in_phase = obs(
        rank(0, step=5, last_progress_at=980.0),
        hang_budget=LEARNED,
        slow_phases={0: SlowPhase("evaluation")},
    )
    outcome = evaluate(req, in_phase, 900.0)
    assert outcome is not None and outcome.failure is not None
    assert learned_budget_fired(outcome.failure, HANG_S) is None


def test_a_malformed_memory_is_ignored() -> None:
    learner = CadenceLearner(health())
    assert not learner.restore({"version": 2}, 0.0, 0.0)
    assert not learner.restore("junk", 0.0, 0.0)
    assert learner.restore(
        {"version": 1, "intervals": [0.2, "x", -1], "seen": 1, "longest": [[1, "y"]]}, 0.0, 0.0
    )
    assert learner.budget(0.0).quantile_s == 0.2


def test_the_live_view_carries_the_budget_and_the_phases(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.train(30)
    job.beat(1, 30, slow_phase={"name": "evaluation"})
    job.poll()
    details = job.observer.heartbeat_details(job.last, None)
    assert details.hang_budget is not None and details.hang_budget.source == "learned"
    assert details.slow_phases == {1: "evaluation"}


# ------------------------------------------------------------------ the rank helper


@pytest.fixture
def heartbeat_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    for name in (environment.RANK, environment.CHECKPOINT_DIR, environment.CONTROL_FILE):
        monkeypatch.delenv(name, raising=False)
    beat = tmp_path / "hb.json"
    monkeypatch.setenv(environment.HEARTBEAT_FILE, str(beat))
    monkeypatch.setenv(environment.HEARTBEAT_INTERVAL, "3600")
    reset._reset_state()
    yield beat
    reset._reset_state()


def _slow_phase(path: Path) -> object:
    return json.loads(path.read_text()).get(phases.SLOW_PHASE_FIELD)


def test_a_slow_phase_is_written_at_once_and_cleared_at_its_end(heartbeat_file: Path) -> None:
    lazarus_rank.heartbeat(5)
    with lazarus_rank.slow_phase("evaluation", budget_s=30):
        assert _slow_phase(heartbeat_file) == {"name": "evaluation", "budget_s": 30}
        lazarus_rank.heartbeat(5)  # throttled, and still in the phase
    assert _slow_phase(heartbeat_file) is None
    with pytest.raises(ValueError, match="budget_s"):
        lazarus_rank.enter_slow_phase("evaluation", budget_s=0)


def test_each_heartbeat_says_how_long_since_the_previous_write(heartbeat_file: Path) -> None:
    lazarus_rank.heartbeat(1)
    assert environment.HEARTBEAT_GAP_S not in json.loads(heartbeat_file.read_text())
    lazarus_rank.flush_heartbeat()
    gap = json.loads(heartbeat_file.read_text())[environment.HEARTBEAT_GAP_S]
    assert isinstance(gap, float) and 0 <= gap < 5


def test_a_clean_exit_declares_finishing(heartbeat_file: Path) -> None:
    lazarus_rank.heartbeat(7)
    heartbeats._flush_at_exit()
    assert _slow_phase(heartbeat_file) == {"name": phases.FINISHING, "budget_s": None}


def test_a_save_is_a_slow_phase_until_the_next_step(
    heartbeat_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path / "ckpt"))
    monkeypatch.setenv(environment.RANK, "1")  # a rank that writes its shard, never commits
    reset._reset_state()
    lazarus_rank.heartbeat(10)
    lazarus_rank.checkpoint_path(10)
    assert _slow_phase(heartbeat_file) == {"name": phases.CHECKPOINT_SAVE, "budget_s": None}
    lazarus_rank.heartbeat(10)
    assert _slow_phase(heartbeat_file) == {"name": phases.CHECKPOINT_SAVE, "budget_s": None}
    lazarus_rank.heartbeat(11)  # beyond the save's step: written at once, without the phase
    assert _slow_phase(heartbeat_file) is None
    assert json.loads(heartbeat_file.read_text())["step"] == 11


# ------------------------------------------------------------------ status


def test_status_shows_the_live_budget_and_the_ranks_in_a_slow_phase() -> None:
    from rich.console import Console

    from lazarus.app import cli_render
    from lazarus.domain.contracts import SupervisionProgress

    live = SupervisionProgress(
        generation=1,
        step=120,
        alive=2,
        world_size=2,
        observed_at=1.0,
        progress_signal="heartbeat",
        hang_budget=LEARNED,
        slow_phases={0: phases.CHECKPOINT_SAVE},
    )
    view = cli_render.StatusView("lazarus-tiny", "RUNNING", None, live=live)
    console = Console(width=200, record=True, color_system=None)
    console.print(cli_render.render_status(view))
    text = console.export_text()
    assert "hang budget" in text
    assert "2.00 s learned (p99 0.21 s, 240 intervals); rank 0 in checkpoint_save" in text
