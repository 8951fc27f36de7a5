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


DEFAULT_STRATEGY = "restart_in_place"
CLASS_STRATEGIES: dict[str, str] = {}
"""Per-class overrides of the default strategy; empty until classes need different handling."""


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
    name = CLASS_STRATEGIES.get(ctx.failure_class, DEFAULT_STRATEGY)
    return STRATEGIES[name](ctx, policy)


SUGGESTED_OPERATOR_ACTIONS = ("resume", "recover --reason TEXT", "cancel")
