"""The detection rules of supervision: one observation in, an outcome (or nothing) out.

:func:`evaluate` is a pure function from one :class:`Observation` (gathered by
:class:`~activities.supervise_observer.GenerationObserver`) to a
:class:`SuperviseOutcome`, so the rules (crash, vanished rank, lost node, hang,
straggler, first step, preemption) are unit-tested without processes. The
supervise activity itself is :mod:`activities.supervise`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from activities.diagnosis import (
    diagnose_crash,
    diagnose_vanished,
    killed_by_sigkill,
    last_lines,
)
from activities.straggler_stats import find_straggler
from lazarus.domain.contracts import (
    FailureReport,
    HangBudget,
    ProgressSignal,
    RankStatus,
    StragglerReport,
    SuperviseOutcome,
    SuperviseRequest,
)
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.recovery_timeline import latest_marks

VANISHED_GRACE_S = 1.5
"""A dead rank gets this long for its wrapper to write the exit-status file: a
fallback only. The wrapper writes it milliseconds after the death, and a rank whose
record has arrived is reported at once (:func:`awaiting_exit_record`); the full grace
is waited only for a rank that vanished with its wrapper (its group killed from
outside), which never gets a record."""


MIN_FAILED_POLLS = 2
"""Consecutive failed polls before a node can be declared lost. One poll that timed
out proves nothing on a loaded controller (a 2 s SSH timeout fires on live hosts
when the CPU is saturated); a node is lost only when it stayed silent across polls
and, unless its peers are already crashing, for ``node_timeout_s``."""


@dataclass
class NodeObservation:
    reachable: bool
    unreachable_since: float | None = None
    error: str | None = None
    failed_polls: int = 0
    """Consecutive polls that could not reach the node (0 when the last one did)."""
    declared_lost: bool = False
    """The scheduler says the node is gone (:attr:`NodeStatus.declared_lost`): its
    word is final, so one poll is enough and ``node_timeout_s`` does not apply."""
    waiting: bool = False
    """Its poll is still out (slower than ``poll_interval_s``): this is its last
    answer, carried over."""


@dataclass(frozen=True)
class SlowPhase:
    """A slow phase a rank declared in its newest heartbeat (:mod:`lazarus.domain.phases`):
    a checkpoint save, an evaluation. ``budget_s``: the rank's own bound for it (None:
    ``hang_timeout_s``); ``hang_timeout_s`` caps it either way."""

    name: str
    budget_s: float | None = None


@dataclass
class Observation:
    now: float
    launched_at: float
    ranks: list[RankStatus]
    logs: dict[int, str] = field(default_factory=dict)
    """Log tails by rank, fetched only for ranks that need evidence."""
    dead_since: dict[int, float] = field(default_factory=dict)
    """Ranks seen dead without an exit-status file, and since when."""
    nodes: dict[str, NodeObservation] = field(default_factory=dict)
    multi_node: bool = False
    compute: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    """Per-rank (controller time the heartbeat was seen, compute seconds) samples
    inside the straggler window."""
    progress_signal: ProgressSignal | None = None
    """``none``: no progress signal, hang detection is off. None: not known yet, or a
    hand-made observation: hang detection as usual."""
    signal_seen_at: float | None = None
    """When the first progress of any rank was seen. A rank with none yet gets a full
    ``hang_timeout_s`` after it before it counts as stalled, when progress appears
    only near or after ``startup_timeout_s``."""
    rank_phases: dict[int, dict[str, float]] = field(default_factory=dict)
    """Per rank, the phase marks of its newest heartbeat (:mod:`lazarus.domain.phases`):
    where a restart's time went on the rank side. Empty without the rank helper."""
    preempted: tuple[float, str] | None = None
    """Slurm is taking the allocation away: when (wall clock), and the evidence line
    (:meth:`activities.nodes.agent.NodeAgent.preemption_notice`)."""
    checkpoint_save_s: float | None = None
    """The slowest rank's recent blocking save time (its heartbeat's), None before any."""
    hang_budget: HangBudget | None = None
    """The silence a rank outside a slow phase is allowed now (learned from the job's
    progress intervals, :mod:`activities.progress_cadence`). None: ``hang_timeout_s``
    (a hand-made observation, or one from before issue 38)."""
    slow_phases: dict[int, SlowPhase] = field(default_factory=dict)
    """Ranks whose newest heartbeat says they are in a declared slow phase."""
    slow_phase_over_at: float | None = None
    """When (controller wall time) the last poll that found a slow phase open, or the
    first one that found it closed, came: once every phase is over, no rank's hang clock
    starts before it (its peers wake from the collective that waited for the phase,
    and their next heartbeat is a step away)."""


