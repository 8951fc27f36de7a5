"""Names of the rank-side phases of a (re)start, and of the slow phases a rank may
declare (a checkpoint save, an evaluation), shared by the rank helper and the
controller.

A rank marks each phase once per process (:func:`lazarus.rank.mark`) with the
wall-clock time it was reached, and every heartbeat carries the marks under
:data:`HEARTBEAT_FIELD` as ``{name: unix_time}``. The controller joins them with
its own phases (fault, detection, stop, resume point, launch) into an incident's
breakdown, so both sides must spell the names the same way: hence this module.

Standard library only (nothing at all, in fact): it is imported inside ranks.
"""

from __future__ import annotations

PROCESS_STARTED = "process_started"
"""The rank's process started (read from ``/proc``; see :func:`lazarus.rank.mark`)."""
FRAMEWORK_IMPORTED = "framework_imported"
"""``lazarus.rank.torch`` was imported, hence torch was."""
PROCESS_GROUP_READY = "process_group_ready"
"""``torch.distributed.init_process_group`` returned."""
CHECKPOINT_LOADED = "checkpoint_loaded"
"""The resume checkpoint was loaded, or there was none to load."""
FIRST_STEP = "first_step"
"""The first heartbeat of this process beyond the step it resumed from."""

TORN_DOWN = "torn_down"
"""A rank that keeps its process (``rejoin``) destroyed its failed process group."""
REJOIN_RECEIVED = "rejoin_received"
"""That rank read the controller's request to rejoin the next generation."""

REJOIN_PHASES = (TORN_DOWN, REJOIN_RECEIVED, PROCESS_GROUP_READY, CHECKPOINT_LOADED, FIRST_STEP)
"""The phases of a surviving rank that rejoins in place, in order: its process, its
imports and its model are kept, so it marks these again in the new generation."""

RANK_PHASES = (
    PROCESS_STARTED,
    FRAMEWORK_IMPORTED,
    PROCESS_GROUP_READY,
    CHECKPOINT_LOADED,
    FIRST_STEP,
)
"""The standard phases, in the order a restart reaches them."""

HEARTBEAT_FIELD = "phases"
"""The heartbeat JSON key holding ``{phase: unix_time}``."""

# Slow phases (issue 38): stretches of training that are allowed to be slower than a
# step, declared by the rank helper (:func:`lazarus.rank.slow_phase`) while they last.
# Unlike the start-up phases above (reached once, dated), a slow phase has a start and
# an end; the heartbeat carries the innermost one open under SLOW_PHASE_FIELD as
# ``{"name": ..., "budget_s": seconds or null}``, and the supervisor gives a rank in
# one (and its peers, which wait for it in their next collective) that phase's budget
# instead of the learned one.

CHECKPOINT_SAVE = "checkpoint_save"
"""A disk checkpoint: from the first ``checkpoint_path`` of a step to its commit (rank
0), and the whole of ``lazarus.rank.torch.save`` on every rank."""
EVALUATION = "evaluation"
"""An evaluation pass (declared by the script)."""
DATA_STALL = "data_loader"
"""Waiting for the data loader (declared by the script)."""
PLANNED_STOP_HOLD = "planned_stop_hold"
"""After a just-in-time checkpoint the controller asked for: holding at the saved step
until the planned stop arrives."""

FINISHING = "finishing"
"""After the last step: final saves, the last barrier, the process group's teardown
and the interpreter's exit (``run_resilient`` after training returns, and every
helper-using process from its ``atexit``)."""

SLOW_PHASE_FIELD = "slow_phase"
"""The heartbeat JSON key holding the innermost open slow phase (absent outside one)."""
