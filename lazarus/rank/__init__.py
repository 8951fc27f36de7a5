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
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import itertools
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lazarus.domain import chaos_points, checkpoint_layout, environment, memory_tier, phases

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
    "temp_path_for",
]

DEFAULT_HEARTBEAT_INTERVAL_S = 0.2
TEMP_SUFFIX = checkpoint_layout.TEMP_SUFFIX
"""Files ending in this are unfinished writes; the manifest never lists them."""

_HASH_CHUNK_BYTES = 1 << 20
_IMPORTED_AT = time.time()


# --------------------------------------------------------------------------- identity


@dataclass(frozen=True)
class RankInfo:
    """Who this process is. Outside Lazarus the torchrun variables (or a
    single-process default) fill it, with ``job_id`` None and ``generation`` 0."""

    rank: int
    local_rank: int
    world_size: int
    generation: int
    job_id: str | None
    checkpoint_dir: Path | None
    under_lazarus: bool


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def _under_lazarus() -> bool:
    # The job id is set only by the Lazarus launcher, never by torchrun or a user.
    return bool(os.environ.get(environment.JOB_ID))


def info() -> RankInfo:
    """Read this rank's identity from the environment (re-read on every call, so
    tests and wrappers that change the environment see the change)."""
    rank = _env_int(environment.RANK, 0)
    return RankInfo(
        rank=rank,
        local_rank=_env_int(environment.LOCAL_RANK, rank),
        world_size=_env_int(environment.WORLD_SIZE, 1),
        generation=_env_int(environment.GENERATION, 0),
        job_id=os.environ.get(environment.JOB_ID) or None,
        checkpoint_dir=checkpoint_dir(),
        under_lazarus=_under_lazarus(),
    )


# --------------------------------------------------------------------------- configuration

_configured_checkpoint_dir: Path | None = None


def configure(*, checkpoint_dir: str | os.PathLike[str] | None = None) -> None:
    """Name a checkpoint directory for runs outside Lazarus (e.g. from a
    ``--checkpoint-dir`` flag). Lazarus's own variable still wins, because the
    controller must decide where a job's checkpoints live."""
    global _configured_checkpoint_dir
    _configured_checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None


def checkpoint_dir() -> Path | None:
    """The root holding ``step-NNNNNNNN/`` directories, or None if nobody said."""
    from_env = os.environ.get(environment.CHECKPOINT_DIR)
    if from_env:
        return Path(from_env)
    return _configured_checkpoint_dir


# --------------------------------------------------------------------------- phases

_phases: dict[str, float] = {}
_first_step_pending = True
_resume_noted = False
_resumed_from_step = 0
"""The step this process resumed from (0: fresh): FIRST_STEP is the first beyond it."""
_resumed_from_dir: Path | None = None


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
    global _next_heartbeat_at
    if not phase:
        raise ValueError("a phase needs a name")
    if phase in _phases:
        return
    _phases[phase] = time.time()
    _next_heartbeat_at = 0.0  # the next heartbeat carries it, throttle or not


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


# --------------------------------------------------------------------------- heartbeat

# Module-level state keeps the throttled path to a clock read and a compare:
# no syscalls, no allocation beyond the caller's own **metrics dict.
_UNRESOLVED = object()
_heartbeat_file: object | str | None = _UNRESOLVED
_heartbeat_interval_s = DEFAULT_HEARTBEAT_INTERVAL_S
_next_heartbeat_at = 0.0
_reported_step: int | None = None
_reported_metrics: dict[str, Any] = {}
_heartbeat_warned = False
_flush_registered = False


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
        atexit.register(flush_heartbeat)
    return path


# --------------------------------------------------------------------------- compute time

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
    global _reported_step, _reported_metrics, _next_heartbeat_at, _first_step_pending
    global _next_rejoin_poll_at
    path = _heartbeat_file
    if path is _UNRESOLVED:
        path = _resolve_heartbeat()
    if path is None:
        return
    if _first_step_pending and step > _resumed_from_step:
        _first_step_pending = False
        mark(phases.FIRST_STEP)
    _close_step_compute()
    _reported_step = step
    _reported_metrics = metrics
    now = time.monotonic()
    if _rejoin_armed and now >= _next_rejoin_poll_at:
        _next_rejoin_poll_at = now + REJOIN_POLL_INTERVAL_S
        _poll_control()
        _raise_if_rejoin_requested()
    if now < _next_heartbeat_at:
        return
    _next_heartbeat_at = now + _heartbeat_interval_s
    _write_heartbeat(str(path), step, metrics)