def max_step(ranks: list[RankStatus]) -> int | None:
    """The highest step any rank reports, None before any does (the observer's
    heartbeat details use it too)."""
    steps = [r.step for r in ranks if r.step is not None]
    return max(steps) if steps else None


def _crash(request: SuperviseRequest, obs: Observation) -> FailureReport | None:
    failed = [r for r in obs.ranks if r.exit_code is not None and r.exit_code != 0]
    if not failed:
        return None
    # The first rank to fail is the root cause; the rest died with it in the collective.
    root = min(failed, key=lambda r: (r.ended_at or obs.now, r.rank))
    return FailureReport(
        kind="crash",
        failure_class=FailureClass.UNKNOWN,  # classified from the log tail by with_evidence()
        rank=root.rank,
        node=root.node,
        exit_code=root.exit_code,
        signal=root.signal,
        fault_at=root.ended_at or obs.now,
        detected_at=obs.now,
        step_at_failure=max_step(obs.ranks),
        collateral_ranks=sorted(r.rank for r in failed if r.rank != root.rank),
    )


def awaiting_exit_record(obs: Observation) -> bool:
    """Some rank is dead with no exit status yet: its wrapper may still be writing it
    (it does, milliseconds after the death). Only ranks still without one count: a
    rank whose record has arrived since is a crash to report now, and waiting out the
    grace for it delayed every crash caught in that window by 1.5 s (issue 26)."""
    return any(
        obs.now - since < VANISHED_GRACE_S and obs.ranks[rank].exit_code is None
        for rank, since in obs.dead_since.items()
    )


def _vanished(obs: Observation) -> FailureReport | None:
    gone = sorted(
        (since, rank)
        for rank, since in obs.dead_since.items()
        if obs.now - since >= VANISHED_GRACE_S and obs.ranks[rank].exit_code is None
    )
    if not gone:
        return None
    since, rank = gone[0]
    return FailureReport(
        kind="vanished",
        failure_class=FailureClass.KILLED,  # or oom_host, with the kernel's record: with_evidence()
        rank=rank,
        node=obs.ranks[rank].node,
        evidence=[
            f"rank {rank} is gone and its wrapper recorded no exit status: "
            "its whole process group was killed from outside"
        ],
        fault_at=since,
        detected_at=obs.now,
        step_at_failure=max_step(obs.ranks),
        collateral_ranks=sorted(r for _, r in gone[1:]),
    )


def _node_lost(request: SuperviseRequest, obs: Observation, crashed: bool) -> FailureReport | None:
    """A node is dead when it is silent for node_timeout_s since its last answer
    (``unreachable_since``, see ``supervise_observer.silent_since``; at once if ranks
    are already crashing: they lost their peers there), or when, in a multi-node job,
    every one of its ranks vanished without an exit status. Either way it must have
    failed :data:`MIN_FAILED_POLLS` polls in a row: a single slow answer from a live
    host on a loaded controller must not quarantine it (defect 19, issue 10)."""
    found: list[tuple[float, str, str]] = []
    # Grouped once: scanning every rank for every node is quadratic (1,000 nodes: 1M
    # comparisons a poll).
    ranks_of: dict[str, list[RankStatus]] = {}
    for status in obs.ranks:
        ranks_of.setdefault(status.node, []).append(status)
    for name, node in obs.nodes.items():
        if not node.reachable and node.unreachable_since is not None:
            silent = obs.now - node.unreachable_since
            if node.declared_lost:
                found.append((node.unreachable_since, name, f"{node.error}"))
                continue
            confirmed = node.failed_polls >= MIN_FAILED_POLLS
            if confirmed and (crashed or silent >= request.node_timeout_s):
                found.append(
                    (
                        node.unreachable_since,
                        name,
                        f"node {name} unreachable: silent for {silent:.1f} s since its "
                        f"last answer: {node.error}",
                    )
                )
        elif obs.multi_node:
            mine = ranks_of.get(name, [])
            dead = [obs.dead_since.get(r.rank) for r in mine]
            if mine and all(d is not None and obs.now - d >= VANISHED_GRACE_S for d in dead):
                since = min(d for d in dead if d is not None)
                found.append(
                    (since, name, f"every rank on node {name} vanished without exit status")
                )
    if not found:
        return None
    since, name, why = min(found)
    node_ranks = [r.rank for r in ranks_of.get(name, [])]
    return FailureReport(
        kind="node_lost",
        failure_class=FailureClass.NODE_LOST,
        rank=node_ranks[0] if node_ranks else 0,
        node=name,
        evidence=[why],
        fault_at=since,
        detected_at=obs.now,
        step_at_failure=max_step(obs.ranks),
        collateral_ranks=sorted(
            r.rank for r in obs.ranks if r.node != name and r.exit_code not in (None, 0)
        ),
    )


