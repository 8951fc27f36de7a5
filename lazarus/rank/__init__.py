"""The helper a training script imports to cooperate with Lazarus.

Lazarus watches ranks from outside the process, so everything here talks to it
through small files whose names arrive in environment variables
(:mod:`lazarus.domain.environment`): a heartbeat file the supervisor reads to tell a
slow rank from a hung one, a control file through which the controller asks for
a checkpoint, and a checkpoint directory whose commit protocol lets the
controller pick a resume point without trusting a half-written save.

Three rules shape the code:

* **Standard library only.** This module is imported inside every rank, often
  before ``torch``; it must never drag in ``temporalio`` or ``torch`` (the torch
  glue lives in :mod:`lazarus.rank.torch`).
* **Cheap on the hot path.** :func:`heartbeat` and :func:`should_checkpoint` are
  meant to be called every step, so their common path is a clock read or one
  ``stat``; the expensive work happens at most a few times per second.
* **Atomic on disk.** Every file is written to a temporary name in the same
  directory and renamed into place, so a reader (or a crash) never sees half a
  file, and a checkpoint only counts once its ``COMMITTED`` marker exists.

Outside Lazarus (plain ``python`` or ``torchrun``) every function degrades to a
no-op or a sensible fallback, so one script runs everywhere; in particular
:func:`resume_path` then falls back to the newest committed checkpoint, which
lets ``torchrun`` restarts resume too.

Usage::

    import lazarus.rank as lz

    start = lz.resume_step() or 0          # lazarus.rank.torch.load() does this for torch
    for step in range(start, total_steps):
        with lz.compute_timer():           # optional: lets Lazarus spot stragglers
            loss = forward_and_local_work(step)
        exchange_gradients()               # waiting on peers is not compute
        lz.heartbeat(step + 1, loss=loss)  # throttled: call it every step
        if lz.should_checkpoint(step + 1, every=100):  # the controller's interval wins
            save_my_shard(lz.checkpoint_path(step + 1))
            barrier()
            if lz.info().rank == 0:
                lz.commit_checkpoint(step + 1)

Phases of a (re)start (:mod:`lazarus.domain.phases`) are marked with :func:`mark`
and travel in the heartbeat; the memory checkpoint tier lives in
:mod:`lazarus.rank.memory` (files) and :mod:`lazarus.rank.torch` (snapshots).

Rejoin in place (issue 16): under :func:`lazarus.rank.torch.run_resilient`, a rank
whose peer failed keeps its process and moves into the next generation when the
controller writes ``{"rejoin": {"generation": N, "env": {"<RANK>": {...}}}}`` into
its control file. The standard-library half lives here: reading that request (a
malformed one is reported once on stderr and ignored), :class:`RejoinRequested`
(raised by :func:`heartbeat` and :func:`should_checkpoint` when the controller asks
a rank that has not noticed the failure itself), the ``"rejoin": "waiting"``
heartbeat, and the switch of this module's per-generation state to the new
generation. Every heartbeat carries ``"generation"``, the generation the rank acts
for now.

The helper is split by concern; this package re-exports every function, class and
constant of its modules, so ``lazarus.rank.<name>`` is what it always was:
:mod:`~lazarus.rank.identity` (who this rank is, :func:`configure`),
:mod:`~lazarus.rank.marks` (phase marks, the resume point chosen),
:mod:`~lazarus.rank.heartbeats` and :mod:`~lazarus.rank.heartbeat_throttle`,
:mod:`~lazarus.rank.compute_time`, :mod:`~lazarus.rank.save_timing`,
:mod:`~lazarus.rank.slow_phases` and :mod:`~lazarus.rank.slow_phase_stack` (slow phases:
a save, an evaluation, allowed more than the learned hang budget),
:mod:`~lazarus.rank.control` (the control file), :mod:`~lazarus.rank.rejoin_requests`
and :mod:`~lazarus.rank.rejoin` (rejoin in place), :mod:`~lazarus.rank.resume`,
:mod:`~lazarus.rank.checkpoints` (the commit protocol),
:mod:`~lazarus.rank.atomic_files` and :mod:`~lazarus.rank.reset`. Module-level state
(``_resumed_from_step``, ``_unanswered_request``, ...) has one home, the module that
owns it, and is not re-exported: a copy here would go stale the first time the owner
rebinds it. Read or set it there (``lazarus.rank.control._unanswered_request``).
"""

from __future__ import annotations