def flush_heartbeat() -> None:
    """Write the last reported step now, bypassing the throttle. Registered with
    :mod:`atexit`, so a clean exit never leaves the supervisor a stale step."""
    global _next_heartbeat_at
    path = _heartbeat_file
    if not isinstance(path, str) or _reported_step is None:
        return
    _next_heartbeat_at = time.monotonic() + _heartbeat_interval_s
    _write_heartbeat(path, _reported_step, _reported_metrics)


def _write_heartbeat(
    path: str, step: int, metrics: dict[str, Any], *, rejoin: str | None = None
) -> None:
    global _heartbeat_warned
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


def _generation_now() -> int:
    """The generation this rank acts for (``LAZARUS_GENERATION``; it changes when the
    rank rejoins in place); 0 when unset or malformed: a heartbeat never raises."""
    try:
        return _env_int(environment.GENERATION, 0)
    except ValueError:
        return 0


def _as_float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    # JSON has no NaN/Infinity; a diverged loss is reported as null.
    return number if math.isfinite(number) else None


# --------------------------------------------------------------------------- save timings

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
    global _save_timing_explicit, _next_heartbeat_at
    _save_timing_explicit = True
    _note_save_time(seconds)
    _next_heartbeat_at = 0.0  # the next heartbeat carries it, throttle or not


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


def _save_starts(step: int) -> None:
    global _save_started
    if _save_started is None or _save_started[0] != step:
        _save_started = (step, time.monotonic())


def _save_ended(step: int, sealed: bool) -> None:
    """A commit of ``step`` finished: its save's time counts if this process timed it."""
    global _save_started, _next_heartbeat_at
    started, _save_started = _save_started, None
    if _save_timing_explicit or not sealed or started is None or started[0] != step:
        return
    _note_save_time(time.monotonic() - started[1])
    _next_heartbeat_at = 0.0


# --------------------------------------------------------------------------- control file

_control_signature: tuple[int, int, int] | None = None
_last_checkpoint_request: int | None = None
_unanswered_request: int | None = None
"""The request the next commit answers: recorded in its manifest, so the controller
knows which checkpoint it asked for."""
_hold_after_commit = False
HOLD_AFTER_REQUESTED_CHECKPOINT_S = 30.0


_pending_request = False
"""A new request was read from the control file and not yet returned by should_checkpoint."""
_control_intervals: dict[str, int] = {}
"""Interval overrides the control file holds now (key -> steps)."""
_control_warned: set[str] = set()


def should_checkpoint(step: int | None = None, *, every: int | None = None) -> bool:
    """True exactly once for each new checkpoint request the controller writes to
    ``LAZARUS_CONTROL_FILE`` (``{"checkpoint_request": <id>}``); False otherwise.
    Ids are positive; 0, which the launcher writes when it starts a generation,
    means "no request", so a fresh generation does not checkpoint at once.

    Given ``step`` (completed steps), it is also True when ``step`` is a multiple of
    the disk checkpoint interval: the controller's (:func:`checkpoint_every_steps`,
    from the control file or ``LAZARUS_CHECKPOINT_EVERY_STEPS``) when it set one,
    else the script's own ``every``. Without ``step`` it answers requests only, as
    it always did.

    Cheap enough for every step: one ``stat``, and the file is read only when
    it was replaced or its mtime or size changed. In a multi-rank job, ranks
    see the change at different steps, so ask on one rank and broadcast the
    answer (``lazarus.rank.torch.should_checkpoint`` does), or ranks will enter
    the checkpoint collective at different steps.

    Under :func:`lazarus.rank.torch.run_resilient` it raises :class:`RejoinRequested`
    when the control file asks this rank to rejoin a newer generation."""
    global _pending_request
    _poll_control()
    _raise_if_rejoin_requested()
    requested = _pending_request
    _pending_request = False
    if step is None:
        return requested
    interval = _interval(
        environment.CONTROL_CHECKPOINT_EVERY_STEPS, environment.CHECKPOINT_EVERY_STEPS
    )
    if interval is None:
        interval = every
    return requested or _on_interval(step, interval)