def _rejoin_overdue(request: SuperviseRequest, obs: Observation, status: RankStatus) -> bool:
    """A rank carried over into this generation (``rejoin``) that has not said it acts
    for it (a heartbeat here, ``"generation"`` this one) ``rejoin_timeout_s`` after the
    launch: it never rejoined. One that did is judged by the startup and hang clocks."""
    return (
        status.rank in request.rejoining
        and request.rejoin_timeout_s is not None
        and status.last_progress_at is None
        and status.generation != request.generation
        and obs.now - obs.launched_at > request.rejoin_timeout_s
    )


def _judged(obs: Observation, status: RankStatus) -> bool:
    """Whether a rank's clocks are judged this round: it is alive and its node answered
    (a silent node's ranks wait for its node-loss clock, a node whose poll is still
    out for its answer)."""
    node = obs.nodes.get(status.node)
    return status.alive and (node is None or (node.reachable and not node.waiting))


HANG_CHECK_SLACK_S = 0.01
"""How long after a rank's hang clock runs out the supervisor polls to judge it: the
rule is "silent for *more than* ``hang_timeout_s``", so a round exactly at the
deadline would find it not hung yet and the next one would come a whole interval
later."""


def allowed_silence(
    request: SuperviseRequest, obs: Observation, status: RankStatus
) -> tuple[float, str | None]:
    """How long ``status``'s rank may go without progress now, and the slow phase that
    allows it (None: the learned budget, or ``hang_timeout_s``). Pure.

    A rank in a declared slow phase gets that phase's budget. So does every other
    rank while one is in a phase: a rank saving a checkpoint holds its peers in their
    next collective (``torch.save``'s barrier), and their silence is its phase, not a
    hang. Once a rank has finished (exit 0), every rank gets ``hang_timeout_s``: the
    others are finishing too; so while a node is silent (its loss is for
    ``node_timeout_s`` to judge, not its peers' hang clocks). Otherwise the learned budget
    (:attr:`Observation.hang_budget`). Every answer is capped by ``hang_timeout_s``,
    the upper bound of them all."""
    cap = request.health.hang_timeout_s
    if any(r.exit_code == 0 for r in obs.ranks):
        # A rank finished: the others are in their own last steps (a final save, the
        # last barrier, teardown), slower than a step on a loaded machine.
        return cap, None
    if any(not node.reachable or node.waiting for node in obs.nodes.values()):
        # A node is silent (or its poll still out): ranks elsewhere blocked in a
        # collective on its ranks are its loss, which node_timeout_s judges; the
        # learned budget would call them hung first, and the loss a hang.
        return cap, None
    own = obs.slow_phases.get(status.rank)
    phase = own
    if phase is None and obs.slow_phases:
        phase = max(obs.slow_phases.values(), key=lambda p: _phase_budget(p, cap))
    if phase is not None:
        return _phase_budget(phase, cap), phase.name
    if obs.hang_budget is not None:
        return min(obs.hang_budget.budget_s, cap), None
    return cap, None


