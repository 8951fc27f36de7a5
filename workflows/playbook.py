"""The playbook: pure functions from a failure to an action.

Deterministic and free of I/O so it runs inside the workflow and in plain unit
tests alike. Actions are strategies registered by name (as SkyPilot registers its
recovery strategies), and a table maps each failure class to one. The restart
budget wraps them all: whatever a strategy says, a job that has restarted
``max_restarts`` times inside ``restart_window_s`` goes to an operator instead of
looping forever.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import StrEnum

from pydantic import BaseModel

from lazarus.spec import RecoverySpec


class Action(StrEnum):
    RESTART = "restart"
    """Stop the whole generation, relaunch generation+1 from the newest checkpoint."""
    NEEDS_OPERATOR = "needs_operator"
    """Stop the ranks and wait for a person: more restarts would not help."""
    REPLACE_NODE = "replace_node"
    """Quarantine the failed node, take a spare, relaunch with the same world size."""
    SHRINK = "shrink"
    """No spare left, but the spec allows fewer nodes: relaunch without the failed node."""


class Decision(BaseModel):
    action: Action
    reason: str
    backoff_s: float = 0.0


class FailureContext(BaseModel):
    """What the playbook may look at. Times are workflow seconds (deterministic)."""

    failure_class: str
    rank: int | None = None
    now: float
    restart_times: list[float]
    consecutive_failures: int
    """Failures since the job last made progress, including this one."""
    step_at_failure: int | None = None
    previous_same_class_step: int | None = None
    """The step of the last earlier failure of this same class, if there was one."""
    had_previous_same_class: bool = False
    node: str | None = None
    spares_left: int = 0
    active_nodes: int = 1
    min_nodes: int | None = None


Strategy = Callable[[FailureContext, RecoverySpec], Decision]
STRATEGIES: dict[str, Strategy] = {}


def strategy(name: str) -> Callable[[Strategy], Strategy]:
    def register(fn: Strategy) -> Strategy:
        STRATEGIES[name] = fn
        return fn

    return register


def backoff_s(consecutive_failures: int, policy: RecoverySpec) -> float:
    """Exponential in failures-without-progress, so a crash loop slows itself down."""
    exponent = max(0, consecutive_failures - 1)
    return float(
        min(policy.backoff_max_s, policy.backoff_initial_s * policy.backoff_multiplier**exponent)
    )


@strategy("restart_in_place")
def restart_in_place(ctx: FailureContext, policy: RecoverySpec) -> Decision:
    where = f" on rank {ctx.rank}" if ctx.rank is not None else ""
    return Decision(
        action=Action.RESTART,
        reason=f"{ctx.failure_class}{where}: restart the generation from the newest checkpoint",
        backoff_s=backoff_s(ctx.consecutive_failures, policy),
    )


@strategy("escalate")
def escalate(ctx: FailureContext, policy: RecoverySpec) -> Decision:
    return Decision(action=Action.NEEDS_OPERATOR, reason=f"{ctx.failure_class}: needs a person")


@strategy("replace_node")
def replace_node(ctx: FailureContext, policy: RecoverySpec) -> Decision:
    """A node that died (or whose hardware failed) is never trusted again by itself:
    swap in a spare; without one, shrink if the spec allows, else ask a person."""
    node = ctx.node or "unknown node"
    if ctx.spares_left > 0:
        return Decision(
            action=Action.REPLACE_NODE,
            reason=f"{ctx.failure_class} on {node}: quarantine it and relaunch on a spare",
            backoff_s=0.0,
        )
    if ctx.min_nodes is not None and ctx.active_nodes - 1 >= ctx.min_nodes:
        return Decision(
            action=Action.SHRINK,
            reason=(
                f"{ctx.failure_class} on {node}, no spare left: continue on "
                f"{ctx.active_nodes - 1} nodes (min_nodes={ctx.min_nodes})"
            ),
        )
    return Decision(
        action=Action.NEEDS_OPERATOR,
        reason=(
            f"{ctx.failure_class} on {node} and no spare left "
            "(set min_nodes to allow shrinking, or 'lazarus return' a node)"
        ),
    )


@strategy("no_blind_restarts")
def no_blind_restarts(ctx: FailureContext, policy: RecoverySpec) -> Decision:
    """Bugs and too-large batches fail the same way every time: a failure before the
    first step (an ImportError, a bad path) or a second one at the same step goes to
    a person with the evidence instead of burning the restart budget."""
    if ctx.step_at_failure is None:
        return Decision(
            action=Action.NEEDS_OPERATOR,
            reason=f"{ctx.failure_class} before the first step: a restart will not fix it",
        )
    if ctx.had_previous_same_class and ctx.previous_same_class_step == ctx.step_at_failure:
        return Decision(
            action=Action.NEEDS_OPERATOR,
            reason=(
                f"{ctx.failure_class} at step {ctx.step_at_failure} twice: "
                "a restart will not fix it"
            ),
        )
    return restart_in_place(ctx, policy)


DEFAULT_STRATEGY = "restart_in_place"
CLASS_STRATEGIES: dict[str, str] = {
    "node_lost": "replace_node",
    "user_code": "no_blind_restarts",
    "oom_gpu": "no_blind_restarts",
}
"""Per-class overrides of the default strategy."""


def restarts_in_window(restart_times: Sequence[float], now: float, window_s: float) -> int:
    return sum(1 for t in restart_times if now - t < window_s)


def decide(ctx: FailureContext, policy: RecoverySpec) -> Decision:
    used = restarts_in_window(ctx.restart_times, ctx.now, policy.restart_window_s)
    if used >= policy.max_restarts:
        return Decision(
            action=Action.NEEDS_OPERATOR,
            reason=(
                f"restart budget spent: {used} restarts within {policy.restart_window_s:.0f} s "
                f"(max_restarts={policy.max_restarts}); last failure {ctx.failure_class}"
                + (f" on rank {ctx.rank}" if ctx.rank is not None else "")
            ),
        )
    if ctx.consecutive_failures > policy.crash_loop_after:
        return Decision(
            action=Action.NEEDS_OPERATOR,
            reason=(
                f"crash loop: {ctx.consecutive_failures} failures without a step of progress "
                f"(crash_loop_after={policy.crash_loop_after}); last {ctx.failure_class}"
            ),
        )
    name = CLASS_STRATEGIES.get(ctx.failure_class, DEFAULT_STRATEGY)
    return STRATEGIES[name](ctx, policy)


SUGGESTED_OPERATOR_ACTIONS = ("resume", "recover --exclude-node NODE", "cancel")