def checkpoint_every_steps() -> int | None:
    """The controller's disk checkpoint interval in steps: the control file's
    ``checkpoint_every_steps`` if present, else ``LAZARUS_CHECKPOINT_EVERY_STEPS``,
    else None (the script decides). 0 means "only when requested"."""
    _poll_control()
    return _interval(environment.CONTROL_CHECKPOINT_EVERY_STEPS, environment.CHECKPOINT_EVERY_STEPS)


def memory_every_steps() -> int:
    """The memory snapshot interval in steps; 0 when the memory tier is off. Set by
    the control file's ``memory_every_steps``, else ``LAZARUS_MEMORY_EVERY_STEPS``,
    else 1 once ``LAZARUS_MEMORY_CHECKPOINT_DIR`` names a directory."""
    if not os.environ.get(environment.MEMORY_CHECKPOINT_DIR):
        return 0
    _poll_control()
    interval = _interval(environment.CONTROL_MEMORY_EVERY_STEPS, environment.MEMORY_EVERY_STEPS)
    return 1 if interval is None else interval


def _on_interval(step: int, interval: int | None) -> bool:
    return interval is not None and interval > 0 and step > 0 and step % interval == 0


def _interval(control_key: str, variable: str) -> int | None:
    """The control file's value for ``control_key`` if it holds one, else the
    environment's ``variable``, else None. A malformed variable is the launcher's
    bug and raises; a malformed control value was warned about and is ignored."""
    if control_key in _control_intervals:
        return _control_intervals[control_key]
    if not os.environ.get(variable, "").strip():
        return None
    value = _env_int(variable, 0)
    if value < 0:
        raise ValueError(f"environment variable {variable}={value} must be >= 0")
    return value


def _poll_control() -> None:
    """Read the control file if it changed since the last read: record a new
    checkpoint request (for :func:`should_checkpoint`), the interval overrides and,
    under run_resilient, a rejoin request naming this rank."""
    global _control_signature, _last_checkpoint_request, _unanswered_request
    global _hold_after_commit, _pending_request, _control_intervals, _rejoin_request
    path = os.environ.get(environment.CONTROL_FILE)
    if not path:
        return
    try:
        stat = os.stat(path)
    except OSError:
        return
    # The inode catches a rename-into-place rewrite even within one coarse mtime
    # tick; mtime and size catch writers that rewrite in place.
    signature = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    if signature == _control_signature:
        return
    try:
        with open(path, "rb") as handle:
            document = json.loads(handle.read())
        request = document.get("checkpoint_request")
    except (OSError, ValueError, AttributeError):
        # Half-written or foreign content: leave the signature unrecorded so the
        # next call reads it again.
        return
    _control_signature = signature
    _control_intervals = _intervals_in(document, path)
    if _rejoin_armed:
        # Once seen, a request stays until it is acted on: a later rewrite of the
        # file that drops the key must not take it back.
        _rejoin_request = _rejoin_request_in(document, path) or _rejoin_request
    if not isinstance(request, int) or isinstance(request, bool) or request <= 0:
        return
    if request == _last_checkpoint_request:
        return
    _last_checkpoint_request = request
    _unanswered_request = request
    _hold_after_commit = document.get("then") == "hold"
    _pending_request = True


def _intervals_in(document: dict[str, Any], path: str) -> dict[str, int]:
    """The interval overrides in a control document: absent or null keys leave the
    environment's value in force; anything but an integer >= 0 is reported once on
    stderr and ignored, because training must not die of a bad control write."""
    found: dict[str, int] = {}
    for key in (environment.CONTROL_CHECKPOINT_EVERY_STEPS, environment.CONTROL_MEMORY_EVERY_STEPS):
        value = document.get(key)
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            found[key] = value
        elif key not in _control_warned:
            _control_warned.add(key)
            print(
                f"lazarus.rank: control file {path}: {key}={value!r} is not an integer >= 0; "
                "ignored",
                file=sys.stderr,
            )
    return found


# --------------------------------------------------------------------------- rejoin in place

REJOIN_POLL_INTERVAL_S = 0.2
"""How often :func:`heartbeat` looks for a rejoin request (one ``stat``): a rank the
controller asks to rejoin leaves within a fraction of a second, and the throttled
path stays a clock read."""
REJOIN_WAIT_POLL_S = 0.05
"""How often a rank that tore its process group down reads its control file."""
REJOIN_TIMEOUT_EXIT_CODE = 75
"""Exit status of a rank that gave up on rejoining in place: no request within
``LAZARUS_REJOIN_TIMEOUT_S``, or a process group that would not tear down. 75
(``EX_TEMPFAIL``) is none of the statuses a crash, a signal or the script's own
``sys.exit(1)`` produce, so the controller can tell "gave up waiting" apart."""

