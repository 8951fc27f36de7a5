"""The heartbeat file the supervisor reads to tell a slow rank from a hung one:
throttled writes of the completed step, metrics, phase marks, the slow phase open
(:mod:`lazarus.rank.slow_phases`), compute and save times, and the generation the
rank acts for. The throttled path is a clock read and
a compare; the throttle's deadline is :mod:`lazarus.rank.heartbeat_throttle`'s."""

from __future__ import annotations

import atexit
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from lazarus.domain import environment, phases
from lazarus.rank import heartbeat_throttle, marks, rejoin_requests, slow_phase_stack
from lazarus.rank.atomic_files import _atomic_write
from lazarus.rank.compute_time import _close_step_compute, _take_compute_mean
from lazarus.rank.control import _poll_control
from lazarus.rank.identity import _generation_now
from lazarus.rank.marks import mark, phase_marks
from lazarus.rank.rejoin_requests import REJOIN_POLL_INTERVAL_S, _raise_if_rejoin_requested
from lazarus.rank.save_timing import checkpoint_save_s

DEFAULT_HEARTBEAT_INTERVAL_S = 0.2

# Module-level state keeps the throttled path to a clock read and a compare:
# no syscalls, no allocation beyond the caller's own **metrics dict.
_UNRESOLVED = object()
_heartbeat_file: object | str | None = _UNRESOLVED
_heartbeat_interval_s = DEFAULT_HEARTBEAT_INTERVAL_S
_reported_step: int | None = None
_reported_metrics: dict[str, Any] = {}
_heartbeat_warned = False
_flush_registered = False
_first_step_pending = True
_last_write_at: float | None = None
"""Monotonic time of this process's previous heartbeat write (its gap goes in the next)."""


def _resolve_heartbeat() -> str | None:
    global _heartbeat_file, _heartbeat_interval_s, _flush_registered
    path = os.environ.get(environment.HEARTBEAT_FILE) or None
    interval = DEFAULT_HEARTBEAT_INTERVAL_S
    raw_interval = os.environ.get(environment.HEARTBEAT_INTERVAL)
    if raw_interval:
        try:
            interval = max(0.0, float(raw_interval))
        except ValueError:
            interval = DEFAULT_HEARTBEAT_INTERVAL_S
    _heartbeat_file = path
    _heartbeat_interval_s = interval
    if path is not None and not _flush_registered:
        _flush_registered = True
        atexit.register(_flush_at_exit)
    return path


def heartbeat(step: int, **metrics: Any) -> None:
    """Tell the supervisor this rank completed ``step`` (the number of finished
    steps). Call it every step: writes are throttled to one per
    ``LAZARUS_HEARTBEAT_INTERVAL_S`` (the first call always writes, so startup is
    seen at once, and so does the first call after a :func:`mark`). The first call
    with a step beyond the resume point marks ``first_step``. Metrics should be
    floats; anything ``float()`` accepts (a 0-d tensor) is converted only when a
    write happens, so the throttled path never forces a device sync. A no-op
    outside Lazarus. The two variables are read once, at the first call, to keep
    later calls free of lookups.

    Under :func:`lazarus.rank.torch.run_resilient` it also looks for a rejoin request
    in the control file (a ``stat`` at most every :data:`REJOIN_POLL_INTERVAL_S`) and
    raises :class:`RejoinRequested` when one names this rank."""
    global _reported_step, _reported_metrics, _first_step_pending
    path = _heartbeat_file
    if path is _UNRESOLVED:
        path = _resolve_heartbeat()
    if path is None:
        return
    if _first_step_pending and step > marks._resumed_from_step:
        _first_step_pending = False
        mark(phases.FIRST_STEP)
    _close_step_compute()
    if slow_phase_stack._open and slow_phase_stack.close_passed(step):
        heartbeat_throttle._next_heartbeat_at = 0.0  # the save is over: say so now
    _reported_step = step
    _reported_metrics = metrics
    now = time.monotonic()
    if rejoin_requests._rejoin_armed and now >= rejoin_requests._next_rejoin_poll_at:
        rejoin_requests._next_rejoin_poll_at = now + REJOIN_POLL_INTERVAL_S
        _poll_control()
        _raise_if_rejoin_requested()
    if now < heartbeat_throttle._next_heartbeat_at:
        return
    heartbeat_throttle._next_heartbeat_at = now + _heartbeat_interval_s
    _write_heartbeat(str(path), step, metrics)


def flush_heartbeat() -> None:
    """Write the last reported step now, bypassing the throttle. Also written at a
    clean exit (:mod:`atexit`), so the supervisor is never left a stale step."""
    path = _heartbeat_file
    if not isinstance(path, str) or _reported_step is None:
        return
    heartbeat_throttle._next_heartbeat_at = time.monotonic() + _heartbeat_interval_s
    _write_heartbeat(path, _reported_step, _reported_metrics)


def _flush_at_exit() -> None:
    """At a clean exit, the last step and the ``finishing`` slow phase: what is left
    (threads joined, the process group's destructors, the interpreter's teardown) takes
    seconds on a loaded machine, and is not a hang until ``hang_timeout_s``."""
    slow_phase_stack._open.append(slow_phase_stack.OpenPhase(phases.FINISHING, None))
    flush_heartbeat()


def _write_heartbeat(
    path: str, step: int, metrics: dict[str, Any], *, rejoin: str | None = None
) -> None:
    global _heartbeat_warned, _last_write_at
    written = time.monotonic()
    payload = {
        "step": int(step),
        "time": time.time(),
        "pid": os.getpid(),
        environment.HEARTBEAT_GENERATION: _generation_now(),
        "metrics": {name: _as_float(value) for name, value in metrics.items()},
        phases.HEARTBEAT_FIELD: phase_marks(),
    }
    if rejoin is not None:
        payload[environment.HEARTBEAT_REJOIN] = rejoin
    slow = slow_phase_stack.current()
    if slow is not None:
        payload[phases.SLOW_PHASE_FIELD] = slow
    if _last_write_at is not None:
        payload[environment.HEARTBEAT_GAP_S] = round(written - _last_write_at, 4)
    _last_write_at = written
    compute_s = _take_compute_mean()
    if compute_s is not None:
        payload["compute_s"] = compute_s
    save_s = checkpoint_save_s()
    if save_s is not None:
        payload[environment.HEARTBEAT_CHECKPOINT_SAVE_S] = save_s
    try:
        # No fsync: a heartbeat only has to be whole (rename gives that), not
        # durable; losing the last one in a machine crash costs nothing.
        _atomic_write(Path(path), json.dumps(payload).encode(), durable=False)
    except OSError as exc:
        # A training step must never die because its monitoring file could not be
        # written; the supervisor will notice the missing progress instead.
        if not _heartbeat_warned:
            _heartbeat_warned = True
            print(f"lazarus.rank: cannot write heartbeat {path}: {exc}", file=sys.stderr)


def _as_float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    # JSON has no NaN/Infinity; a diverged loss is reported as null.
    return number if math.isfinite(number) else None
