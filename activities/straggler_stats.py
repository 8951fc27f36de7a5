"""Robust statistics that tell a straggler from noise.

A straggler is a rank whose own work per step (reported by
``lazarus.rank.compute_timer``) is consistently slower than its peers'. Two
things make that robust rather than twitchy:

* each rank is summarised by its **median** over a time window, so one slow step
  (a GC pause, a checkpoint) moves nothing;
* each rank is compared with the median of its **peers** (leave-one-out), and must
  exceed it by ``slowdown_factor`` *and* by ``mad_threshold`` median absolute
  deviations of the peers, so a naturally noisy job needs a bigger gap.

Leave-one-out matters for small jobs: with two ranks, the median of both would sit
half-way and hide a 2x straggler.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from lazarus.domain.spec import StragglerSpec


@dataclass(frozen=True)
class StragglerFinding:
    rank: int
    slowdown: float
    compute_s: float
    peers_compute_s: float
    samples: int
    slow_since: float


class ComputeWindow:
    """Per-rank ``(seen at, compute seconds)`` samples within ``window_s``.

    ``seen at`` is the controller's time when it first saw the heartbeat, never the
    node's timestamp in it: a node whose clock is off would otherwise keep its samples
    out of the window (behind) or in it for too long (ahead)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: dict[int, deque[tuple[float, float]]] = {}

    def add(self, rank: int, at: float, compute_s: float) -> None:
        samples = self._samples.setdefault(rank, deque())
        if samples and samples[-1][0] >= at:
            return  # the same heartbeat seen again
        samples.append((at, compute_s))

    def recent(self, now: float) -> dict[int, list[tuple[float, float]]]:
        cutoff = now - self.window_s
        for samples in self._samples.values():
            while samples and samples[0][0] < cutoff:
                samples.popleft()
        return {rank: list(samples) for rank, samples in self._samples.items() if samples}


def find_straggler(
    samples: dict[int, list[tuple[float, float]]],
    spec: StragglerSpec,
    ignore: frozenset[int] = frozenset(),
) -> StragglerFinding | None:
    """The slowest rank that is a straggler by both tests, or None. Pure.

    ``ignore`` holds ranks already reported (and left running): they are neither
    judged again nor used as peers, so one known-slow node cannot mask another."""
    medians = {
        rank: statistics.median(value for _, value in points)
        for rank, points in samples.items()
        if rank not in ignore and len(points) >= spec.min_samples
    }
    if len(medians) < 2:
        return None
    found: list[StragglerFinding] = []
    for rank, own in medians.items():
        peers = [value for other, value in medians.items() if other != rank]
        peer_median = statistics.median(peers)
        if peer_median <= 0:
            continue
        spread = statistics.median(abs(value - peer_median) for value in peers)
        slowdown = own / peer_median
        if slowdown < spec.slowdown_factor or own - peer_median <= spec.mad_threshold * spread:
            continue
        threshold = peer_median * spec.slowdown_factor
        slow_points = [at for at, value in samples[rank] if value >= threshold]
        found.append(
            StragglerFinding(
                rank=rank,
                slowdown=slowdown,
                compute_s=own,
                peers_compute_s=peer_median,
                samples=len(samples[rank]),
                slow_since=min(slow_points) if slow_points else samples[rank][0][0],
            )
        )
    return max(found, key=lambda f: f.slowdown) if found else None