from lazarus.rank.atomic_files import TEMP_SUFFIX as TEMP_SUFFIX
from lazarus.rank.atomic_files import _atomic_write as _atomic_write
from lazarus.rank.atomic_files import _temp_counter as _temp_counter
from lazarus.rank.atomic_files import temp_path_for
from lazarus.rank.checkpoints import _HASH_CHUNK_BYTES as _HASH_CHUNK_BYTES
from lazarus.rank.checkpoints import (
    HOLD_AFTER_REQUESTED_CHECKPOINT_S as HOLD_AFTER_REQUESTED_CHECKPOINT_S,
)
from lazarus.rank.checkpoints import RESAVE_SUFFIX as RESAVE_SUFFIX
from lazarus.rank.checkpoints import _answered as _answered
from lazarus.rank.checkpoints import _checkpoint_root as _checkpoint_root
from lazarus.rank.checkpoints import _commit as _commit
from lazarus.rank.checkpoints import _describe_and_sync as _describe_and_sync
from lazarus.rank.checkpoints import _replace as _replace
from lazarus.rank.checkpoints import _resave_dir as _resave_dir
from lazarus.rank.checkpoints import _seal as _seal
from lazarus.rank.checkpoints import _write_dir as _write_dir
from lazarus.rank.checkpoints import checkpoint_path, commit_checkpoint
from lazarus.rank.compute_time import _close_step_compute as _close_step_compute
from lazarus.rank.compute_time import _take_compute_mean as _take_compute_mean
from lazarus.rank.compute_time import compute_timer, record_compute_time
from lazarus.rank.control import _interval as _interval
from lazarus.rank.control import _intervals_in as _intervals_in
from lazarus.rank.control import _on_interval as _on_interval
from lazarus.rank.control import _poll_control as _poll_control
from lazarus.rank.control import _rejoin_request_in as _rejoin_request_in
from lazarus.rank.control import checkpoint_every_steps, memory_every_steps, should_checkpoint
from lazarus.rank.heartbeats import _UNRESOLVED as _UNRESOLVED
from lazarus.rank.heartbeats import DEFAULT_HEARTBEAT_INTERVAL_S as DEFAULT_HEARTBEAT_INTERVAL_S
from lazarus.rank.heartbeats import _as_float as _as_float
from lazarus.rank.heartbeats import _resolve_heartbeat as _resolve_heartbeat
from lazarus.rank.heartbeats import _write_heartbeat as _write_heartbeat
from lazarus.rank.heartbeats import flush_heartbeat, heartbeat
from lazarus.rank.identity import RankInfo, checkpoint_dir, configure, info
from lazarus.rank.identity import _env_int as _env_int
from lazarus.rank.identity import _generation_now as _generation_now
from lazarus.rank.identity import _rank_now as _rank_now
from lazarus.rank.identity import _under_lazarus as _under_lazarus
from lazarus.rank.marks import _IMPORTED_AT as _IMPORTED_AT
from lazarus.rank.marks import _note_resume as _note_resume
from lazarus.rank.marks import _process_start_time as _process_start_time
from lazarus.rank.marks import mark, phase_marks
from lazarus.rank.rejoin import REJOIN_TIMEOUT_EXIT_CODE
from lazarus.rank.rejoin import REJOIN_WAIT_POLL_S as REJOIN_WAIT_POLL_S
from lazarus.rank.rejoin import _announced_resume_step as _announced_resume_step
from lazarus.rank.rejoin import _arm_rejoin as _arm_rejoin
from lazarus.rank.rejoin import _await_rejoin as _await_rejoin
from lazarus.rank.rejoin import _enter_generation as _enter_generation
from lazarus.rank.rejoin import _mark_torn_down as _mark_torn_down
from lazarus.rank.rejoin import _write_waiting_heartbeat as _write_waiting_heartbeat
from lazarus.rank.rejoin_requests import _INTEGER_REJOIN_VARIABLES as _INTEGER_REJOIN_VARIABLES
from lazarus.rank.rejoin_requests import REJOIN_POLL_INTERVAL_S as REJOIN_POLL_INTERVAL_S
from lazarus.rank.rejoin_requests import RejoinRequest as RejoinRequest
from lazarus.rank.rejoin_requests import RejoinRequested
from lazarus.rank.rejoin_requests import _is_integer as _is_integer
from lazarus.rank.rejoin_requests import _parse_rejoin as _parse_rejoin
from lazarus.rank.rejoin_requests import _raise_if_rejoin_requested as _raise_if_rejoin_requested
from lazarus.rank.reset import _reset_generation as _reset_generation
from lazarus.rank.reset import _reset_state as _reset_state
from lazarus.rank.resume import _choose_resume_point as _choose_resume_point
from lazarus.rank.resume import _explicit_resume_point as _explicit_resume_point
from lazarus.rank.resume import _fallback_candidates as _fallback_candidates
from lazarus.rank.resume import resume_path, resume_point, resume_step
from lazarus.rank.save_timing import SAVE_TIMES_KEPT as SAVE_TIMES_KEPT
from lazarus.rank.save_timing import _note_save_time as _note_save_time
from lazarus.rank.save_timing import _save_ended as _save_ended
from lazarus.rank.save_timing import _save_starts as _save_starts
from lazarus.rank.save_timing import checkpoint_save_s, record_checkpoint_save
from lazarus.rank.slow_phases import enter_slow_phase, exit_slow_phase, slow_phase

__all__ = [
    "REJOIN_TIMEOUT_EXIT_CODE",
    "RankInfo",
    "RejoinRequested",
    "checkpoint_dir",
    "checkpoint_every_steps",
    "checkpoint_path",
    "checkpoint_save_s",
    "commit_checkpoint",
    "compute_timer",
    "configure",
    "enter_slow_phase",
    "exit_slow_phase",
    "flush_heartbeat",
    "heartbeat",
    "info",
    "mark",
    "memory_every_steps",
    "phase_marks",
    "record_checkpoint_save",
    "record_compute_time",
    "resume_path",
    "resume_point",
    "resume_step",
    "should_checkpoint",
    "slow_phase",
    "temp_path_for",
]
