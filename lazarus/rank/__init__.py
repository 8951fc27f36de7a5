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

The helper is split by concern, and this package exports exactly ``__all__`` (the
names the docs' Python API page lists); everything else lives in, and is imported
from, the module that owns it: :mod:`~lazarus.rank.identity` (who this rank is,
:func:`configure`), :mod:`~lazarus.rank.marks` (phase marks, the resume point chosen),
:mod:`~lazarus.rank.heartbeats` and :mod:`~lazarus.rank.heartbeat_throttle`,
:mod:`~lazarus.rank.compute_time`, :mod:`~lazarus.rank.save_timing`,
:mod:`~lazarus.rank.slow_phases` and :mod:`~lazarus.rank.slow_phase_stack` (slow phases:
a save, an evaluation, allowed more than the learned hang budget),
:mod:`~lazarus.rank.control` (the control file), :mod:`~lazarus.rank.rejoin_requests`
and :mod:`~lazarus.rank.rejoin` (rejoin in place), :mod:`~lazarus.rank.resume`,
:mod:`~lazarus.rank.checkpoints` (the commit protocol),
:mod:`~lazarus.rank.atomic_files` and :mod:`~lazarus.rank.reset`. The modules import
each other directly, never through this package, so there is no import circle. Module-level
state (``_resumed_from_step``, ``_unanswered_request``, ...) has one home, the module
that owns it: read or set it there (``lazarus.rank.control._unanswered_request``), and
reset it all with ``lazarus.rank.reset._reset_state()``.
"""

from __future__ import annotations

from lazarus.rank.atomic_files import temp_path_for
from lazarus.rank.checkpoints import checkpoint_path, commit_checkpoint
from lazarus.rank.compute_time import compute_timer, record_compute_time
from lazarus.rank.control import checkpoint_every_steps, memory_every_steps, should_checkpoint
from lazarus.rank.heartbeats import flush_heartbeat, heartbeat
from lazarus.rank.identity import RankInfo, checkpoint_dir, configure, info
from lazarus.rank.marks import mark, phase_marks
from lazarus.rank.rejoin import REJOIN_TIMEOUT_EXIT_CODE
from lazarus.rank.rejoin_requests import GenerationFailed, RejoinRequested
from lazarus.rank.resume import resume_path, resume_point, resume_step
from lazarus.rank.save_timing import checkpoint_save_s, record_checkpoint_save
from lazarus.rank.slow_phases import enter_slow_phase, exit_slow_phase, slow_phase

__all__ = [
    "REJOIN_TIMEOUT_EXIT_CODE",
    "GenerationFailed",
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
