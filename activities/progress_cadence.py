"""The job's rhythm, learned online: how long a live rank may be silent (issue 38).

A fixed ``hang_timeout_s`` is either too long (each hang of a 0.1 s-step job costs
all of it) or too short (a minute-long save is called a hang). The supervisor
therefore learns the seconds between consecutive progress marks of each rank (a new
heartbeat, or a new ``progress_regex`` step), pooled across the job's ranks: the
ranks of a data-parallel job step together, so they share one rhythm. From them it
derives the **budget**, the silence a rank outside a declared slow phase is allowed
(:func:`budget_from`).

Intervals are what the controller sees, not step times: they already hold the
heartbeat throttle (one write per 0.2 s) and, on a node dated at the poll that saw
its progress, the poll cadence, so a budget of some multiple of them is never shorter
than the gaps a healthy rank leaves.

What is left out, so a one-off stretch does not become the rhythm: each rank's
first :data:`WARMUP_INTERVALS` intervals in this supervision (compilation, the first
steps after a start or a rejoin) and every interval during which some rank was in a
declared slow phase (a save blocks its peers in their next collective too). What is
kept beyond the window: the longest interval of the last :data:`LONG_MEMORY_S`, so a
pause the script does not declare (an uninstrumented save every few minutes) raises
the budget above it from its second occurrence on.

What a supervise activity learned outlives it: the next one of the same generation
(one every ``report_interval_s``, or a retry after a worker crash) starts from the
observer's copy in the generation's directory (:func:`to_document`,
:meth:`CadenceLearner.restore`), so an undeclared pause seen once is not forgotten
every few minutes, and a mid-run supervision does not wait out ``min_intervals``.

Pure (no clocks of its own, no I/O): the observer feeds it and the rules read it.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, TypeGuard

from lazarus.domain.contracts import HangBudget
from lazarus.domain.spec import HealthSpec

WINDOW = 512
"""How many recent intervals the quantile is taken over (pooled across ranks). A
sort of this many per round costs tens of microseconds."""

WARMUP_INTERVALS = 3
"""Each rank's first intervals in a supervision are not learned: after a (re)start
they are compilation and warm-up, not the rhythm."""

LONG_MEMORY_S = 600.0
"""How long the longest interval seen keeps the budget above it."""

LONG_MARGIN = 1.5
"""The budget stays this many times above the longest recent interval."""


def quantile(values: list[float], q: float) -> float:
    """The ``q``-th quantile of ``values`` by nearest rank (no interpolation: the
    budget is a multiple of an interval that really happened). ``values`` non-empty."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


BACKOFF_MEMORY_S = 3600.0
"""How long a hang the learned budget declared raises the budget of the job's later
generations (:func:`backoff_floor`)."""

BACKOFF_FACTOR = 2.0


def backoff_floor(hangs: list[tuple[float, float]], now: float) -> float | None:
    """The least budget a new generation may learn, after hangs the learned budget
    declared in this job: :data:`BACKOFF_FACTOR` times the largest budget that fired in
    the last :data:`BACKOFF_MEMORY_S` (``hangs``: (wall time, budget) pairs). None
    without any. Pure.

    A silence the learned budget calls a hang is never learned (the rank is stopped
    before it speaks again), so a pause a plain script does not declare (a save every
    few minutes, longer than the budget) would be called a hang in every generation,
    for ever: the failure the budget must not have (dlrover PR 1749). Each such hang
    doubles the next generation's budget instead, up to ``hang_timeout_s``: a real hang
    that repeats is found a little later each time, a false alarm stops repeating
    after a restart or two."""
    recent = [budget for at, budget in hangs if now - at <= BACKOFF_MEMORY_S]
    return BACKOFF_FACTOR * max(recent) if recent else None


def budget_from(
    health: HealthSpec,
    intervals: list[float],
    intervals_seen: int,
    longest_recent_s: float | None,
    floor_s: float | None = None,
    *,
    log_progress: bool = False,
) -> HangBudget:
    """The allowed silence of a rank outside a slow phase, from the recent
    ``intervals`` (seconds between progress marks), how many were learned in all, the
    longest of the last :data:`LONG_MEMORY_S` and ``floor_s`` (:func:`backoff_floor`).
    Never above ``hang_timeout_s``, which is also the answer while fewer than
    ``min_intervals`` were seen. With ``log_progress`` (progress from ``progress_regex``
    lines alone: a script that cannot declare its slow phases) the floor is
    ``log_floor_s``, not ``floor_s``. Pure."""
    spec = health.hang_budget
    cap = health.hang_timeout_s
    if spec.mode == "off":
        return HangBudget(budget_s=cap, source="off", quantile=spec.quantile)
    if spec.mode == "pinned":
        pinned = spec.pinned_s if spec.pinned_s is not None else cap
        return HangBudget(budget_s=min(pinned, cap), source="pinned", quantile=spec.quantile)
    q = quantile(intervals, spec.quantile) if intervals else None
    if q is None or intervals_seen < spec.min_intervals:
        return HangBudget(
            budget_s=cap,
            source="learning",
            quantile=spec.quantile,
            quantile_s=q,
            longest_recent_s=longest_recent_s,
            intervals_seen=intervals_seen,
        )
    log_floor = max(spec.floor_s, spec.log_floor_s) if log_progress else None
    learned = max(
        spec.floor_s if log_floor is None else log_floor,
        spec.multiplier * q,
        LONG_MARGIN * (longest_recent_s or 0.0),
        floor_s or 0.0,
    )
    return HangBudget(
        budget_s=min(learned, cap),
        source="learned",
        quantile=spec.quantile,
        quantile_s=q,
        longest_recent_s=longest_recent_s,
        intervals_seen=intervals_seen,
        backoff_floor_s=floor_s,
        log_floor_s=log_floor,
    )


