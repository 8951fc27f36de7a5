"""Rejoin in place (issue 16), the standard-library half of
:func:`lazarus.rank.torch.run_resilient`: arming the search for requests, the
``"rejoin": "waiting"`` heartbeat while the rank waits for one, and the switch of
the helper's per-generation state to the generation it names."""

from __future__ import annotations

import os
import time

from lazarus.domain import environment, phases
from lazarus.rank import control, heartbeat_throttle, heartbeats, marks, rejoin_requests
from lazarus.rank.control import _poll_control
from lazarus.rank.heartbeats import _resolve_heartbeat, _write_heartbeat
from lazarus.rank.marks import mark
from lazarus.rank.rejoin_requests import RejoinRequest
from lazarus.rank.reset import _reset_generation
from lazarus.rank.resume import _explicit_resume_point

REJOIN_WAIT_POLL_S = 0.05
"""How often a rank that tore its process group down reads its control file."""
REJOIN_TIMEOUT_EXIT_CODE = 75
"""Exit status of a rank that gave up on rejoining in place: no request within
``LAZARUS_REJOIN_TIMEOUT_S``, or a process group that would not tear down. 75
(``EX_TEMPFAIL``) is none of the statuses a crash, a signal or the script's own
``sys.exit(1)`` produce, so the controller can tell "gave up waiting" apart."""


def _arm_rejoin(armed: bool) -> None:
    """Turn the search for rejoin requests on (run_resilient) or off."""
    rejoin_requests._rejoin_armed = armed
    rejoin_requests._rejoin_request = None
    rejoin_requests._next_rejoin_poll_at = 0.0
    control._control_signature = None  # read the file again: it may hold a request already


def _write_waiting_heartbeat() -> None:
    """Tell the controller, in the current generation's heartbeat file and at once,
    that this rank tore its process group down and waits to rejoin. The step stays
    the last one the rank completed (or resumed from)."""
    path = heartbeats._heartbeat_file
    if path is heartbeats._UNRESOLVED:
        path = _resolve_heartbeat()
    if not isinstance(path, str):
        return
    reported = heartbeats._reported_step
    step = reported if reported is not None else marks._resumed_from_step
    heartbeat_throttle._next_heartbeat_at = time.monotonic() + heartbeats._heartbeat_interval_s
    _write_heartbeat(path, step, heartbeats._reported_metrics, rejoin="waiting")


def _await_rejoin(timeout_s: float) -> RejoinRequest | None:
    """Wait up to ``timeout_s`` for a rejoin request naming this rank in the current
    control file (read every :data:`REJOIN_WAIT_POLL_S`), writing the ``"waiting"``
    heartbeat at once and then every heartbeat interval, so the controller sees a
    live rank that waits rather than a stale one. None when none came in time."""
    if not rejoin_requests._rejoin_armed:
        raise RuntimeError("_await_rejoin needs run_resilient's _arm_rejoin(True) first")
    deadline = time.monotonic() + timeout_s
    next_beat = 0.0
    while True:
        now = time.monotonic()
        if now >= next_beat:
            _write_waiting_heartbeat()
            next_beat = now + max(heartbeats._heartbeat_interval_s, REJOIN_WAIT_POLL_S)
        _poll_control()
        if rejoin_requests._rejoin_request is not None:
            return rejoin_requests._rejoin_request
        if now >= deadline:
            return None
        time.sleep(min(REJOIN_WAIT_POLL_S, max(0.0, deadline - now)))


def _enter_generation(request: RejoinRequest) -> None:
    """Act for ``request``'s generation from now on: apply its variables to
    ``os.environ``, forget this module's per-generation state, mark
    ``rejoin_received`` and write a first heartbeat into the new generation's file
    at once (its step: the new resume step, since nothing was done in it yet; marked
    ``"rejoin": "joining"``, so it does not start the hang clock), so the controller
    sees the rank act for the new generation before the process group is up."""
    for name, value in request.env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _reset_generation()
    marks._rejoined = True
    mark(phases.REJOIN_RECEIVED)
    path = _resolve_heartbeat()
    if path is not None:
        heartbeats._reported_step = _announced_resume_step()
        heartbeat_throttle._next_heartbeat_at = time.monotonic() + heartbeats._heartbeat_interval_s
        _write_heartbeat(path, heartbeats._reported_step, {}, rejoin="joining")


def _announced_resume_step() -> int:
    """The resume step the environment names (0: none, or malformed)."""
    raw_path = os.environ.get(environment.RESUME_FROM) or None
    raw_step = os.environ.get(environment.RESUME_STEP) or None
    if raw_path is None and raw_step is None:
        return 0
    try:
        return _explicit_resume_point(raw_path, raw_step)[0]
    except ValueError:
        return 0


def _mark_torn_down() -> None:
    """Mark ``torn_down`` now, also on a second rejoin (marks are otherwise once)."""
    marks._phases.pop(phases.TORN_DOWN, None)
    mark(phases.TORN_DOWN)
