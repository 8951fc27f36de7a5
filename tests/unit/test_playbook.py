"""The playbook is pure: every rule is checked here without a server."""

from __future__ import annotations

import pytest

from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.spec import ClassPolicy, RecoverySpec, StrategyName
from workflows.playbook import (
    DEFAULT_PLAYBOOK,
    STRATEGIES,
    Action,
    FailureContext,
    PastFailure,
    StragglerContext,
    backoff_s,
    decide,
    escalate,
    jitter_fraction,
    restarts_in_window,
    straggler_decision,
    strategy,
)

POLICY = RecoverySpec(
    max_restarts=3,
    restart_window_s=600,
    backoff_initial_s=1,
    backoff_max_s=10,
    backoff_multiplier=2,
    backoff_jitter=0,
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
    earlier = [PastFailure(failure_class="oom_gpu", at=990.0, step=40)]
    again = decide(
        ctx(failure_class="oom_gpu", step_at_failure=40, previous=earlier, consecutive_failures=2),
        POLICY,
    )
    assert again.action == Action.NEEDS_OPERATOR and "step 40 twice" in again.reason
    elsewhere = decide(ctx(failure_class="oom_gpu", step_at_failure=55, previous=earlier), POLICY)
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


def test_a_job_that_may_grow_asks_slurm_before_shrinking() -> None:
    lost = {"failure_class": "node_lost", "node": "h2", "active_nodes": 3, "can_grow": True}
    assert decide(ctx(**lost, spares_left=1), POLICY).action == Action.REPLACE_NODE
    grow = decide(ctx(**lost, spares_left=0, min_nodes=2), POLICY)
    assert grow.action == Action.GROW and "slurm.grow" in grow.reason


# ------------------------------------------------------------ every class, every rung


def earlier(failure_class: str, count: int, node: str | None = None) -> list[PastFailure]:
    return [
        PastFailure(failure_class=failure_class, at=900.0 + i, node=node, step=10 * (i + 1))
        for i in range(count)
    ]


LOOSE = RecoverySpec(max_restarts=100, crash_loop_after=100, backoff_jitter=0)

# (class, earlier failures of that class, spares, expected action, expected rung)
DEFAULT_LADDERS = [
    *[
        (cls, n, 0, Action.RESTART, "restart_in_place")
        for cls in ("nccl_timeout", "nccl_error", "rendezvous", "preempted", "unknown", "hang")
        for n in (0, 1, 5)
    ],
    ("storage", 0, 0, Action.RESTART, "restart_in_place"),
    ("oom_host", 0, 0, Action.RESTART, "restart_in_place"),
    ("killed", 0, 0, Action.RESTART, "restart_in_place"),
    ("gpu_hardware", 0, 1, Action.REPLACE_NODE, "replace_node"),
    ("gpu_hardware", 0, 0, Action.NEEDS_OPERATOR, "replace_node"),
    ("node_lost", 2, 1, Action.REPLACE_NODE, "replace_node"),
    ("user_code", 0, 0, Action.RESTART, "no_blind_restarts"),
    ("oom_gpu", 0, 0, Action.RESTART, "no_blind_restarts"),
    ("numerical", 0, 0, Action.ROLLBACK, "rollback"),
    ("numerical", 1, 0, Action.NEEDS_OPERATOR, "escalate"),
    ("numerical", 4, 0, Action.NEEDS_OPERATOR, "escalate"),
]


@pytest.mark.parametrize(("failure_class", "before", "spares", "action", "rung"), DEFAULT_LADDERS)
def test_default_ladder(
    failure_class: str, before: int, spares: int, action: Action, rung: str
) -> None:
    decision = decide(
        ctx(
            failure_class=failure_class,
            step_at_failure=123,
            previous=earlier(failure_class, before),
            node="h1",
            spares_left=spares,
            active_nodes=2,
        ),
        LOOSE,
    )
    assert (decision.action, decision.strategy) == (action, rung)
    assert failure_class in decision.reason


def test_every_failure_class_has_a_default_ladder() -> None:
    assert {c.value for c in FailureClass} <= set(DEFAULT_PLAYBOOK)


OVERRIDE = {
    "nccl_timeout": ClassPolicy(
        ladder=[StrategyName.RESTART_IN_PLACE, StrategyName.REPLACE_NODE, StrategyName.ESCALATE]
    ),
}


@pytest.mark.parametrize(
    ("before", "action", "rung"),
    [
        (0, Action.RESTART, "restart_in_place"),
        (1, Action.REPLACE_NODE, "replace_node"),
        (2, Action.NEEDS_OPERATOR, "escalate"),
        (7, Action.NEEDS_OPERATOR, "escalate"),
    ],
)
def test_spec_overrides_a_ladder_rung_by_rung(before: int, action: Action, rung: str) -> None:
    decision = decide(
        ctx(previous=earlier("nccl_timeout", before), node="h1", spares_left=1), LOOSE, OVERRIDE
    )
    assert (decision.action, decision.strategy) == (action, rung)


def test_an_operator_kill_is_not_escalated_by_the_readme_oom_override() -> None:
    """README: ``oom_host: {ladder: [escalate]}``. A bare kill -9 (class ``killed``)
    must still restart in place; only a proven OOM escalates."""
    override = {"oom_host": ClassPolicy(ladder=[StrategyName.ESCALATE])}
    killed = decide(ctx(failure_class="killed"), LOOSE, override)
    assert (killed.action, killed.strategy) == (Action.RESTART, "restart_in_place")
    oom = decide(ctx(failure_class="oom_host"), LOOSE, override)
    assert oom.action == Action.NEEDS_OPERATOR


def test_ladder_counts_only_failures_of_the_class_inside_the_window() -> None:
    old = [PastFailure(failure_class="nccl_timeout", at=1.0)]  # outside the 3600 s window
    other = earlier("hang", 3)
    decision = decide(
        ctx(previous=old + other, node="h1", spares_left=1, now=5000.0), LOOSE, OVERRIDE
    )
    assert decision.strategy == "restart_in_place"


def test_class_budget_escalates_before_the_job_budget() -> None:
    budgeted = {"hang": ClassPolicy(ladder=[StrategyName.RESTART_IN_PLACE], budget=2)}
    assert decide(
        ctx(failure_class="hang", previous=earlier("hang", 1)), LOOSE, budgeted
    ).action == (Action.RESTART)
    spent = decide(ctx(failure_class="hang", previous=earlier("hang", 2)), LOOSE, budgeted)
    assert spent.action == Action.NEEDS_OPERATOR and spent.strategy == "class_budget"
    assert "hang budget spent" in spent.reason
    # Another class still has its own budget.
    assert decide(ctx(previous=earlier("hang", 2)), LOOSE, budgeted).action == Action.RESTART


def test_repeated_failures_on_one_node_move_off_it_when_a_spare_exists() -> None:
    policy = RecoverySpec(max_restarts=100, crash_loop_after=100, node_failure_limit=3)
    twice = earlier("nccl_error", 2, node="h1")
    moved = decide(ctx(previous=twice, node="h1", spares_left=1, active_nodes=2), policy)
    assert moved.action == Action.REPLACE_NODE and moved.strategy == "node_failure_limit"
    assert "3 failures on h1" in moved.reason
    no_spare = decide(ctx(previous=twice, node="h1", spares_left=0, active_nodes=2), policy)
    assert no_spare.action == Action.RESTART
    other_node = decide(ctx(previous=twice, node="h2", spares_left=1, active_nodes=2), policy)
    assert other_node.action == Action.RESTART


def test_jitter_is_deterministic_bounded_and_spreads_incidents() -> None:
    policy = RecoverySpec(backoff_initial_s=10, backoff_max_s=100, backoff_jitter=0.5)
    values = [backoff_s(1, policy, f"job:{i}") for i in range(50)]
    assert values == [backoff_s(1, policy, f"job:{i}") for i in range(50)]
    assert all(10 <= v < 15 for v in values)
    assert len(set(values)) > 40
    assert 0 <= jitter_fraction("x") < 1
    assert backoff_s(1, policy) == 10  # no key, no jitter


def straggler(**overrides: object) -> StragglerContext:
    base: dict[str, object] = {
        "node": "h1",
        "rank": 1,
        "slowdown": 2.0,
        "seconds_per_step": 0.2,
        "remaining_steps": 1000,
        "restart_cost_s": 10.0,
        "spares_left": 1,
    }
    return StragglerContext.model_validate({**base, **overrides})


def test_straggler_is_swapped_when_the_gain_beats_the_restart_cost() -> None:
    swap = straggler_decision(straggler())  # gain 100 s > 10 s
    assert swap.action == Action.REPLACE_NODE and "gain 100 s" in swap.reason


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"remaining_steps": 50}, "not worth a swap"),  # gain 5 s < 10 s
        ({"spares_left": 0}, "no spare"),
        ({"swap_allowed": False}, "swapping is off"),
    ],
)
def test_straggler_is_only_recorded_otherwise(overrides: dict[str, object], why: str) -> None:
    decision = straggler_decision(straggler(**overrides))
    assert decision.action == Action.RECORD and why in decision.reason