_INTEGER_REJOIN_VARIABLES = frozenset(
    {
        environment.RANK,
        environment.LOCAL_RANK,
        environment.GROUP_RANK,
        environment.WORLD_SIZE,
        environment.LOCAL_WORLD_SIZE,
        environment.MASTER_PORT,
        environment.RESTART_COUNT,
        environment.GENERATION,
        environment.RESUME_STEP,
        environment.MEMORY_KEEP,
        environment.MEMORY_EVERY_STEPS,
        environment.CHECKPOINT_EVERY_STEPS,
    }
)
"""Rejoin variables the helper parses as integers: a request setting one to anything
else is refused whole, rather than crashing the rank after it applied it."""


class RejoinRequested(Exception):
    """The controller asks this rank to leave its generation and rejoin ``generation``
    in place: raised by :func:`heartbeat` and :func:`should_checkpoint`, only under
    :func:`lazarus.rank.torch.run_resilient`, which catches it, tears the process group
    down and rejoins. It reaches a rank that has not noticed the failure itself (a
    rank busy in its own work while a peer died). Let it propagate: a script that
    catches ``Exception`` around its step should re-raise this one."""

    def __init__(self, rank: int, generation: int) -> None:
        super().__init__(f"the controller asks rank {rank} to rejoin generation {generation}")
        self.rank = rank
        self.generation = generation


@dataclass(frozen=True)
class RejoinRequest:
    """A valid rejoin request naming this rank: the generation to act for and the
    variables to set (a string) or unset (None); ``LAZARUS_GENERATION`` is always
    among them. Variables the request does not name keep their value."""

    generation: int
    env: dict[str, str | None]


_rejoin_armed = False
"""Set by run_resilient: only then do heartbeat and should_checkpoint look for requests."""
_rejoin_request: RejoinRequest | None = None
"""The newest valid request for this rank read from the control file, not acted on yet."""
_next_rejoin_poll_at = 0.0
_rejoined = False
"""This process rejoined a generation in place: ``process_started`` is not re-marked."""


def _arm_rejoin(armed: bool) -> None:
    """Turn the search for rejoin requests on (run_resilient) or off."""
    global _rejoin_armed, _rejoin_request, _next_rejoin_poll_at, _control_signature
    _rejoin_armed = armed
    _rejoin_request = None
    _next_rejoin_poll_at = 0.0
    _control_signature = None  # read the file again: it may hold a request already


def _raise_if_rejoin_requested() -> None:
    if _rejoin_armed and _rejoin_request is not None:
        raise RejoinRequested(_rank_now(), _rejoin_request.generation)


def _rank_now() -> int:
    try:
        return _env_int(environment.RANK, 0)
    except ValueError:
        return 0


def _rejoin_request_in(document: dict[str, Any], path: str) -> RejoinRequest | None:
    """The control document's rejoin request if it is valid, newer than this rank's
    generation and names this rank; None otherwise. A malformed one is reported once
    on stderr and ignored: training must not die of a bad control write (the
    controller then sees a rank that never rejoined, and replaces it)."""
    raw = document.get(environment.CONTROL_REJOIN)
    if raw is None:
        return None
    problem, request = _parse_rejoin(raw)
    if problem is not None and environment.CONTROL_REJOIN not in _control_warned:
        _control_warned.add(environment.CONTROL_REJOIN)
        print(
            f"lazarus.rank: control file {path}: rejoin request ignored: {problem}",
            file=sys.stderr,
        )
    return request


