"""Young and Daly's checkpoint interval (issue 14): the arithmetic, against Daly's
published examples, and the MTBF a job plans with."""

from __future__ import annotations

import pytest

from lazarus.domain.checkpoint_interval import (
    LLAMA3_NODE_MTBF_H,
    daly_interval_s,
    expected_goodput_loss,
    interval_steps,
    job_mtbf_s,
    node_mtbf_h,
    young_interval_s,
)

pytestmark = pytest.mark.timeout(10)

MINUTE = 60.0
HOUR = 3600.0


@pytest.mark.parametrize(
    ("mtbf_s", "expected_min"),
    [
        (24 * HOUR, 117.0),  # Daly (2006): δ = 5 min, M = 24 h
        (6 * HOUR, 57.0),
        (15 * MINUTE, 9.1),
    ],
)
def test_daly_matches_his_published_examples(mtbf_s: float, expected_min: float) -> None:
    tau_min = daly_interval_s(5 * MINUTE, mtbf_s) / MINUTE
    # Daly rounds to whole minutes (tenths at 15 min): 116.7, 56.7, 9.14.
    assert tau_min == pytest.approx(expected_min, abs=0.5 if expected_min > 10 else 0.05)


def test_young_is_the_first_order_term() -> None:
    assert young_interval_s(5 * MINUTE, 24 * HOUR) == pytest.approx(120 * MINUTE)
    # Daly's correction is small when δ << M.
    assert daly_interval_s(1.0, 1e7) == pytest.approx(young_interval_s(1.0, 1e7), rel=1e-3)


def test_a_save_dearer_than_two_mtbfs_checkpoints_once_per_mtbf() -> None:
    assert daly_interval_s(30 * MINUTE, 15 * MINUTE) == 15 * MINUTE
    assert daly_interval_s(30 * MINUTE, 14 * MINUTE) == 14 * MINUTE


def test_expected_loss_is_smallest_near_dalys_optimum() -> None:
    delta, mtbf = 5 * MINUTE, 24 * HOUR
    tau = daly_interval_s(delta, mtbf)
    at_tau = expected_goodput_loss(tau, delta, mtbf)
    for factor in (0.25, 0.5, 0.8, 1.25, 2.0, 4.0):
        assert expected_goodput_loss(tau * factor, delta, mtbf) > at_tau
    # Young's first-order estimate, δ/τ + τ/2M, agrees to first order.
    assert at_tau == pytest.approx(delta / tau + tau / (2 * mtbf), rel=0.1)
    assert 0.07 < at_tau < 0.09


def test_restarts_add_to_the_loss() -> None:
    bare = expected_goodput_loss(HOUR, MINUTE, 10 * HOUR)
    assert expected_goodput_loss(HOUR, MINUTE, 10 * HOUR, restart_s=10 * MINUTE) > bare


@pytest.mark.parametrize(
    ("interval_s", "per_step", "steps"),
    [(100.0, 0.5, 200), (100.0, 30.0, 3), (0.2, 1.0, 1), (0.0, 1.0, 1), (7200.0, 7.0, 1029)],
)
def test_interval_in_steps_is_nearest_and_at_least_one(
    interval_s: float, per_step: float, steps: int
) -> None:
    assert interval_steps(interval_s, per_step) == steps


@pytest.mark.parametrize(
    "call",
    [
        lambda: interval_steps(10.0, 0.0),
        lambda: interval_steps(-1.0, 1.0),
        lambda: daly_interval_s(-1.0, 10.0),
        lambda: daly_interval_s(1.0, 0.0),
        lambda: expected_goodput_loss(0.0, 1.0, 10.0),
        lambda: job_mtbf_s(100.0, 0),
        lambda: node_mtbf_h(0.0),
    ],
)
def test_nonsense_is_refused(call: object) -> None:
    with pytest.raises(ValueError):
        call()  # type: ignore[operator]


def test_the_prior_is_llama3s_rate_on_an_8_gpu_node() -> None:
    assert pytest.approx(6383, abs=1) == LLAMA3_NODE_MTBF_H
    # 2,048 such nodes (16K GPUs) fail about every 3.1 hours, as Llama 3's run did.
    assert job_mtbf_s(LLAMA3_NODE_MTBF_H, 2048) / HOUR == pytest.approx(3.1, abs=0.05)


def test_a_fleets_rate_replaces_the_prior_and_the_jobs_record_moves_it() -> None:
    assert node_mtbf_h(1000.0) == 1000.0
    assert node_mtbf_h(1000.0, fleet_failures_per_node_hour=1 / 500) == pytest.approx(500.0)
    # One failure in a small job moves the prior (worth five failures) by a sixth ...
    assert node_mtbf_h(1000.0, failures=1, node_hours=2.0) == pytest.approx(5002 / 6)
    # ... a long record outweighs it: 100 failures in 10,000 node-hours (100 h) gives 143 h.
    assert node_mtbf_h(1000.0, failures=100, node_hours=10_000.0) == pytest.approx(142.9, abs=0.1)
