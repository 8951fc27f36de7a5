"""Phase marks of a (re)start (:mod:`lazarus.domain.phases`), once per process, and
the resume point this process chose: ``first_step`` is measured from its step, and
memory-tier pruning never deletes its directory. The marks travel in the heartbeat."""

from __future__ import annotations

import os
import time
from pathlib import Path

from lazarus.domain import phases
from lazarus.rank import heartbeat_throttle

_IMPORTED_AT = time.time()

_phases: dict[str, float] = {}
_resume_noted = False
_resumed_from_step = 0
"""The step this process resumed from (0: fresh): FIRST_STEP is the first beyond it."""
_resumed_from_dir: Path | None = None
_rejoined = False
"""This process rejoined a generation in place: ``process_started`` is not re-marked."""


def mark(phase: str) -> None:
    """Record that this process reached ``phase`` now (wall clock), once per process:
    later marks of the same phase are ignored, so a retried step cannot move it.

    The marks travel in the heartbeat (``"phases": {name: unix_time}``), never in a
    file of their own; the next :func:`heartbeat` call writes whatever the throttle
    says, so a phase reaches the controller with the first heartbeat after it.
    Standard names are in :mod:`lazarus.domain.phases`; the helper marks them itself
    (``process_started`` from ``/proc``, ``framework_imported`` when
    :mod:`lazarus.rank.torch` is imported, ``process_group_ready`` in its
    ``init_process_group``, ``checkpoint_loaded`` in its ``load``, ``first_step`` in
    :func:`heartbeat`). Scripts that do one of those steps themselves mark it here."""
    if not phase:
        raise ValueError("a phase needs a name")
    if phase in _phases:
        return
    _phases[phase] = time.time()
    heartbeat_throttle._next_heartbeat_at = 0.0  # the next heartbeat carries it, throttle or not


def phase_marks() -> dict[str, float]:
    """This process's phase marks so far, ``process_started`` included (in this
    generation's: a rank that rejoined a generation in place shows only the rejoin
    phases, :data:`lazarus.domain.phases.REJOIN_PHASES`)."""
    if not _rejoined and phases.PROCESS_STARTED not in _phases:
        _phases[phases.PROCESS_STARTED] = _process_start_time()
    return dict(_phases)


def _process_start_time() -> float:
    """When the kernel started this process, as a unix time.

    ``/proc/self/stat`` field 22 counts clock ticks (10 ms) since boot; set against
    ``CLOCK_BOOTTIME`` now it gives the start without the whole-second rounding of
    ``/proc/stat``'s ``btime``. A process started by ``exec`` (a shim) keeps its
    pid's start. Where ``/proc`` is missing, the import of this module stands in."""
    try:
        with open("/proc/self/stat", "rb") as handle:
            raw = handle.read()
        # The command name (field 2) may hold spaces and parentheses: split after it.
        start_ticks = int(raw[raw.rindex(b")") + 2 :].split()[19])
        age_s = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
        return min(time.time() - age_s, _IMPORTED_AT)
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORTED_AT


def _note_resume(point: tuple[int, Path] | None) -> None:
    """Remember the first resume point this process chose: ``first_step`` is measured
    from its step, and memory-tier pruning never deletes its directory."""
    global _resume_noted, _resumed_from_step, _resumed_from_dir
    if _resume_noted:
        return
    _resume_noted = True
    if point is not None:
        _resumed_from_step, _resumed_from_dir = point
