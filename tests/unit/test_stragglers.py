"""Straggler statistics and the supervisor's straggler rule, without processes."""

from __future__ import annotations

import pytest

from activities.straggler_stats import ComputeWindow, find_straggler
from activities.supervise_rules import Observation, evaluate
from lazarus.domain.contracts import RankStatus, SuperviseRequest
from lazarus.domain.spec import HealthSpec, StragglerSpec

SPEC = StragglerSpec(slowdown_factor=1.5, window_s=10, min_samples=4, mad_threshold=3)


def series(value: float, count: int = 8, start: float = 100.0) -> list[tuple[float, float]]:
    return [(start + i, value) for i in range(count)]


def test_a_2x_slower_rank_of_two_is_found_with_leave_one_out_medians() -> None:
    found = find_straggler({0: series(0.05), 1: series(0.10)}, SPEC)
    assert found is not None and found.rank == 1
    assert found.slowdown == pytest.approx(2.0)


def test_one_slow_step_is_not_a_straggler() -> None:
    spiky = series(0.05)
    spiky[3] = (103.0, 0.5)
    assert find_straggler({0: series(0.05), 1: spiky, 2: series(0.051)}, SPEC) is None


def test_below_the_factor_is_not_a_straggler() -> None:
    assert find_straggler({0: series(0.05), 1: series(0.07)}, SPEC) is None


def test_noisy_peers_need_a_bigger_gap_than_their_spread() -> None:
    noisy = {r: series(v) for r, v in enumerate([0.05, 0.08, 0.11, 0.06, 0.10])}
    noisy[5] = series(0.13)  # 1.6x the peer median, but within 3 MADs of the peers
    assert find_straggler(noisy, SPEC) is None
    noisy[5] = series(0.30)
    found = find_straggler(noisy, SPEC)
    assert found is not None and found.rank == 5


def test_too_few_samples_or_ranks_say_nothing() -> None:
    assert find_straggler({0: series(0.05, 3), 1: series(0.5, 3)}, SPEC) is None
    assert find_straggler({0: series(0.05)}, SPEC) is None


def test_known_stragglers_are_neither_judged_nor_peers() -> None:
    samples = {0: series(0.05), 1: series(0.05), 2: series(0.5)}
    assert find_straggler(samples, SPEC, ignore=frozenset({2})) is None


def test_slow_since_is_when_the_rank_crossed_the_threshold() -> None:
    slow = series(0.05, 4) + series(0.12, 6, start=104.0)
    found = find_straggler({0: series(0.05, 10), 1: slow}, SPEC)
    assert found is not None and found.slow_since == 104.0


def test_window_forgets_old_samples_and_duplicate_heartbeats() -> None:
    window = ComputeWindow(window_s=5)
    window.add(0, 100.0, 0.1)
    window.add(0, 100.0, 0.1)  # the same heartbeat polled twice
    window.add(0, 106.0, 0.2)
    assert window.recent(now=106.0) == {0: [(106.0, 0.2)]}


def request(**overrides: object) -> SuperviseRequest:
    base: dict[str, object] = {
        "job_id": "j",
        "generation": 1,
        "run_dir": "/tmp/x",
        "world_size": 2,
        "health": HealthSpec(hang_timeout_s=10),
        "straggler": SPEC,
    }
    return SuperviseRequest.model_validate({**base, **overrides})


def observation(**extra: object) -> Observation:
    ranks = [
        RankStatus(rank=r, node=f"n{r}", pid=100 + r, alive=True, step=50, last_progress_at=999.0)
        for r in range(2)
    ]
    compute = {0: series(0.05, start=990.0), 1: series(0.10, start=990.0)}
    return Observation(now=1000.0, launched_at=900.0, ranks=ranks, compute=compute, **extra)


def test_supervisor_reports_the_straggler_with_its_node() -> None:
    outcome = evaluate(request(), observation(), started_at=999.0)
    assert outcome is not None and outcome.kind == "straggler"
    assert outcome.straggler is not None
    assert (outcome.straggler.rank, outcome.straggler.node) == (1, "n1")


def test_supervisor_stays_quiet_about_known_or_disabled_stragglers() -> None:
    assert evaluate(request(known_stragglers=["n1"]), observation(), started_at=999.0) is None
    off = StragglerSpec(enabled=False)
    assert evaluate(request(straggler=off), observation(), started_at=999.0) is None