class CadenceLearner:
    """The recent progress intervals of a job's ranks and the budget they give.

    ``add`` is O(1) amortized (it runs for every new heartbeat of every rank); the
    longest interval of the last :data:`LONG_MEMORY_S` is a sliding-window maximum (a
    deque of decreasing intervals), not a scan."""

    def __init__(self, health: HealthSpec) -> None:
        self._health = health
        self._recent: deque[float] = deque(maxlen=WINDOW)
        self._longest: deque[tuple[float, float]] = deque()
        """(ended at, interval), intervals strictly decreasing: the head is the max."""
        self._seen = 0
        self._per_rank: dict[int, int] = {}
        """rank -> intervals of it offered so far (the first few are its warm-up)."""
        self._warm = False
        """Restored from an earlier supervision of this generation: past its warm-up."""

    def add(self, rank: int, interval: float, ended_at: float, *, in_slow_phase: bool) -> bool:
        """Offer one interval of ``rank`` (seconds between two of its progress marks,
        the second at ``ended_at``, controller time). Returns whether it was learned:
        not a warm-up interval, not in a slow phase, positive and finite."""
        offered = self._per_rank.get(rank, 0) + 1
        self._per_rank[rank] = offered
        if (offered <= WARMUP_INTERVALS and not self._warm) or in_slow_phase:
            return False
        if not (interval > 0 and math.isfinite(interval)):
            return False
        self._recent.append(interval)
        self._seen += 1
        while self._longest and self._longest[-1][1] <= interval:
            self._longest.pop()
        self._longest.append((ended_at, interval))
        return True

    def longest_recent(self, now: float) -> float | None:
        while self._longest and self._longest[0][0] < now - LONG_MEMORY_S:
            self._longest.popleft()
        return self._longest[0][1] if self._longest else None

    def budget(
        self, now: float, floor_s: float | None = None, *, log_progress: bool = False
    ) -> HangBudget:
        return budget_from(
            self._health,
            list(self._recent),
            self._seen,
            self.longest_recent(now),
            floor_s,
            log_progress=log_progress,
        )

    def to_document(self, mono_now: float, wall_now: float) -> dict[str, Any]:
        """What a later supervision of the generation restores: the window, the count
        and the long memory, dated in wall time (monotonic clocks are per process)."""
        self.longest_recent(mono_now)  # drop what has expired
        return {
            "version": 1,
            "intervals": list(self._recent),
            "seen": self._seen,
            "longest": [[wall_now - (mono_now - at), length] for at, length in self._longest],
        }

    def restore(self, document: object, mono_now: float, wall_now: float) -> bool:
        """Start from an earlier supervision's :meth:`to_document`; a malformed one (or
        another version) is ignored: the learner starts afresh, as before any. Whether
        it was taken."""
        if not isinstance(document, dict) or document.get("version") != 1:
            return False
        intervals = document.get("intervals")
        seen = document.get("seen")
        longest = document.get("longest")
        if not (
            isinstance(intervals, list)
            and isinstance(seen, int)
            and not isinstance(seen, bool)
            and isinstance(longest, list)
        ):
            return False
        kept = [float(v) for v in intervals if _positive(v)][-WINDOW:]
        pairs = [
            (float(p[0]), float(p[1]))
            for p in longest
            if isinstance(p, list) and len(p) == 2 and _finite(p[0]) and _positive(p[1])
        ]
        self._recent.extend(kept)
        self._seen = max(seen, len(kept))
        for wall_at, length in pairs:
            at = mono_now - max(0.0, wall_now - wall_at)
            while self._longest and self._longest[-1][1] <= length:
                self._longest.pop()
            self._longest.append((at, length))
        self._warm = True
        return True


def _finite(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _positive(value: object) -> TypeGuard[int | float]:
    return _finite(value) and value > 0
