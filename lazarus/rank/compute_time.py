"""The rank's own work per step (:func:`compute_timer`): what tells a straggler from
its peers, which in a synchronous job all take as long per step as the slowest.
The heartbeat closes each step's sum and reports the mean since its last write."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

_step_compute_s = 0.0
"""Compute time recorded since the last heartbeat() call: this step's, so far."""
_window_compute_s = 0.0
_window_steps = 0
"""Steps (and their compute) since the last heartbeat write: the next write reports the mean."""


def record_compute_time(seconds: float) -> None:
    """Add ``seconds`` of this rank's own work to the current step.

    Stragglers hide in step times: in a synchronous job every rank's step takes as
    long as the slowest one's, because the fast ranks wait in the collective. Only
    the time a rank spends on its own work tells them apart, so time the forward
    pass, the loss and anything else that is not waiting on peers, and leave the
    gradient exchange out. Several calls per step add up."""
    global _step_compute_s
    if seconds > 0:
        _step_compute_s += seconds


@contextlib.contextmanager
def compute_timer() -> Iterator[None]:
    """``with lazarus.rank.compute_timer(): ...`` times a block of this rank's own
    work for straggler detection (see :func:`record_compute_time`). Costs two
    ``perf_counter`` calls; a no-op outside Lazarus apart from that."""
    started = time.perf_counter()
    try:
        yield
    finally:
        record_compute_time(time.perf_counter() - started)


def _close_step_compute() -> None:
    global _step_compute_s, _window_compute_s, _window_steps
    if _step_compute_s > 0:
        _window_compute_s += _step_compute_s
        _window_steps += 1
        _step_compute_s = 0.0


def _take_compute_mean() -> float | None:
    global _window_compute_s, _window_steps
    if _window_steps == 0:
        return None
    mean = _window_compute_s / _window_steps
    _window_compute_s, _window_steps = 0.0, 0
    return mean
