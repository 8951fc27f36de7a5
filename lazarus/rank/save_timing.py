"""How long disk checkpoints block training (Young and Daly's δ, for
``checkpoints.interval: auto``): the median of the last few saves, timed by rank 0
itself or reported by the script, sent in the heartbeat as ``checkpoint_save_s``."""

from __future__ import annotations

import math
import time

from lazarus.rank import heartbeat_throttle

SAVE_TIMES_KEPT = 5
"""How many recent disk saves :func:`checkpoint_save_s` takes the median of: one slow
save (a cold page cache, a busy filesystem) must not swing the tuned interval."""
_save_times: list[float] = []
_save_started: tuple[int, float] | None = None
"""(step, monotonic time) of the first :func:`checkpoint_path` call of the save under way."""
_save_timing_explicit = False
"""The script reports its own save times: the helper's own timing stands down."""


def record_checkpoint_save(seconds: float) -> None:
    """Report that training was blocked ``seconds`` by one disk checkpoint.

    ``checkpoints.interval: auto`` tunes the interval with this cost (Young and Daly's
    δ), so only the blocking part counts: a save that copies the state and writes it
    in the background reports the copy. Without calls to this, rank 0 times each save
    itself, from the first :func:`checkpoint_path` of a step to the end of its
    :func:`commit_checkpoint` (write, barrier, manifest and fsync: what the other ranks
    wait for in the barrier); after the first call, only reported times count."""
    global _save_timing_explicit
    _save_timing_explicit = True
    _note_save_time(seconds)
    heartbeat_throttle._next_heartbeat_at = 0.0  # the next heartbeat carries it, throttle or not


def checkpoint_save_s() -> float | None:
    """The median blocking time of this process's last few disk saves (None before
    the first): sent in the heartbeat as ``checkpoint_save_s``."""
    if not _save_times:
        return None
    ordered = sorted(_save_times)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2.0


def _note_save_time(seconds: float) -> None:
    if seconds >= 0 and math.isfinite(seconds):
        _save_times.append(float(seconds))
        del _save_times[:-SAVE_TIMES_KEPT]


def _save_starts(step: int) -> bool:
    """The first ``checkpoint_path`` of ``step`` starts its save's clock; whether this
    call was that first one (later calls for the same step write more files)."""
    global _save_started
    if _save_started is None or _save_started[0] != step:
        _save_started = (step, time.monotonic())
        return True
    return False


def _save_ended(step: int, sealed: bool) -> None:
    """A commit of ``step`` finished: its save's time counts if this process timed it."""
    global _save_started
    started, _save_started = _save_started, None
    if _save_timing_explicit or not sealed or started is None or started[0] != step:
        return
    _note_save_time(time.monotonic() - started[1])
    heartbeat_throttle._next_heartbeat_at = 0.0