def quiet_since(obs: Observation, last_progress_at: float) -> float:
    """Where a rank's hang clock starts: its last progress, or, once every slow phase
    is over, the phase's end if that is later (:attr:`Observation.slow_phase_over_at`).
    Pure."""
    over = obs.slow_phase_over_at
    if over is None or obs.slow_phases:
        return last_progress_at
    return max(last_progress_at, over)


def _phase_budget(phase: SlowPhase, cap: float) -> float:
    return cap if phase.budget_s is None else min(phase.budget_s, cap)


def next_hang_check(request: SuperviseRequest, obs: Observation) -> float | None:
    """When (controller wall time) the earliest live rank's hang clock runs out if it
    makes no progress meanwhile: the supervisor polls then instead of at its next
    round, so a hang is judged at ``hang_timeout_s`` after the rank's last progress,
    not up to ``poll_interval_s`` later. None when no rank has a running hang clock
    (hang detection off, no progress seen yet, no rank judged). The startup and rejoin
    clocks are left to the rounds: they are not what a hang's recovery time measures.
    Pure."""
    if obs.progress_signal == "none":
        return None
    deadlines = [
        quiet_since(obs, status.last_progress_at) + allowed_silence(request, obs, status)[0]
        for status in obs.ranks
        if status.last_progress_at is not None and _judged(obs, status)
    ]
    return min(deadlines, default=None)


def _hang(request: SuperviseRequest, obs: Observation) -> FailureReport | None:
    """Ranks alive but not progressing. Off when the job has no progress signal: a
    script with neither heartbeats nor ``progress_regex`` would otherwise be killed
    as hung ``startup_timeout_s`` after every launch."""
    if obs.progress_signal == "none":
        return None
    health = request.health
    stalled: list[tuple[RankStatus, float]] = []
    for status in obs.ranks:
        if not _judged(obs, status):
            continue
        if status.last_progress_at is None and _rejoin_overdue(request, obs, status):
            stalled.append((status, obs.launched_at))
        elif status.last_progress_at is None:
            late_signal = (
                obs.signal_seen_at is not None
                and obs.now - obs.signal_seen_at <= health.hang_timeout_s
            )
            if obs.now - obs.launched_at > health.startup_timeout_s and not late_signal:
                stalled.append((status, obs.launched_at))
        else:
            since = quiet_since(obs, status.last_progress_at)
            if obs.now - since > allowed_silence(request, obs, status)[0]:
                stalled.append((status, since))
    if not stalled:
        return None
    # A stopped process (state T) is the culprit even if its last heartbeat landed a
    # moment after its blocked peer's (heartbeats are throttled): it joins the suspects.
    # So does a rank in a slow phase of its own: its peers, stalled first (their clocks
    # started before its phase did), wait for it in their next collective.
    suspects = {s.rank for s, _ in stalled}
    for status in obs.ranks:
        in_phase = status.rank in obs.slow_phases
        if status.alive and (status.stopped_by_signal or in_phase) and status.rank not in suspects:
            since = status.last_progress_at or obs.launched_at
            stalled.append((status, since))
    # Name the rank that stopped first: a SIGSTOPped process is certain, then a rank in a
    # slow phase of its own; otherwise the lowest step, then the oldest progress. Its
    # peers stall behind it in the collective.
    culprit, since = min(
        stalled,
        key=lambda item: (
            not item[0].stopped_by_signal,
            item[0].rank not in obs.slow_phases,
            item[0].step if item[0].step is not None else -1,
            item[1],
        ),
    )
    state = "stopped (state T)" if culprit.stopped_by_signal else "running"
    silent = obs.now - since
    allowed, phase = allowed_silence(request, obs, culprit)
    evidence = (
        f"rank {culprit.rank} kept its process for generation {request.generation} but did "
        f"not rejoin it within {request.rejoin_timeout_s} s (process {state}); "
        "the whole generation restarts"
        if _rejoin_overdue(request, obs, culprit)
        else f"rank {culprit.rank} made no progress for {silent:.1f} s "
        f"(last step {culprit.step}, process {state}); "
        + _budget_words(health.hang_timeout_s, allowed, phase, obs.hang_budget)
    )
    return FailureReport(
        kind="hang",
        failure_class=FailureClass.HANG,
        rank=culprit.rank,
        node=culprit.node,
        evidence=[evidence],
        # The job stopped progressing when its first rank went quiet.
        fault_at=min(quiet for _, quiet in stalled),
        detected_at=obs.now,
        step_at_failure=max_step(obs.ranks),
        collateral_ranks=sorted(s.rank for s, _ in stalled if s.rank != culprit.rank),
        hang_budget=obs.hang_budget,
        slow_phase=phase,
    )


