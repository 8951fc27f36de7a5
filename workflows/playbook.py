"""The playbook: pure functions from a failure to an action.

Deterministic and free of I/O so it runs inside the workflow and in plain unit
tests alike. Actions are strategies registered by name (as SkyPilot registers its
recovery strategies), one per :class:`~lazarus.domain.spec.StrategyName`. Each failure
class has an *escalation ladder* of strategy names: the n-th failure of that class
inside the restart window takes rung n, and the last rung repeats. The defaults below
can be overridden per class in the job spec's ``playbook`` section.

Guards wrap every ladder, checked in this order, so no strategy can loop forever:

1. the job-wide budget (``max_restarts`` inside ``restart_window_s``);
2. the class's own budget (``playbook.<class>.budget``);
3. crash-loop detection: more than ``crash_loop_after`` failures without a step of
   progress, or in a row at the same step;
4. repeated failures blamed on one node move the job off that node when a spare exists.

Backoff is exponential in failures-without-progress, with jitter derived from a
hash of the job and incident, never from a random source: a replay must decide
exactly what the original run decided.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from pydantic import BaseModel, Field

from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.job_view import Action as Action
from lazarus.domain.job_view import Decision as Decision
from lazarus.domain.spec import ClassPolicy, RecoverySpec, StrategyName


class PastFailure(BaseModel):
    """An earlier incident, as far as the playbook cares."""

    failure_class: FailureClass
    at: float
    node: str | None = None
    step: int | None = None


class FailureContext(BaseModel):
    """What the playbook may look at. Times are workflow seconds (deterministic)."""

    failure_class: FailureClass
    rank: int | None = None
    now: float
    restart_times: list[float]
    consecutive_failures: int
    """Failures since the job last made progress, including this one."""
    step_at_failure: int | None = None
    previous: list[PastFailure] = Field(default_factory=list)
    """Earlier automatic incidents of this job, oldest first (not this one)."""
    node: str | None = None
    spares_left: int = 0
    active_nodes: int = 1
    min_nodes: int | None = None
    can_grow: bool = False
    """The job may ask Slurm for a replacement node when no spare is left
    (``slurm.grow``)."""
    jitter_key: str = ""
    """Seeds the backoff jitter; the workflow passes job id and incident id."""
    no_backoff_after_progress: bool = False
    """The fast path: the first failure after the job made progress restarts at once.
    Backoff exists to slow a crash loop, and a loop has no progress between failures;
    waiting before the first restart only loses training time."""

    def same_class_in_window(self, window_s: float) -> list[PastFailure]:
        return [
            p
            for p in self.previous
            if p.failure_class == self.failure_class and self.now - p.at < window_s
        ]

    def node_failures_in_window(self, window_s: float) -> int:
        """Failures blamed on this failure's node inside the window, this one included."""
        if self.node is None:
            return 0
        earlier = sum(
            1 for p in self.previous if p.node == self.node and self.now - p.at < window_s
        )
        return earlier + 1


Strategy = Callable[[FailureContext, RecoverySpec], Decision]
STRATEGIES: dict[StrategyName, Strategy] = {}
"""The registry, keyed by the domain's :class:`StrategyName`: the names a spec's ladder
may use are exactly the ones registered here (``tests/unit/test_playbook.py``)."""


def strategy(name: StrategyName) -> Callable[[Strategy], Strategy]:
    """Register ``fn`` as the strategy called ``name``; a name registers once."""

    def register(fn: Strategy) -> Strategy:
        if name in STRATEGIES:
            raise ValueError(f"strategy {name.value!r} is registered twice")
        STRATEGIES[name] = fn
        return fn

    return register