def _parse_rejoin(raw: Any) -> tuple[str | None, RejoinRequest | None]:
    """``(problem, request)``: a request for this rank, or what is wrong with the
    entry; both None for a request that is not for this rank (an older generation,
    or other ranks only: a rank without an entry is one the controller replaces)."""
    if not isinstance(raw, dict):
        return f"{raw!r} is not an object", None
    generation = raw.get("generation")
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 1:
        return f"generation={generation!r} is not an integer >= 1", None
    entries = raw.get("env")
    if not isinstance(entries, dict):
        return f"env={entries!r} is not an object", None
    if generation <= _generation_now():
        return None, None
    rank = _rank_now()
    entry = entries.get(str(rank))
    if entry is None:
        return None, None
    if not isinstance(entry, dict):
        return f"the entry of rank {rank} is not an object", None
    env: dict[str, str | None] = {}
    for name, value in entry.items():
        if name not in environment.REJOIN_VARIABLES:
            return f"rank {rank}: {name!r} is not a rejoin variable", None
        if value is not None and not isinstance(value, str):
            return f"rank {rank}: {name}={value!r} is neither a string nor null", None
        if value is not None and name in _INTEGER_REJOIN_VARIABLES and not _is_integer(value):
            return f"rank {rank}: {name}={value!r} is not an integer", None
        env[name] = value
    if env.setdefault(environment.GENERATION, str(generation)) != str(generation):
        return (
            f"rank {rank}: {environment.GENERATION}={env[environment.GENERATION]!r} "
            f"contradicts generation {generation}",
            None,
        )
    return None, RejoinRequest(generation, env)