def learned_budget_fired(
    failure: FailureReport, hang_timeout_s: float, *, culprit_stopped: bool = False
) -> float | None:
    """The learned budget a hang was declared by, or None: a crash, a slow phase's
    hang, one judged by ``hang_timeout_s`` (still learning, pinned, off, or capped).
    Such a hang raises later generations' budgets
    (:func:`activities.progress_cadence.backoff_floor`). Pure.

    ``culprit_stopped``: the hung rank was found stopped (state T: SIGSTOP, a
    debugger, a frozen cgroup). The back-off exists for a pause the budget misjudged
    (an undeclared save the rank would have finished); a stopped process never speaks
    again by itself, so its hang is certain and raises nothing: a second one is found
    as fast as the first. A hang in a running process (stuck in a collective) still
    backs off."""
    budget = failure.hang_budget
    if failure.kind != "hang" or failure.slow_phase is not None or budget is None:
        return None
    if culprit_stopped:
        return None
    if budget.source != "learned" or budget.budget_s >= hang_timeout_s:
        return None
    return budget.budget_s


def _budget_words(
    hang_timeout_s: float, allowed: float, phase: str | None, budget: HangBudget | None
) -> str:
    """What the silence was judged against, for the incident's reader."""
    if phase is not None:
        return f"slow phase {phase!r} allows {allowed:.2f} s; hang_timeout_s={hang_timeout_s}"
    if budget is not None and budget.source in ("learned", "pinned"):
        return f"hang budget {budget.describe()}; hang_timeout_s={hang_timeout_s}"
    return f"hang_timeout_s={hang_timeout_s}"


def _failure(request: SuperviseRequest, obs: Observation) -> FailureReport | None:
    """Root cause first: a lost node, then ranks killed from outside, then crashes
    (peers of a dead rank crash within milliseconds: they are collateral), then hangs."""
    crash = _crash(request, obs)
    hang = _hang(request, obs)
    # Ranks crashing or stalling while a node is silent lost their peers there.
    lost = _node_lost(request, obs, crashed=crash is not None or hang is not None)
    if lost is not None:
        return lost
    if crash is not None and awaiting_exit_record(obs):
        return None  # wait a moment: either an exit status arrives or the rank vanished
    return _vanished(obs) or crash or hang


def _straggler(request: SuperviseRequest, obs: Observation) -> StragglerReport | None:
    if not request.straggler.enabled:
        return None
    known = frozenset(r.rank for r in obs.ranks if r.node in request.known_stragglers)
    finding = find_straggler(obs.compute, request.straggler, ignore=known)
    if finding is None:
        return None
    return StragglerReport(
        rank=finding.rank,
        node=obs.ranks[finding.rank].node,
        slowdown=finding.slowdown,
        compute_s=finding.compute_s,
        peers_compute_s=finding.peers_compute_s,
        samples=finding.samples,
        slow_since=finding.slow_since,
        detected_at=obs.now,
    )


def needs_kernel_evidence(failure: FailureReport) -> bool:
    """Killed from outside: only the kernel can say whether it was the OOM killer."""
    return failure.kind == "vanished" or (
        failure.kind == "crash" and killed_by_sigkill(failure.exit_code, failure.signal)
    )


