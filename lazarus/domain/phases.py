"""Names of the rank-side phases of a (re)start, shared by the rank helper and the
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