def test_straggler_with_unknown_length_weighs_the_assumed_horizon() -> None:
    decision = straggler_decision(straggler(remaining_steps=None, restart_cost_s=100.0))
    assert decision.action == Action.REPLACE_NODE  # 3600 s * 0.5 > 100 s


def test_failing_at_the_same_step_again_and_again_is_a_crash_loop() -> None:
    policy = RecoverySpec(max_restarts=100, crash_loop_after=2, backoff_jitter=0)
    at_25 = [PastFailure(failure_class="unknown", at=900.0 + i, step=25) for i in range(2)]
    looping = decide(ctx(failure_class="unknown", step_at_failure=25, previous=at_25), policy)
    assert looping.strategy == "crash_loop" and "step 25 3 times" in looping.reason
    moved_on = decide(ctx(failure_class="unknown", step_at_failure=31, previous=at_25), policy)
    assert moved_on.action == Action.RESTART
    once = decide(ctx(failure_class="unknown", step_at_failure=25, previous=at_25[:1]), policy)
    assert once.action == Action.RESTART


def test_every_strategy_name_has_exactly_one_registered_strategy() -> None:
    # The spec validates ladders against StrategyName; decide() looks rungs up here.
    assert set(STRATEGIES) == set(StrategyName)
    assert all(isinstance(name, StrategyName) for name in STRATEGIES)


def test_a_strategy_name_cannot_be_registered_twice() -> None:
    with pytest.raises(ValueError, match="'escalate' is registered twice"):
        strategy(StrategyName.ESCALATE)(escalate)
    assert STRATEGIES[StrategyName.ESCALATE] is escalate


def test_the_default_playbook_has_exactly_the_failure_classes() -> None:
    # No ladder for stragglers: the cost model (straggler_decision) decides those.
    assert set(DEFAULT_PLAYBOOK) == set(FailureClass)


def test_decisions_carry_the_rung_as_its_plain_name() -> None:
    decision = decide(ctx(failure_class="hang"), LOOSE)
    assert decision.strategy == "restart_in_place"
    assert type(decision.strategy) is str