def with_evidence(
    failure: FailureReport, log_text: str, kernel_evidence: list[str] | None = None
) -> FailureReport:
    """Attach the decisive log lines (and, for a crash or a vanished rank, the failure
    class). ``kernel_evidence``: the kernel's OOM records for the rank's pid, [] when
    there are none, None when they could not be read (see :func:`diagnose_crash`)."""
    if failure.kind == "crash":
        diagnosis = diagnose_crash(log_text, failure.exit_code, failure.signal, kernel_evidence)
        return failure.model_copy(
            update={"failure_class": diagnosis.failure_class, "evidence": diagnosis.evidence}
        )
    if failure.kind == "vanished":
        diagnosis = diagnose_vanished(kernel_evidence)
        evidence = [*failure.evidence, *diagnosis.evidence, *last_lines(log_text, 5)]
        return failure.model_copy(
            update={"failure_class": diagnosis.failure_class, "evidence": evidence}
        )
    return failure.model_copy(update={"evidence": [*failure.evidence, *last_lines(log_text, 5)]})


def _first_step_at(request: SuperviseRequest, obs: Observation) -> float | None:
    """When the generation made its first step (closing a recovery). Without a
    progress signal no step is ever seen: the generation counts as recovered once
    every rank has outlived ``startup_timeout_s`` (that is when the signal is found
    to be ``none``), so a job that crashes now and then is not a crash loop."""
    if obs.progress_signal == "none":
        return obs.now
    floor = request.resume_step if request.resume_step is not None else -1
    times = [
        r.last_progress_at
        for r in obs.ranks
        if r.step is not None and r.step > floor and r.last_progress_at is not None
    ]
    return min(times) if times else None


def evaluate(
    request: SuperviseRequest,
    obs: Observation,
    started_at: float,
    seconds_per_step: float | None = None,
) -> SuperviseOutcome | None:
    """Decide whether this observation ends the supervision, and how. Pure."""
    base = {
        "generation": request.generation,
        "observed_at": obs.now,
        "step": max_step(obs.ranks),
        "ranks": obs.ranks,
        "seconds_per_step": seconds_per_step,
        "progress_signal": obs.progress_signal,
        "checkpoint_save_s": obs.checkpoint_save_s,
    }
    if obs.preempted is not None:
        at, why = obs.preempted
        notice = FailureReport(
            kind="preempted",
            failure_class=FailureClass.PREEMPTED,
            rank=0,
            evidence=[why],
            fault_at=at,
            detected_at=obs.now,
            step_at_failure=max_step(obs.ranks),
        )
        return SuperviseOutcome(kind="preempted", failure=notice, **base)
    failure = _failure(request, obs)
    if failure is not None:
        return SuperviseOutcome(kind="failed", failure=failure, **base)
    if all(r.exit_code == 0 for r in obs.ranks):
        return SuperviseOutcome(kind="succeeded", **base)
    if request.report_first_step:
        first = _first_step_at(request, obs)
        if first is not None:
            return SuperviseOutcome(
                kind="first_step",
                first_step_at=first,
                rank_phases=latest_marks(obs.rank_phases),
                **base,
            )
    straggler = _straggler(request, obs)
    if straggler is not None:
        return SuperviseOutcome(kind="straggler", straggler=straggler, **base)
    if obs.now - started_at >= request.report_after_s:
        return SuperviseOutcome(kind="progress", **base)
    return None


class StepRate:
    """Seconds per step over the supervisor's window, for ETTR and restart-cost estimates.

    The times are the ranks' wall clocks, which can step backwards (NTP, a VM resumed).
    A window whose time did not move forward says nothing: it gives None, never a
    zero or negative rate (the workflow divides by it), and a step back restarts the
    window at the newest mark, so the rate is measured again from there."""

    def __init__(self) -> None:
        self._first: tuple[int, float] | None = None
        self._last: tuple[int, float] | None = None

    def update(self, ranks: list[RankStatus]) -> float | None:
        steps = [
            (r.step, r.last_progress_at)
            for r in ranks
            if r.step is not None and r.last_progress_at is not None
        ]
        if steps:
            newest = max(steps)
            if self._first is None or newest[0] < self._first[0] or newest[1] < self._first[1]:
                self._first = newest
            self._last = newest
        if self._first and self._last and self._last[0] > self._first[0]:
            elapsed = self._last[1] - self._first[1]
            if elapsed > 0 and math.isfinite(elapsed):
                return elapsed / (self._last[0] - self._first[0])
        return None
