"""The playbook is pure: every rule is checked here without a server."""

from __future__ import annotations

from lazarus.spec import RecoverySpec
from workflows.playbook import Action, FailureContext, backoff_s, decide, restarts_in_window

POLICY = RecoverySpec(
    max_restarts=3,
    restart_window_s=600,
    backoff_initial_s=1,
    backoff_max_s=10,
    backoff_multiplier=2,
)


def ctx(**overrides: object) -> FailureContext:
    base: dict[str, object] = {
        "failure_class": "nccl_timeout",
        "rank": 1,
        "now": 1000.0,
        "restart_times": [],
        "consecutive_failures": 1,
    }
    return FailureContext.model_validate({**base, **overrides})


def test_first_failure_restarts_immediately_with_initial_backoff() -> None:
    decision = decide(ctx(), POLICY)
    assert decision.action == Action.RESTART
    assert decision.backoff_s == 1.0
    assert "rank 1" in decision.reason


def test_backoff_grows_exponentially_and_caps() -> None:
    assert [backoff_s(n, POLICY) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_budget_counts_only_restarts_inside_the_window() -> None:
    assert restarts_in_window([100.0, 500.0, 990.0], now=1000.0, window_s=600) == 2


def test_spent_budget_escalates_to_an_operator_with_the_reason() -> None:
    decision = decide(ctx(restart_times=[900.0, 950.0, 990.0]), POLICY)
    assert decision.action == Action.NEEDS_OPERATOR
    assert "restart budget spent" in decision.reason and "nccl_timeout" in decision.reason


def test_old_restarts_fall_out_of_the_window() -> None:
    decision = decide(ctx(restart_times=[10.0, 20.0, 30.0]), POLICY)
    assert decision.action == Action.RESTART


def test_zero_budget_never_restarts() -> None:
    decision = decide(ctx(), RecoverySpec(max_restarts=0))
    assert decision.action == Action.NEEDS_OPERATOR


def test_decisions_are_deterministic() -> None:
    assert decide(ctx(), POLICY) == decide(ctx(), POLICY)