def jitter_fraction(key: str) -> float:
    """A stable number in [0, 1) for ``key``: the same incident always gets the same jitter."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def backoff_s(consecutive_failures: int, policy: RecoverySpec, jitter_key: str = "") -> float:
    """Exponential in failures-without-progress, so a crash loop slows itself down;
    stretched by up to ``backoff_jitter`` so jobs that failed together spread out."""
    exponent = max(0, consecutive_failures - 1)
    base = min(policy.backoff_max_s, policy.backoff_initial_s * policy.backoff_multiplier**exponent)
    if not jitter_key or policy.backoff_jitter == 0:
        return float(base)
    return float(base * (1.0 + policy.backoff_jitter * jitter_fraction(jitter_key)))


def restart_backoff_s(ctx: FailureContext, policy: RecoverySpec) -> float:
    """The wait before a restart: none for the first failure after progress on the
    fast path, else :func:`backoff_s`."""
    if ctx.no_backoff_after_progress and ctx.consecutive_failures <= 1:
        return 0.0
    return backoff_s(ctx.consecutive_failures, policy, ctx.jitter_key)


def _where(ctx: FailureContext) -> str:
    if ctx.rank is not None and ctx.node is not None and ctx.active_nodes > 1:
        return f" on rank {ctx.rank} ({ctx.node})"
    return f" on rank {ctx.rank}" if ctx.rank is not None else ""


@strategy(StrategyName.RESTART_IN_PLACE)
def restart_in_place(ctx: FailureContext, policy: RecoverySpec) -> Decision:
    return Decision(
        action=Action.RESTART,
        reason=(
            f"{ctx.failure_class}{_where(ctx)}: restart the generation from the newest checkpoint"
        ),
        backoff_s=restart_backoff_s(ctx, policy),
    )


@strategy(StrategyName.ESCALATE)
def escalate(ctx: FailureContext, policy: RecoverySpec) -> Decision:
    again = len(ctx.same_class_in_window(policy.restart_window_s))
    history = f" ({again + 1} within the window)" if again else ""
    return Decision(
        action=Action.NEEDS_OPERATOR,
        reason=f"{ctx.failure_class}{_where(ctx)}{history}: the playbook asks a person",
    )


@strategy(StrategyName.REPLACE_NODE)
def replace_node(ctx: FailureContext, policy: RecoverySpec) -> Decision:
    """A node that died (or whose hardware failed) is never trusted again by itself:
    swap in a spare; without one, ask Slurm for one where the job may grow its
    allocation, else shrink if the spec allows, else ask a person.

    A failure sequence: ``n2`` of ``n1,n2`` + spare ``n3`` is lost: quarantine ``n2``,
    relaunch on ``n1,n3`` (same ranks). ``n3`` is lost next, no spare: with
    ``slurm.grow`` Slurm adds ``n4`` and the job relaunches on ``n1,n4``; without it,
    and ``min_nodes: 1``, on ``n1`` alone; with neither, a person is asked."""
    node = ctx.node or "unknown node"
    if ctx.spares_left > 0:
        return Decision(
            action=Action.REPLACE_NODE,
            reason=f"{ctx.failure_class} on {node}: quarantine it and relaunch on a spare",
        )
    if ctx.can_grow:
        return Decision(
            action=Action.GROW,
            reason=(
                f"{ctx.failure_class} on {node}, no spare left: ask Slurm for a "
                "replacement node (slurm.grow)"
            ),
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


@strategy(StrategyName.NO_BLIND_RESTARTS)
def no_blind_restarts(ctx: FailureContext, policy: RecoverySpec) -> Decision:
    """Bugs and too-large batches fail the same way every time: a failure before the
    first step (an ImportError, a bad path) or a second one at the same step goes to
    a person with the evidence instead of burning the restart budget."""
    if ctx.step_at_failure is None:
        return Decision(
            action=Action.NEEDS_OPERATOR,
            reason=f"{ctx.failure_class} before the first step: a restart will not fix it",
        )
    earlier_steps = {p.step for p in ctx.same_class_in_window(policy.restart_window_s)}
    if ctx.step_at_failure in earlier_steps:
        return Decision(
            action=Action.NEEDS_OPERATOR,
            reason=(
                f"{ctx.failure_class} at step {ctx.step_at_failure} twice: "
                "a restart will not fix it"
            ),
        )
    return restart_in_place(ctx, policy)


@strategy(StrategyName.ROLLBACK)
def rollback(ctx: FailureContext, policy: RecoverySpec) -> Decision:
    """A diverged loss may already be baked into the newest checkpoint: resume from
    the one before it. Ladders put ``escalate`` after this rung, so it happens once."""
    at = f" at step {ctx.step_at_failure}" if ctx.step_at_failure is not None else ""
    return Decision(
        action=Action.ROLLBACK,
        reason=f"{ctx.failure_class}{at}: roll back to the checkpoint before the newest",
        backoff_s=restart_backoff_s(ctx, policy),
    )


_TRANSIENT = ClassPolicy(ladder=[StrategyName.RESTART_IN_PLACE])
DEFAULT_PLAYBOOK: dict[FailureClass, ClassPolicy] = {
    FailureClass.NCCL_TIMEOUT: _TRANSIENT,
    FailureClass.NCCL_ERROR: _TRANSIENT,
    FailureClass.RENDEZVOUS: _TRANSIENT,
    FailureClass.PREEMPTED: _TRANSIENT,
    FailureClass.UNKNOWN: _TRANSIENT,
    FailureClass.HANG: _TRANSIENT,
    FailureClass.STORAGE: _TRANSIENT,
    FailureClass.OOM_HOST: _TRANSIENT,
    FailureClass.KILLED: _TRANSIENT,
    FailureClass.GPU_HARDWARE: ClassPolicy(ladder=[StrategyName.REPLACE_NODE]),
    FailureClass.NODE_LOST: ClassPolicy(ladder=[StrategyName.REPLACE_NODE]),
    FailureClass.USER_CODE: ClassPolicy(ladder=[StrategyName.NO_BLIND_RESTARTS]),
    FailureClass.OOM_GPU: ClassPolicy(ladder=[StrategyName.NO_BLIND_RESTARTS]),
    FailureClass.NUMERICAL: ClassPolicy(ladder=[StrategyName.ROLLBACK, StrategyName.ESCALATE]),
}
"""Class -> ladder, for every failure class. Transient classes restart in place
(``killed`` too: a SIGKILL with no OOM record, an operator's ``kill -9``, is not a reason
to page); a bad node is replaced; bugs never restart blindly; divergence rolls back once,
then asks a person. Stragglers have no ladder: a slow node is weighed by
:func:`straggler_decision` (the spec's ``straggler`` section) instead."""


def policy_for(
    failure_class: FailureClass, overrides: dict[str, ClassPolicy] | None = None
) -> ClassPolicy:
    if overrides and failure_class in overrides:
        return overrides[failure_class]
    return DEFAULT_PLAYBOOK.get(failure_class, _TRANSIENT)


def restarts_in_window(restart_times: Sequence[float], now: float, window_s: float) -> int:
    return sum(1 for t in restart_times if now - t < window_s)


def _failures_at_this_step(ctx: FailureContext, limit: int) -> int:
    """Consecutive failures, this one included, at exactly this step: a job that
    resumes, makes a few steps and dies at the same place again is looping even
    though each generation made progress."""
    if ctx.step_at_failure is None:
        return 0
    count = 1
    for past in reversed(ctx.previous[-(limit + 1) :]):
        if past.step != ctx.step_at_failure:
            break
        count += 1
    return count


def _needs_operator(reason: str, guard: str) -> Decision:
    return Decision(action=Action.NEEDS_OPERATOR, reason=reason, strategy=guard)


def decide(
    ctx: FailureContext,
    policy: RecoverySpec,
    overrides: dict[str, ClassPolicy] | None = None,
) -> Decision:
    used = restarts_in_window(ctx.restart_times, ctx.now, policy.restart_window_s)
    if used >= policy.max_restarts:
        return _needs_operator(
            f"restart budget spent: {used} restarts within {policy.restart_window_s:.0f} s "
            f"(max_restarts={policy.max_restarts}); last failure {ctx.failure_class}{_where(ctx)}",
            "budget",
        )
    class_policy = policy_for(ctx.failure_class, overrides)
    earlier = len(ctx.same_class_in_window(policy.restart_window_s))
    if class_policy.budget is not None and earlier >= class_policy.budget:
        return _needs_operator(
            f"{ctx.failure_class} budget spent: {earlier + 1} failures of this class within "
            f"{policy.restart_window_s:.0f} s (budget={class_policy.budget})",
            "class_budget",
        )
    if ctx.consecutive_failures > policy.crash_loop_after:
        return _needs_operator(
            f"crash loop: {ctx.consecutive_failures} failures without a step of progress "
            f"(crash_loop_after={policy.crash_loop_after}); last {ctx.failure_class}",
            "crash_loop",
        )
    same_step = _failures_at_this_step(ctx, policy.crash_loop_after)
    if same_step > policy.crash_loop_after:
        return _needs_operator(
            f"crash loop: failed at step {ctx.step_at_failure} {same_step} times in a row "
            f"(crash_loop_after={policy.crash_loop_after}); last {ctx.failure_class}{_where(ctx)}",
            "crash_loop",
        )
    rung = class_policy.ladder[min(earlier, len(class_policy.ladder) - 1)]
    decision = STRATEGIES[rung](ctx, policy).model_copy(update={"strategy": rung.value})
    failures_here = ctx.node_failures_in_window(policy.restart_window_s)
    if (
        decision.action == Action.RESTART
        and ctx.spares_left > 0
        and failures_here >= policy.node_failure_limit
    ):
        moved = replace_node(ctx, policy)
        return moved.model_copy(
            update={
                "reason": (
                    f"{failures_here} failures on {ctx.node} within the window "
                    f"(node_failure_limit={policy.node_failure_limit}): {moved.reason}"
                ),
                "strategy": "node_failure_limit",
            }
        )
    return decision


# --------------------------------------------------------------------- stragglers


class StragglerContext(BaseModel):
    """What the swap-or-not decision weighs, all measured by the supervisor."""

    node: str
    rank: int
    slowdown: float
    """The straggler's compute time over its peers' median (>1)."""
    seconds_per_step: float | None
    """The job's current step time (it runs at the straggler's pace)."""
    remaining_steps: int | None
    """None when the spec does not give ``total_steps``."""
    restart_cost_s: float
    """The last measured recovery time (fault -> first new step), or the spec's default."""
    spares_left: int
    swap_allowed: bool = True
    assumed_remaining_s: float = 3600.0
    """The horizon weighed when the job's length is unknown."""


def straggler_decision(ctx: StragglerContext) -> Decision:
    """Swap only when the time a swap saves over the rest of the job beats what the
    restart costs. A swap is preceded by a just-in-time checkpoint, so its cost is the
    restart alone, not lost steps."""
    where = f"rank {ctx.rank} on {ctx.node} is {ctx.slowdown:.2f}x slower than its peers"
    if not ctx.swap_allowed:
        return Decision(
            action=Action.RECORD,
            reason=f"{where}; swapping is off (straggler.swap)",
            strategy="record",
        )
    if ctx.spares_left == 0:
        return Decision(
            action=Action.RECORD, reason=f"{where}; no spare to move to", strategy="record"
        )
    if ctx.seconds_per_step is not None and ctx.remaining_steps is not None:
        remaining_s = ctx.seconds_per_step * ctx.remaining_steps
    else:
        remaining_s = ctx.assumed_remaining_s
    gain_s = remaining_s * (1.0 - 1.0 / ctx.slowdown)
    weighed = (
        f"gain {gain_s:.0f} s over the remaining {remaining_s:.0f} s "
        f"vs restart {ctx.restart_cost_s:.0f} s"
    )
    if gain_s <= ctx.restart_cost_s:
        return Decision(
            action=Action.RECORD, reason=f"{where}; not worth a swap: {weighed}", strategy="record"
        )
    return Decision(
        action=Action.REPLACE_NODE,
        reason=f"{where}; checkpoint, then swap {ctx.node} for a spare: {weighed}",
        strategy="replace_node",
    )


SUGGESTED_OPERATOR_ACTIONS = ("resume", "recover --exclude-node NODE", "cancel")
