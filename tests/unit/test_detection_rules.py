"""Detection rules of the supervisor, on hand-made observations (no processes)."""

from __future__ import annotations

from activities.supervise_rules import Observation, StepRate, evaluate
from lazarus.domain.contracts import RankStatus, SuperviseRequest
from lazarus.domain.spec import HealthSpec

HEALTH = HealthSpec(hang_timeout_s=10, startup_timeout_s=60)


def request(**overrides: object) -> SuperviseRequest:
    base: dict[str, object] = {
        "job_id": "j",
        "generation": 2,
        "run_dir": "/nonexistent",
        "world_size": 2,
        "health": HEALTH,
    }
    return SuperviseRequest.model_validate({**base, **overrides})


def rank(r: int, **fields: object) -> RankStatus:
    base: dict[str, object] = {"rank": r, "pid": 100 + r, "alive": True}
    return RankStatus.model_validate({**base, **fields})


def obs(*ranks: RankStatus, now: float = 1000.0, **extra: object) -> Observation:
    return Observation(now=now, launched_at=900.0, ranks=list(ranks), **extra)  # type: ignore[arg-type]


def test_healthy_generation_keeps_supervising() -> None:
    o = obs(rank(0, step=5, last_progress_at=999.0), rank(1, step=5, last_progress_at=999.5))
    assert evaluate(request(), o, started_at=990.0) is None


def test_first_failing_rank_is_the_root_cause_and_the_rest_collateral() -> None:
    o = obs(
        rank(0, alive=False, exit_code=1, ended_at=995.0, step=7),
        rank(1, alive=False, exit_code=-9, signal="SIGKILL", ended_at=994.0, step=8),
    )
    outcome = evaluate(request(), o, started_at=990.0)
    assert outcome is not None and outcome.kind == "failed" and outcome.failure is not None
    assert outcome.failure.rank == 1 and outcome.failure.collateral_ranks == [0]
    assert outcome.failure.fault_at == 994.0 and outcome.failure.step_at_failure == 8


def test_all_ranks_exiting_zero_is_success() -> None:
    o = obs(rank(0, alive=False, exit_code=0), rank(1, alive=False, exit_code=0))
    outcome = evaluate(request(), o, started_at=990.0)
    assert outcome is not None and outcome.kind == "succeeded"


def test_stalled_ranks_are_a_hang_and_the_stopped_one_is_named() -> None:
    o = obs(
        rank(0, step=40, last_progress_at=985.0),
        rank(1, step=40, last_progress_at=986.0, stopped_by_signal=True),
    )
    outcome = evaluate(request(), o, started_at=900.0)
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "hang" and outcome.failure.rank == 1
    assert outcome.failure.collateral_ranks == [0]


def test_without_a_stopped_process_the_lowest_step_is_named() -> None:
    o = obs(rank(0, step=41, last_progress_at=980.0), rank(1, step=40, last_progress_at=985.0))
    outcome = evaluate(request(), o, started_at=900.0)
    assert outcome is not None and outcome.failure is not None and outcome.failure.rank == 1


def test_one_slow_poll_below_the_timeout_is_not_a_hang() -> None:
    o = obs(rank(0, step=40, last_progress_at=991.0), rank(1, step=40, last_progress_at=991.0))
    assert evaluate(request(), o, started_at=900.0) is None


def test_no_heartbeat_before_startup_timeout_is_fine_after_it_is_a_hang() -> None:
    quiet = (rank(0), rank(1))
    assert evaluate(request(), obs(*quiet, now=950.0), started_at=900.0) is None
    outcome = evaluate(request(), obs(*quiet, now=961.0), started_at=900.0)
    assert outcome is not None and outcome.failure is not None and outcome.failure.kind == "hang"


def test_a_rank_gone_without_exit_status_is_reported_after_a_grace() -> None:
    gone = (
        rank(0, step=3, last_progress_at=999.0),
        rank(1, alive=False, step=3, last_progress_at=999.0),
    )
    assert evaluate(request(), obs(*gone, dead_since={1: 999.5}), started_at=990.0) is None
    outcome = evaluate(request(), obs(*gone, dead_since={1: 998.0}), started_at=990.0)
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "vanished" and outcome.failure.rank == 1


def test_first_step_after_resume_closes_the_recovery() -> None:
    r = request(resume_step=20, report_first_step=True)
    before = obs(rank(0, step=20, last_progress_at=999.0), rank(1, step=20, last_progress_at=998.0))
    assert evaluate(r, before, started_at=990.0) is None
    after = obs(rank(0, step=21, last_progress_at=999.2), rank(1, step=21, last_progress_at=999.4))
    outcome = evaluate(r, after, started_at=990.0)
    assert outcome is not None and outcome.kind == "first_step" and outcome.first_step_at == 999.2


def test_progress_is_reported_only_after_the_interval() -> None:
    r = request(report_after_s=60)
    healthy = obs(rank(0, step=5, last_progress_at=999.0), rank(1, step=5, last_progress_at=999.0))
    assert evaluate(r, healthy, started_at=950.0) is None
    outcome = evaluate(r, healthy, started_at=900.0)
    assert outcome is not None and outcome.kind == "progress" and outcome.step == 5


def test_step_rate_measures_seconds_per_step() -> None:
    rate = StepRate()
    assert rate.update([rank(0, step=10, last_progress_at=100.0)]) is None
    assert rate.update([rank(0, step=20, last_progress_at=105.0)]) == 0.5


def test_a_rank_that_vanished_before_a_peer_crashed_is_the_root_cause() -> None:
    o = obs(
        rank(0, alive=False, step=9),
        rank(1, alive=False, exit_code=1, ended_at=999.8, step=9),
        dead_since={0: 998.0},
    )
    outcome = evaluate(request(), o, started_at=990.0)
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "vanished" and outcome.failure.rank == 0


def test_a_stopped_rank_is_named_even_when_its_peer_went_quiet_first() -> None:
    """Heartbeats are throttled: the blocked peer's last write can be older than the
    stopped rank's, so only the peer is past the timeout when the hang is found."""
    o = obs(
        rank(0, step=25, last_progress_at=990.5, stopped_by_signal=True),
        rank(1, step=25, last_progress_at=989.9),
    )
    outcome = evaluate(request(), o, started_at=900.0)
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.rank == 0 and outcome.failure.collateral_ranks == [1]