def _is_integer(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _write_waiting_heartbeat() -> None:
    """Tell the controller, in the current generation's heartbeat file and at once,
    that this rank tore its process group down and waits to rejoin. The step stays
    the last one the rank completed (or resumed from)."""
    global _next_heartbeat_at
    path = _heartbeat_file
    if path is _UNRESOLVED:
        path = _resolve_heartbeat()
    if not isinstance(path, str):
        return
    step = _reported_step if _reported_step is not None else _resumed_from_step
    _next_heartbeat_at = time.monotonic() + _heartbeat_interval_s
    _write_heartbeat(path, step, _reported_metrics, rejoin="waiting")


def _await_rejoin(timeout_s: float) -> RejoinRequest | None:
    """Wait up to ``timeout_s`` for a rejoin request naming this rank in the current
    control file (read every :data:`REJOIN_WAIT_POLL_S`), writing the ``"waiting"``
    heartbeat at once and then every heartbeat interval, so the controller sees a
    live rank that waits rather than a stale one. None when none came in time."""
    if not _rejoin_armed:
        raise RuntimeError("_await_rejoin needs run_resilient's _arm_rejoin(True) first")
    deadline = time.monotonic() + timeout_s
    next_beat = 0.0
    while True:
        now = time.monotonic()
        if now >= next_beat:
            _write_waiting_heartbeat()
            next_beat = now + max(_heartbeat_interval_s, REJOIN_WAIT_POLL_S)
        _poll_control()
        if _rejoin_request is not None:
            return _rejoin_request
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
    global _rejoined, _reported_step, _next_heartbeat_at
    for name, value in request.env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _reset_generation()
    _rejoined = True
    mark(phases.REJOIN_RECEIVED)
    path = _resolve_heartbeat()
    if path is not None:
        _reported_step = _announced_resume_step()
        _next_heartbeat_at = time.monotonic() + _heartbeat_interval_s
        _write_heartbeat(path, _reported_step, {}, rejoin="joining")


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
    _phases.pop(phases.TORN_DOWN, None)
    mark(phases.TORN_DOWN)


# --------------------------------------------------------------------------- resume


def resume_point(
    *, agree: Callable[[list[int]], int | None] | None = None
) -> tuple[int, Path] | None:
    """The ``(step, directory)`` to resume from, or None to start fresh.

    Under Lazarus only the controller's choice counts (it may have skipped a
    checkpoint it judged bad, and it may point into the memory tier). Outside
    Lazarus the explicit variables still win, and otherwise the newest committed
    checkpoint across the memory tier (usable snapshots of
    :func:`lazarus.rank.memory.usable_snapshots`) and the disk tier is used, so a
    ``torchrun`` restart resumes as well; on equal steps the memory copy wins.

    ``agree`` makes that fallback choice collective: it receives this rank's
    candidate steps and returns the step every rank can resume from (or None), as
    :func:`lazarus.rank.torch.load` does, because nodes' memory tiers may differ by a
    snapshot. It is called on every rank that takes the fallback, even one with no
    candidates. Call this once at startup: later it may see the run's own new
    checkpoints."""
    point = _choose_resume_point(agree)
    _note_resume(point)
    return point


def _choose_resume_point(
    agree: Callable[[list[int]], int | None] | None,
) -> tuple[int, Path] | None:
    raw_path = os.environ.get(environment.RESUME_FROM) or None
    raw_step = os.environ.get(environment.RESUME_STEP) or None
    if raw_path is not None or raw_step is not None:
        return _explicit_resume_point(raw_path, raw_step)
    if _under_lazarus():
        return None
    candidates = _fallback_candidates()
    if agree is not None:
        wanted = agree([step for step, _ in candidates])
        candidates = [(step, path) for step, path in candidates if step == wanted]
    return candidates[-1] if candidates else None


def _fallback_candidates() -> list[tuple[int, Path]]:
    """Every checkpoint the outside-Lazarus fallback may resume from, oldest first;
    a memory snapshot sorts after a disk checkpoint of the same step."""
    from lazarus.rank import memory  # memory imports this module: import on use

    ranked: list[tuple[int, int, Path]] = []
    root = checkpoint_dir()
    if root is not None:
        ranked.extend((step, 0, path) for step, path in checkpoint_layout.committed_steps(root))
    ranked.extend((step, 1, path) for step, path in memory.usable_snapshots())
    ranked.sort()
    return [(step, path) for step, _, path in ranked]


def _explicit_resume_point(raw_path: str | None, raw_step: str | None) -> tuple[int, Path]:
    step = _env_int(environment.RESUME_STEP, -1) if raw_step is not None else None
    if raw_path is not None:
        # A resume point in the memory tier names its logical root: the files are in
        # this user's private root on this node.
        path = Path(memory_tier.on_node(raw_path, os.getuid()))
        if step is None:
            step = checkpoint_layout.parse_step_dir(path.name)
            if step is None:
                raise ValueError(
                    f"{environment.RESUME_FROM}={raw_path!r} is not a step-NNNNNNNN "
                    f"directory; set {environment.RESUME_STEP} too"
                )
        return step, path
    assert step is not None
    root = checkpoint_dir()
    if root is None:
        raise ValueError(
            f"{environment.RESUME_STEP} is set but no checkpoint directory is known; "
            f"set {environment.RESUME_FROM} or {environment.CHECKPOINT_DIR}"
        )
    return step, root / checkpoint_layout.step_dir_name(step)


def resume_step() -> int | None:
    """The step to resume from (see :func:`resume_point`), or None to start fresh."""
    point = resume_point()
    return point[0] if point else None


def resume_path() -> Path | None:
    """The checkpoint directory to resume from (see :func:`resume_point`)."""
    point = resume_point()
    return point[1] if point else None


# --------------------------------------------------------------------------- checkpoints


RESAVE_SUFFIX = checkpoint_layout.RESAVE_SUFFIX
"""``.step-NNNNNNNN.resave``: where a committed step is saved again (hidden from readers)."""


def _checkpoint_root() -> Path:
    root = checkpoint_dir()
    if root is None:
        raise RuntimeError(
            f"no checkpoint directory: set {environment.CHECKPOINT_DIR} or call "
            "lazarus.rank.configure(checkpoint_dir=...)"
        )
    return root


def _resave_dir(root: Path, step: int) -> Path:
    return root / f".{checkpoint_layout.step_dir_name(step)}{RESAVE_SUFFIX}"


def checkpoint_path(step: int) -> Path:
    """Create (if needed) and return the directory every rank writes its files for
    ``step`` into before rank 0 commits: ``<checkpoint_dir>/step-NNNNNNNN``.

    When that step is already committed (a relaunch re-saving a step it had saved
    before, or a just-in-time request landing on a saved step), the files go to a
    hidden sibling instead, which :func:`commit_checkpoint` renames over the old
    copy once it is sealed: the old copy stays whole until the new one is, and new
    bytes never end up under the old manifest. The first call for a step starts the
    clock of that save (see :func:`record_checkpoint_save`)."""
    root = _checkpoint_root()
    _save_starts(step)
    return _write_dir(root, step)


def _write_dir(root: Path, step: int) -> Path:
    """:func:`checkpoint_path` under any root (the disk or the memory tier)."""
    directory = root / checkpoint_layout.step_dir_name(step)
    if checkpoint_layout.is_committed(directory):
        directory = _resave_dir(root, step)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def commit_checkpoint(step: int, *, hash_files: bool = True) -> Path:
    """Seal the checkpoint for ``step``: write ``manifest.json``, then the
    ``COMMITTED`` marker, each atomically and fsynced, marker last.

    Call it on rank 0 only, after a barrier, once every rank's files are written:
    the marker is what tells the controller the directory is safe to resume from,
    so it must not exist before the data is durable. A step saved again after it
    was committed (see :func:`checkpoint_path`) is sealed in its hidden directory
    and then replaces the old copy by rename; calling it again for a committed step
    with nothing re-saved does nothing, so a retried commit is harmless.
    ``hash_files`` records each file's sha256 (set False for very large
    checkpoints; sizes are always recorded)."""
    me = info()
    if me.rank != 0:
        raise RuntimeError(f"commit_checkpoint must run on rank 0 only (this is rank {me.rank})")
    request = _unanswered_request
    final, sealed = _commit(
        _checkpoint_root(), step, me, hash_files=hash_files, request=request, tier=None
    )
    _save_ended(step, sealed)  # before any hold: waiting for the stop is not the save
    if sealed and request is not None:
        _answered(request)
    return final


def _commit(
    root: Path,
    step: int,
    me: RankInfo,
    *,
    hash_files: bool,
    request: int | None,
    tier: str | None,
) -> tuple[Path, bool]:
    """The commit protocol of both tiers: seal ``step``'s directory under ``root``
    (or its re-save, then swap it in). Returns the final directory and whether
    anything was sealed (False: already committed, nothing re-saved)."""
    final = root / checkpoint_layout.step_dir_name(step)
    resave = _resave_dir(root, step)
    if resave.is_dir():
        directory = resave
    elif checkpoint_layout.is_committed(final):
        return final, False
    else:
        directory = final
        directory.mkdir(parents=True, exist_ok=True)
    _seal(directory, step, me, hash_files, request=request, tier=tier)
    if directory == resave:
        _replace(final, resave)
    return final, True


def _seal(
    directory: Path,
    step: int,
    me: RankInfo,
    hash_files: bool,
    *,
    request: int | None,
    tier: str | None,
) -> None:
    """Write the manifest and then the marker into ``directory``. ``request`` is the
    just-in-time request this checkpoint answers (recorded in the manifest);
    ``tier`` is recorded for non-disk tiers, whose commits skip the chaos point
    placed on the disk commit."""
    # A marker left by an earlier seal of this directory must not vouch for the new
    # bytes while the new manifest is being written.
    (directory / checkpoint_layout.COMMIT_MARKER).unlink(missing_ok=True)
    files: dict[str, dict[str, Any]] = {}
    directories_to_sync = {directory}
    for file in sorted(directory.rglob("*")):
        name = file.relative_to(directory).as_posix()
        if (
            not file.is_file()
            or name in (checkpoint_layout.MANIFEST, checkpoint_layout.COMMIT_MARKER)
            or name.endswith(TEMP_SUFFIX)
        ):
            continue
        files[name] = _describe_and_sync(file, hash_files)
        directories_to_sync.add(file.parent)
    for synced in sorted(directories_to_sync):
        checkpoint_layout.fsync_directory(synced)
    # The step directory's own entry in the root must survive a crash too.
    checkpoint_layout.fsync_directory(directory.parent)
    manifest = {
        "step": step,
        "world_size": me.world_size,
        "generation": me.generation,
        "job_id": me.job_id,
        "created_at": time.time(),
        "files": files,
    }
    if request is not None:
        manifest["checkpoint_request"] = request
    if tier is not None:
        manifest["tier"] = tier
    _atomic_write(
        directory / checkpoint_layout.MANIFEST,
        json.dumps(manifest, indent=2, sort_keys=True).encode(),
        durable=True,
    )
    if tier is None:
        chaos_points.chaos_point(chaos_points.CHECKPOINT_BEFORE_COMMIT)
    marker = {"step": step, "committed_at": time.time()}
    _atomic_write(
        directory / checkpoint_layout.COMMIT_MARKER,
        json.dumps(marker).encode(),
        durable=True,
    )


def _replace(final: Path, resave: Path) -> None:
    """Put the sealed re-save in place of the committed ``final``. Two renames (POSIX
    has no portable directory swap); a crash between them leaves the step absent,
    never torn, and the older checkpoints still resume. The old copy is deleted
    marker first, like every deletion of a checkpoint."""
    old = final.with_name(f".{final.name}.replaced.{os.getpid()}.{next(_temp_counter)}")
    if final.exists():
        os.rename(final, old)
    os.rename(resave, final)
    checkpoint_layout.fsync_directory(final.parent)
    with contextlib.suppress(OSError):
        (old / checkpoint_layout.COMMIT_MARKER).unlink()
    shutil.rmtree(old, ignore_errors=True)


def _answered(request: int) -> None:
    """A controller's checkpoint request always precedes a planned stop (pause, drain,
    node swap). Holding here, right after the commit, keeps every rank at this step
    (the others wait in their next collective) until the stop arrives, so the stop
    costs zero steps. The hold is bounded: if no stop comes, training goes on."""
    global _unanswered_request, _hold_after_commit
    _unanswered_request = None
    if not _hold_after_commit:
        return
    _hold_after_commit = False
    flush_heartbeat()
    deadline = time.monotonic() + HOLD_AFTER_REQUESTED_CHECKPOINT_S
    while time.monotonic() < deadline:
        time.sleep(0.05)


def _describe_and_sync(file: Path, hash_files: bool) -> dict[str, Any]:
    # Other ranks may have closed these files without fsync; syncing here makes
    # the data durable before the marker that vouches for it.
    digest = hashlib.sha256() if hash_files else None
    with open(file, "rb") as handle:
        if digest is not None:
            while chunk := handle.read(_HASH_CHUNK_BYTES):
                digest.update(chunk)
        os.fsync(handle.fileno())
        size = os.fstat(handle.fileno()).st_size
    return {"size": size, "sha256": digest.hexdigest() if digest is not None else None}


# --------------------------------------------------------------------------- file helpers


def _atomic_write(target: Path, data: bytes, *, durable: bool) -> None:
    """Write ``data`` to ``target`` so readers see the old file or the new one,
    never a mix. ``durable`` also fsyncs the file and its directory, so after a
    machine crash the new file is there and whole."""
    directory = target.parent
    directory.mkdir(parents=True, exist_ok=True)
    temp_name = temp_path_for(target)
    # O_EXCL and a per-process counter: two writers never share a temp file.
    # Mode 0o666 lets the umask decide, unlike mkstemp's private 0o600.
    fd = os.open(temp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        raise
    if durable:
        checkpoint_layout.fsync_directory(directory)


temp_path_for = checkpoint_layout.temp_path_for


_temp_counter = itertools.count()


def _reset_generation() -> None:
    """Forget what belongs to the generation this rank leaves when it rejoins the
    next one in place: the heartbeat file and interval, the control file's signature,
    request and intervals, the resume point, ``first_step``, the save under way, and
    every phase mark but ``torn_down`` (which the new generation's timeline starts
    with). Kept: recent save times (a property of the hardware), the id of the last
    checkpoint request (ids are job-wide), the configured checkpoint directory."""
    global _heartbeat_file, _heartbeat_interval_s, _next_heartbeat_at, _reported_step
    global _reported_metrics, _heartbeat_warned
    global _step_compute_s, _window_compute_s, _window_steps
    global _control_signature, _unanswered_request, _hold_after_commit, _pending_request
    global _control_intervals
    global _first_step_pending, _resume_noted, _resumed_from_step, _resumed_from_dir
    global _save_started, _rejoin_request, _next_rejoin_poll_at
    _heartbeat_file = _UNRESOLVED
    _heartbeat_interval_s = DEFAULT_HEARTBEAT_INTERVAL_S
    _next_heartbeat_at = 0.0
    _reported_step = None
    _reported_metrics = {}
    _heartbeat_warned = False
    _step_compute_s, _window_compute_s, _window_steps = 0.0, 0.0, 0
    _control_signature = None
    _unanswered_request = None
    _hold_after_commit = False
    _pending_request = False
    _control_intervals = {}
    _control_warned.clear()
    _first_step_pending = True
    _resume_noted = False
    _resumed_from_step = 0
    _resumed_from_dir = None
    _save_started = None
    _rejoin_request = None
    _next_rejoin_poll_at = 0.0
    torn_down = _phases.get(phases.TORN_DOWN)
    _phases.clear()
    if torn_down is not None:
        _phases[phases.TORN_DOWN] = torn_down


def _reset_state() -> None:
    """Forget cached environment and per-process state (for tests that change
    the environment within one process)."""
    global _last_checkpoint_request, _configured_checkpoint_dir, _save_timing_explicit
    global _rejoin_armed, _rejoined
    _reset_generation()
    _save_times.clear()
    _save_timing_explicit = False
    _last_checkpoint_request = None
    _configured_checkpoint_dir = None
    _phases.clear()
    _rejoin_armed = False
    _rejoined = False
