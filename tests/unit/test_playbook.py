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


def test_user_code_before_the_first_step_escalates_without_a_restart() -> None:
    decision = decide(ctx(failure_class="user_code", step_at_failure=None), POLICY)
    assert decision.action == Action.NEEDS_OPERATOR and "before the first step" in decision.reason


def test_user_code_mid_training_restarts_once_then_escalates_at_the_same_step() -> None:
    first = decide(ctx(failure_class="oom_gpu", step_at_failure=40), POLICY)
    assert first.action == Action.RESTART
    again = decide(
        ctx(
            failure_class="oom_gpu",
            step_at_failure=40,
            had_previous_same_class=True,
            previous_same_class_step=40,
            consecutive_failures=2,
        ),
        POLICY,
    )
    assert again.action == Action.NEEDS_OPERATOR and "step 40 twice" in again.reason
    elsewhere = decide(
        ctx(
            failure_class="oom_gpu",
            step_at_failure=55,
            had_previous_same_class=True,
            previous_same_class_step=40,
        ),
        POLICY,
    )
    assert elsewhere.action == Action.RESTART


def test_failures_without_progress_are_a_crash_loop() -> None:
    loose = RecoverySpec(max_restarts=100, crash_loop_after=3)
    assert decide(ctx(consecutive_failures=3), loose).action == Action.RESTART
    looping = decide(ctx(consecutive_failures=4), loose)
    assert looping.action == Action.NEEDS_OPERATOR and "crash loop" in looping.reason


def test_dead_nodes_are_replaced_then_shrunk_then_escalated() -> None:
    lost = {"failure_class": "node_lost", "node": "h2", "active_nodes": 3}
    assert decide(ctx(**lost, spares_left=1), POLICY).action == Action.REPLACE_NODE
    assert decide(ctx(**lost, spares_left=0, min_nodes=2), POLICY).action == Action.SHRINK
    assert decide(ctx(**lost, spares_left=0), POLICY).action == Action.NEEDS_OPERATOR
