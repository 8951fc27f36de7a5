"""Forgetting state: a generation's, when a rank rejoins the next one in place, and
the whole process's, for tests that change the environment within one process. The
state itself stays in the module that owns it."""

from __future__ import annotations

from lazarus.domain import phases
from lazarus.rank import (
    compute_time,
    control,
    heartbeat_throttle,
    heartbeats,
    identity,
    marks,
    rejoin_requests,
    save_timing,
    slow_phase_stack,
)


def _reset_generation() -> None:
    """Forget what belongs to the generation this rank leaves when it rejoins the
    next one in place: the heartbeat file and interval, the control file's signature,
    request and intervals, the resume point, ``first_step``, the save under way, the
    open slow phases, and
    every phase mark but ``torn_down`` (which the new generation's timeline starts
    with). Kept: recent save times (a property of the hardware), the id of the last
    checkpoint request (ids are job-wide), the configured checkpoint directory."""
    heartbeats._heartbeat_file = heartbeats._UNRESOLVED
    heartbeats._heartbeat_interval_s = heartbeats.DEFAULT_HEARTBEAT_INTERVAL_S
    heartbeat_throttle._next_heartbeat_at = 0.0
    heartbeats._reported_step = None
    heartbeats._reported_metrics = {}
    heartbeats._heartbeat_warned = False
    heartbeats._last_write_at = None
    compute_time._step_compute_s = 0.0
    compute_time._window_compute_s = 0.0
    compute_time._window_steps = 0
    control._control_signature = None
    control._unanswered_request = None
    control._hold_after_commit = False
    control._pending_request = False
    control._control_intervals = {}
    control._control_warned.clear()
    heartbeats._first_step_pending = True
    marks._resume_noted = False
    marks._resumed_from_step = 0
    marks._resumed_from_dir = None
    save_timing._save_started = None
    slow_phase_stack._open.clear()
    rejoin_requests._rejoin_request = None
    rejoin_requests._next_rejoin_poll_at = 0.0
    torn_down = marks._phases.get(phases.TORN_DOWN)
    marks._phases.clear()
    if torn_down is not None:
        marks._phases[phases.TORN_DOWN] = torn_down


def _reset_state() -> None:
    """Forget cached environment and per-process state (for tests that change
    the environment within one process)."""
    _reset_generation()
    save_timing._save_times.clear()
    save_timing._save_timing_explicit = False
    control._last_checkpoint_request = None
    identity._configured_checkpoint_dir = None
    marks._phases.clear()
    rejoin_requests._rejoin_armed = False
    marks._rejoined = False
