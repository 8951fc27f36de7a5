"""PyTorch glue for :mod:`lazarus.rank`: whole-state checkpoints in one call.

Kept apart from :mod:`lazarus.rank` so that importing the helper never imports
torch. The checkpoint is one ``state.pt`` written by rank 0, which suits data
parallel jobs where every rank holds the same state; sharded jobs write their
own files into :func:`lazarus.rank.checkpoint_path` and commit the same way.

Usage::

    import lazarus.rank.torch as lazarus_torch

    resumed = lazarus_torch.load()
    if resumed is not None:
        start, state = resumed
        model.load_state_dict(state["model"])
    ...
    state = lambda: {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    if lazarus_torch.should_checkpoint(step, every=100):  # disk: the controller's interval wins
        lazarus_torch.save(step, state())                  # every rank calls it
    else:
        lazarus_torch.snapshot(step, state)                # memory tier, when the launcher set it
    ...
    lazarus_torch.flush_snapshots()                        # before destroy_process_group

(``checkpoint(step, state, every=100)`` does both with one broadcast.) Importing this
module marks ``framework_imported``; :func:`init_process_group` marks
``process_group_ready``; :func:`load` marks ``checkpoint_loaded``.

Rejoin in place (issue 16): a script that runs its loop through
:func:`run_resilient` keeps its process when a peer dies. The helper tears the
process group down, waits for the controller's rejoin request, re-creates the group
for the next generation, reloads the resume point every rank of it shares and calls
``train`` again::

    def setup() -> dict[str, Any]:                 # once per process
        model = build_model()
        return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}

    def train(start_step: int, state: dict[str, Any]) -> None:   # once per generation
        model = DistributedDataParallel(state["model"])  # wrap again: DDP binds to the group
        for step in range(start_step, total_steps):
            ...                                    # forward, backward, optimizer step
            lazarus.rank.heartbeat(step + 1)
            states = lambda: {name: obj.state_dict() for name, obj in state.items()}
            lazarus_torch.checkpoint(step + 1, states)

    lazarus_torch.run_resilient(train, setup, timeout=timedelta(seconds=60))

See :func:`run_resilient` for what counts as a peer's failure, the teardown, and
the collective timeout to pass on gloo.

Memory snapshots, and why a committed one is consistent: every rank holds the same
state in data parallel training, so each node's local rank 0 alone copies it into
CPU memory (tensors cloned, so later steps cannot change the copy) and returns;
a background thread writes the copy to the node's tmpfs, joins a barrier of every
rank's snapshot thread (on a gloo group of its own, so it never interleaves with
the training's collectives), and only then commits. A marker for step k on any
node therefore means every node's copy of step k was whole in tmpfs first; a node
that dies between the barrier and its commit still holds step k-1 committed,
because a snapshot starts only after the previous one's thread finished. With
replicas on (``checkpoints.memory_replicas``), the same thread then pushes the
committed step to the node's buddy, whose writer runs the receiver
(:mod:`lazarus.rank.replica`, standard library only).
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, NoReturn

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from lazarus.domain import environment, phases
from lazarus.rank import (
    checkpoints,
    control,
    flight_recorder,
    heartbeats,
    identity,
    marks,
    memory,
    nccl_teardown,
    rejoin,
    rejoin_requests,
    replica,
    resume,
    slow_phases,
    step_interrupt,
    transfer,
)
from lazarus.rank.host_copy import copy_to_cpu as _copy_to_cpu
from lazarus.rank.state_file import save_checkpoint_file, save_snapshot_file
from lazarus.rank.train_state import InitialState, TrainState, load_into

STATE_FILE = "state.pt"

__all__ = [
    "STATE_FILE",
    "checkpoint",
    "flush_snapshots",
    "init_process_group",
    "is_peer_failure",
    "load",
    "run_resilient",
    "save",
    "should_checkpoint",
    "snapshot",
]

State = Mapping[str, Any] | Callable[[], Mapping[str, Any]]
"""A state dict, or a function building one (called only when a save is due)."""

marks.mark(phases.FRAMEWORK_IMPORTED)


def init_process_group(*args: Any, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group``, marking ``process_group_ready``
    when it returns (scripts that create the group themselves call
    ``lazarus.rank.mark("process_group_ready")``)."""
    flight_recorder.configure()  # the collectives' recorder, read as the group is made
    dist.init_process_group(*args, **kwargs)
    _ensure_snapshot_group()
    flight_recorder.start_watch()  # answers a hang's request for the recorder's dump
    marks.mark(phases.PROCESS_GROUP_READY)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _global_rank() -> int:
    # The process group is the truth once it exists; the environment is all there
    # is before (or without) it.
    return dist.get_rank() if _distributed() else identity.info().rank


def save(step: int, state: Mapping[str, Any]) -> Path | None:
    """Checkpoint ``state`` as completed step ``step``. Every rank must call it
    (it contains a barrier); rank 0 writes and commits and gets the directory
    back, other ranks get None.

    The barrier sits between the write and the commit so the marker can only
    appear once every rank has reached the same step, which is what makes a
    committed checkpoint a consistent resume point. A slow save counts against
    the process group's timeout, so give ``init_process_group`` room for it."""
    if identity.checkpoint_dir() is None:
        # Raise on every rank alike, before any collective, rather than leaving
        # the other ranks waiting in the barrier for a rank 0 that failed.
        raise RuntimeError(
            f"no checkpoint directory: set {environment.CHECKPOINT_DIR} or call "
            "lazarus.rank.configure(checkpoint_dir=...)"
        )
    is_writer = _global_rank() == 0
    # Every rank: the others wait in the barrier for rank 0's write, and that wait is
    # the save's, not a hang (the supervisor gives the phase its own budget).
    with slow_phases.slow_phase(phases.CHECKPOINT_SAVE):
        if is_writer:
            save_checkpoint_file(state, checkpoints.checkpoint_path(step) / STATE_FILE)
        if _distributed():
            dist.barrier()
        if is_writer:
            return checkpoints.commit_checkpoint(step)
        return None


def load(
    map_location: str | torch.device | None = "cpu", *, weights_only: bool = True
) -> tuple[int, dict[str, Any]] | None:
    """The ``(step, state)`` saved by :func:`save` or :func:`snapshot` at the resume
    point chosen by :func:`lazarus.rank.resume_point`, or None to start fresh; marks
    ``checkpoint_loaded`` either way.

    Outside Lazarus, with a process group of several ranks already initialised, the
    fallback choice is agreed among ranks (the newest step every rank has: nodes'
    memory tiers may differ by one snapshot), so it is then a collective. Under
    Lazarus the controller's ``LAZARUS_RESUME_FROM`` is used as is.

    ``weights_only`` stays on by default: model and optimizer state dicts need
    nothing more, and it refuses to run code hidden in a checkpoint file."""
    several = _distributed() and dist.get_world_size() > 1
    point = resume.resume_point(agree=_newest_common_step if several else None)
    if point is None:
        marks.mark(phases.CHECKPOINT_LOADED)
        return None
    step, directory = point
    # A memory snapshot is mapped, not read: its pages are in RAM already (tmpfs), so
    # the tensors' bytes are copied once, into the model, instead of twice (measured
    # at 1 GiB on the loaded test machine: 0.9 s against 4.6 s to the state in place).
    # Copy-on-write: nothing written to a tensor reaches the file. Disk checkpoints are
    # read as before (a network filesystem's file is not mapped).
    state = torch.load(
        directory / STATE_FILE,
        map_location=map_location,
        weights_only=weights_only,
        mmap=_in_memory_tier(directory),
    )
    if not isinstance(state, dict):
        raise TypeError(f"{directory / STATE_FILE} holds a {type(state).__name__}, not a dict")
    marks.mark(phases.CHECKPOINT_LOADED)
    return step, state


def _in_memory_tier(directory: Path) -> bool:
    snapshots = memory.directory()
    return snapshots is not None and directory.resolve().is_relative_to(snapshots.resolve())


def _newest_common_step(steps: list[int]) -> int | None:
    """The newest step in every rank's ``steps`` (a collective), or None."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, sorted(set(steps)))
    common = set.intersection(*(set(found) for found in gathered))
    return max(common) if common else None


def should_checkpoint(step: int | None = None, *, every: int | None = None) -> bool:
    """:func:`lazarus.rank.should_checkpoint` (a controller request, or given
    ``step``, the disk interval: the controller's, else ``every``), decided by rank
    0 and broadcast, so every rank answers the same at the same step (ranks reading
    the control file themselves would notice a request or a new interval at
    different steps and deadlock in the checkpoint's barrier). Every rank must call
    it at the same point: it is a collective, costing one tiny broadcast."""
    if not _distributed() or dist.get_world_size() == 1:
        return control.should_checkpoint(step, every=every)
    wanted = dist.get_rank() == 0 and control.should_checkpoint(step, every=every)
    return _broadcast_from_rank0([wanted])[0]


def snapshot(step: int, state: State) -> bool:
    """Snapshot ``state`` as completed step ``step`` into the memory tier when it is
    on (``LAZARUS_MEMORY_CHECKPOINT_DIR``) and the memory interval says so; True if
    a snapshot was started. Every rank calls it at the same point (one tiny
    collective, skipped entirely when the tier is off). The training thread pays one
    host copy of the state; the write, the commit and the push run in the background
    (see the module docstring). A snapshot due while the previous one is still being
    written on any rank is skipped and counted (:data:`snapshots_skipped`), never
    queued: memory stays at one copy in flight, and the step never waits."""
    if memory.directory() is None:
        return False
    _, due, busy = _agree(memory_due=_global_rank() == 0 and memory.due(step))
    if due and busy:
        _skip(step)
        return False
    if due:
        _start_snapshot(step, state)
    return due


def checkpoint(
    step: int, state: State, *, every: int | None = None
) -> Literal["disk", "memory"] | None:
    """:func:`should_checkpoint` then :func:`save`, or else :func:`snapshot`, with one
    collective instead of two: which tier ``step`` went to, or None. A step saved to
    disk is not snapshotted too; the disk copy serves as that step's resume point."""
    rank0 = _global_rank() == 0
    disk, due, busy = _agree(
        disk_due=rank0 and control.should_checkpoint(step, every=every),
        memory_due=rank0 and memory.due(step),
    )
    if disk:
        save(step, _resolve(state))
        return "disk"
    if due and busy:
        _skip(step)
        return None
    if due:
        _start_snapshot(step, state)
        return "memory"
    return None


snapshots_skipped = 0
"""Snapshots skipped because the previous one was still being written (this rank)."""
last_snapshot_copy_s = 0.0
"""The training thread's host copy of the state at the last snapshot, in seconds: the
part of a snapshot's stall that scales with the state (benchmarks read it)."""


def _agree(*, disk_due: bool = False, memory_due: bool = False) -> tuple[bool, bool, bool]:
    """(disk due, memory due, a snapshot still in flight on any rank): rank 0's
    decisions and every rank's busy flag in one all-reduce (max), so every rank
    answers the same at the same step and none joins a barrier the others skip."""
    busy = _snapshot_thread is not None and _snapshot_thread.is_alive()
    flags = [disk_due, memory_due, busy]
    if _distributed() and dist.get_world_size() > 1:
        flags = _max_over_ranks(flags)
    return flags[0], flags[1], flags[2]


def _skip(step: int) -> None:
    global snapshots_skipped
    snapshots_skipped += 1
    if snapshots_skipped == 1 or snapshots_skipped % 100 == 0:
        print(
            f"lazarus.rank: memory snapshot of step {step} skipped: the previous one is still "
            f"being written ({snapshots_skipped} skipped so far; a longer memory interval "
            "would fit the write)",
            file=sys.stderr,
        )


def flush_snapshots() -> None:
    """Wait until the snapshot in flight (if any) is written and committed. Call it
    before ``destroy_process_group``: the snapshot thread may be in its barrier."""
    global _snapshot_thread
    thread = _snapshot_thread
    if thread is not None:
        thread.join()
        _snapshot_thread = None


SNAPSHOT_EXIT_WAIT_S = 10.0
"""How long a rank that is exiting waits for the snapshot in flight. A daemon thread
still inside ``torch.save`` when the interpreter finalizes aborts the process: a rank
that raised would die of SIGABRT (-6) instead of exiting 1 with its own traceback,
and the classifier would read the wrong exit. Writing a snapshot to tmpfs takes well
under a second; a thread still alive after the bound is stuck in its barrier with a
dead peer, and that rank's exit is collateral anyway."""


def _finish_snapshot_at_exit() -> None:
    """At interpreter exit, clean or by an uncaught exception: let the snapshot in
    flight finish, bounded by :data:`SNAPSHOT_EXIT_WAIT_S`, so the rank exits with its
    own code. Registered after torch's own exit handlers, so it runs before them."""
    thread = _snapshot_thread
    if thread is not None and thread.is_alive():
        thread.join(SNAPSHOT_EXIT_WAIT_S)


atexit.register(_finish_snapshot_at_exit)

_snapshot_thread: threading.Thread | None = None
_snapshot_group: Any = None
"""The gloo group only snapshot threads' barriers use (created on first use)."""
_last_copy: Any = None
"""The previous snapshot's CPU copy, whose tensors the next copy reuses."""


def _start_snapshot(step: int, state: State) -> None:
    global _snapshot_thread, _last_copy, last_snapshot_copy_s
    flush_snapshots()  # finished already (the caller agreed none is busy): joins at once
    # Created here only for scripts that made the process group themselves: every
    # rank reaches its first snapshot at the same step (the decision was broadcast),
    # so this collective call lines up.
    group = _ensure_snapshot_group()
    started = time.perf_counter()
    copied = _copy_to_cpu(_resolve(state), _last_copy) if memory.is_writer() else None
    _last_copy = copied
    last_snapshot_copy_s = time.perf_counter() - started
    if copied is not None:
        # Before this rank joins the barrier, so before any predecessor can push.
        replica.ensure_receiver()
    _snapshot_thread = threading.Thread(
        target=_write_snapshot,
        args=(step, copied, group),
        name=f"lazarus-snapshot-{step}",
        daemon=True,
    )
    _snapshot_thread.start()


def _ensure_snapshot_group() -> Any:
    """The gloo group the snapshot threads' barriers use, created on first call when
    the memory tier is on and the job has more than one rank (else None).

    :func:`init_process_group` creates it at once, beside the default group, not at
    the first snapshot in the middle of training: a peer that dies while gloo
    connects a new group's mesh can hold the survivor in that connect for five times
    the group's timeout (measured with torch 2.13: 20 s at a 4 s timeout, 40 s at
    8 s), where a collective on a group that exists fails within milliseconds. The
    timeout is the default group's: new_group's own default is gloo's 30 minutes."""
    global _snapshot_group
    wanted = memory.directory() is not None and _distributed() and dist.get_world_size() > 1
    if _snapshot_group is None and wanted:
        _snapshot_group = dist.new_group(backend="gloo", timeout=_default_group_timeout())
    return _snapshot_group


def _default_group_timeout() -> timedelta | None:
    """The timeout the script gave its default process group (None when torch keeps
    it where this cannot read it: torch's default then applies)."""
    device = torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
    try:
        timeout = c10d._get_default_group()._get_backend(device).options._timeout
    except (AttributeError, RuntimeError):
        return None
    return timeout if isinstance(timeout, timedelta) else None


def _write_snapshot(step: int, state: Mapping[str, Any] | None, group: Any) -> None:
    """Background: write this node's copy, wait for every node's, then commit. A
    failure is reported and the snapshot skipped: the disk tier still serves."""
    written: str | None = None  # the state file's transfer digest, once written
    if state is not None:
        try:
            written = save_snapshot_file(state, memory.write_dir(step) / STATE_FILE)
        except Exception as exc:  # a snapshot must never kill training
            print(
                f"lazarus.rank: memory snapshot of step {step} not written: {exc}", file=sys.stderr
            )
    try:
        if group is not None:
            dist.barrier(group=group)  # every node's copy is in tmpfs before any commit
        if written:
            final = memory.commit(step)
            # To the buddy, when replicas are on: by sendfile, under the digest above.
            if replica.push_committed(final, {STATE_FILE: written}):
                # This thread waits for the buddy's answer (the training thread does
                # not: the next snapshot is skipped meanwhile), so every node pushes
                # the same steps, and the newest ``memory_keep`` a survivor keeps
                # always include the step a lost node's buddy holds.
                size = (final / STATE_FILE).stat().st_size
                replica.wait_for_pushes(transfer.deadline_for(size))
    except Exception as exc:
        print(f"lazarus.rank: memory snapshot of step {step} not committed: {exc}", file=sys.stderr)


def _resolve(state: State) -> Mapping[str, Any]:
    return state() if callable(state) else state


def _collective_device() -> Any:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _flags_tensor(flags: list[bool]) -> Any:
    values = [1 if flag else 0 for flag in flags]
    return torch.tensor(values, dtype=torch.uint8, device=_collective_device())


def _broadcast_from_rank0(flags: list[bool]) -> list[bool]:
    tensor = _flags_tensor(flags)
    dist.broadcast(tensor, src=0)
    return [bool(value) for value in tensor.tolist()]


def _max_over_ranks(flags: list[bool]) -> list[bool]:
    tensor = _flags_tensor(flags)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [bool(value) for value in tensor.tolist()]


# --------------------------------------------------------------------------- rejoin in place


TEARDOWN_TIMEOUT_S = 30.0
"""How long the process group's teardown may take before the rank gives up on
rejoining and exits (:data:`lazarus.rank.REJOIN_TIMEOUT_EXIT_CODE`). gloo's took 10 to
20 ms in every case measured, even with a thread still blocked in a collective of a
group being destroyed; a teardown that blocks is one the whole-generation restart
must clean up."""

_PEER_FAILURE = re.compile(
    "|".join(
        (
            r"Connection closed by peer",  # gloo: a peer process died (its sockets closed)
            r"Connection reset by peer",
            r"Broken pipe",
            r"Connection refused",  # a rendezvous or store whose host died
            r"Timed out waiting \d+\s*ms for (?:send|recv) operation",  # gloo: a frozen peer
            r"Socket Timeout",  # the TCPStore
            r"NCCL (?:error|communicator was aborted)",
            r"nccl(?:RemoteError|SystemError|InternalError)",
            r"remote process exited or there was a network error",  # NCCL >= 2.13
            r"Watchdog caught collective operation timeout",
        )
    )
)
"""Messages of a ``RuntimeError`` that mean a peer (or the link to it) failed."""


def is_peer_failure(error: BaseException) -> bool:
    """Whether ``error`` means the process group failed because of a peer, not this
    rank's own code: :class:`lazarus.rank.RejoinRequested`, any
    ``torch.distributed.DistError`` (``DistBackendError``, ``DistNetworkError``,
    ``DistStoreError``), or a ``RuntimeError`` whose message says a connection closed,
    reset or timed out (what gloo raises, measured with torch 2.13: a SIGKILLed peer
    gives ``Connection closed by peer`` or ``Read error ...: Connection reset by peer``
    within milliseconds, in DDP's backward, in a comm hook's future, in a barrier, and
    in a thread's collective on another group; a SIGSTOPped peer gives ``Timed out
    waiting <timeout> ms for recv operation`` (or ``send``) once the group's timeout
    expires) or an NCCL error. Its causes and
    contexts count too, so a cleanup error raised while handling a peer's failure is
    that failure. So is every error once :func:`_watch_for_rejoin` aborted the
    generation's communicators: the main thread may then fail anywhere in torch.
    Anything else (a NaN, a bug, a missing file) is not."""
    if _watch_aborted.is_set():
        return True  # the watch aborted the group under this rank: whatever broke, broke of that
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(
            current,
            rejoin_requests.RejoinRequested | rejoin_requests.GenerationFailed | dist.DistError,
        ):
            return True
        if isinstance(current, RuntimeError) and _PEER_FAILURE.search(str(current)):
            return True
        pending.extend((current.__cause__, current.__context__))
    return False


def run_resilient(
    train: Callable[[int, TrainState], object],
    setup: Callable[[], TrainState],
    *,
    backend: str | None = None,
    timeout: timedelta | None = None,
    interrupt: bool = True,
) -> TrainState:
    """Run a training loop that survives its peers' failures in its own process.

    ``setup()`` runs once per process, before any process group exists, and returns
    the training state: named stateful objects (``{"model": model, "optimizer":
    optimizer}``) with the names the checkpoints use (:func:`save` of ``{name:
    obj.state_dict()}``), each restored whole by ``load_state_dict``. Then, once per
    generation: the default process group is created (``env://``; ``backend``: nccl
    when CUDA is available, else gloo; ``timeout`` as given), the resume point is
    loaded into the state (:func:`load`; with none, the state ``setup`` built), and
    ``train(start_step, state)`` runs. ``train`` wraps the model in DDP itself, every
    time: DDP binds to the process group it was built under, and its comm hook must be
    registered again (a comm hook must read its collective's result, so that a peer's
    failure reaches ``backward``). A process group the script created before the call
    is used for the first generation as it is. When ``train`` returns, the heartbeat and
    snapshots are flushed, the process group destroyed and the state returned.

    Without ``LAZARUS_REJOIN_TIMEOUT_S`` (a job without ``rejoin``, or outside
    Lazarus) that happens once and every exception propagates: the whole generation
    restarts, as for any script. With it, a peer's failure (:func:`is_peer_failure`,
    raised from the group's creation, the load or ``train``) makes the rank rejoin:

    1. the memory snapshot in flight is abandoned (its thread may sit in a barrier of
       the dead group; it never commits a step not every rank wrote);
    2. the process group is destroyed (NCCL: its communicators aborted first), in a
       thread given :data:`TEARDOWN_TIMEOUT_S`; ``torn_down`` is marked;
    3. the rank writes a ``"rejoin": "waiting"`` heartbeat and reads its control file
       until a rejoin request names it, for ``LAZARUS_REJOIN_TIMEOUT_S`` at most;
    4. it applies the request's variables (new rank, port, generation, heartbeat and
       control files, resume point), marks ``rejoin_received`` and goes round again,
       printing ``lazarus.rank: rank R rejoined generation G at step S (torn down in
       T s, waited W s)`` once the resume point is loaded.

    A survivor busy in its own work (not in a collective) is cut short as soon as the
    controller's request names it (:mod:`lazarus.rank.step_interrupt`, not on NCCL);
    ``interrupt=False`` leaves it to its next heartbeat or collective instead.

    Any other exception propagates, so the rank crashes and the controller classifies
    it. A rank that gets no request in time, or whose group will not tear down,
    prints why on one line of stderr and exits with
    :data:`lazarus.rank.REJOIN_TIMEOUT_EXIT_CODE`: the controller then replaces it.

    The state ``setup`` built is copied to CPU memory once, when the process's first
    generation starts afresh (no checkpoint yet), so a later generation that starts
    afresh too restarts from it as a fresh process would (:class:`InitialState`).

    **Timeouts.** gloo has no abort: a collective whose peer is frozen (SIGSTOP) or
    gone without closing its sockets (a node powered off, a partition) returns only
    when the group's ``timeout`` expires (measured: with ``timeout`` 5 s, the peer of a
    SIGSTOPped rank raised 5.0 s later and waited to rejoin 0.4 s after that); a peer
    that died is seen within milliseconds whatever the timeout. Pass a ``timeout``
    shorter than the job's ``rejoin.timeout_s`` (60 s by default) by the few seconds a
    group takes to form, so a survivor stuck in such a collective is out of it, and
    listening for the request, before the controller's deadline for survivors; and
    longer than the slowest legitimate wait in a collective (a disk checkpoint's
    barrier waits for rank 0's write). torch's default, 30 minutes, leaves such a rank
    stuck until the deadline passes and the controller restarts the whole generation.
    Either way the rank never outlives the controller's stop: SIGTERM ends it inside a
    collective and while it waits (measured: 0.08 s). On NCCL (not measured here), set
    ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` (abort the communicators and raise, keeping
    the process) or 0: with the default, 3, the watchdog ends the process on an error,
    which still recovers, as a whole-generation restart."""
    rejoin_timeout_s = _rejoin_timeout_s()
    state = setup()
    if rejoin_timeout_s is None:
        train(_start_generation(state, None, backend, timeout), state)
        slow_phases.enter_slow_phase(phases.FINISHING)  # teardown and exit: not a hang
        _finish()
        return state
    initial = InitialState()
    step_interrupt.install()
    rejoin._arm_rejoin(True)
    try:
        rejoined: tuple[float, float] | None = None
        while True:
            try:
                start_step = _start_generation(state, initial, backend, timeout)
                if rejoined is not None:
                    _collected()
                    _report_rejoin(start_step, *rejoined)
                with step_interrupt.armed(interrupt and dist.get_backend() != "nccl"):
                    train(start_step, state)
                break
            except Exception as error:
                if not is_peer_failure(error):
                    raise
                reason = _one_line(error)
            rejoined = _rejoin(reason, rejoin_timeout_s)
    finally:
        rejoin._arm_rejoin(False)
    slow_phases.enter_slow_phase(phases.FINISHING)  # teardown and exit: not a hang
    _finish()
    return state


def _rejoin_timeout_s() -> float | None:
    raw = os.environ.get(environment.REJOIN_TIMEOUT_S, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:  # also NaN
        raise ValueError(
            f"environment variable {environment.REJOIN_TIMEOUT_S}={raw!r} is not a number > 0"
        )
    return value


def _start_generation(
    state: TrainState,
    initial: InitialState | None,
    backend: str | None,
    timeout: timedelta | None,
) -> int:
    """Create the process group, load the resume point into ``state`` (or, with none
    and ``initial`` given, setup's state), and return the step to start from."""
    if not _distributed():
        chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        options: dict[str, Any] = {"backend": chosen, "init_method": "env://"}
        if timeout is not None:
            options["timeout"] = timeout
        nccl_teardown.prefer_nccl_cleanup_only(chosen)
        init_process_group(**options)
    _start_rejoin_watch()
    resumed = load()
    if resumed is None:
        if initial is not None and initial.generations:
            initial.restore_into(state)
        if initial is not None:
            initial.after_load(state, resumed=False)
        return 0
    step, saved = resumed
    load_into(state, saved, f"the checkpoint of step {step}")
    if initial is not None:
        initial.after_load(state, resumed=True)
    return step


def _finish() -> None:
    _stop_rejoin_watch()
    heartbeats.flush_heartbeat()  # the last step and phase marks, whatever train did
    flush_snapshots()
    if _distributed():
        dist.destroy_process_group()


def _rejoin(reason: str, timeout_s: float) -> tuple[float, float]:
    """Tear down, wait for the request and act for its generation; returns the
    teardown's and the wait's seconds. Exits the process when either fails."""
    me = identity.info()
    print(
        f"lazarus.rank: rank {me.rank} leaves generation {me.generation} ({reason}); "
        "tearing down to rejoin",
        file=sys.stderr,
        flush=True,
    )
    started = time.monotonic()
    _tear_down()
    torn_down_s = time.monotonic() - started
    started = time.monotonic()
    request = rejoin._await_rejoin(timeout_s)
    waited_s = time.monotonic() - started
    if request is None:
        _give_up(
            f"rank {me.rank} of generation {me.generation} got no rejoin request within "
            f"{timeout_s:g} s ({environment.REJOIN_TIMEOUT_S}); exiting so the controller "
            "replaces it"
        )
    rejoin._enter_generation(request)
    return torn_down_s, waited_s


def _tear_down() -> None:
    """Abandon the snapshot in flight and destroy every process group, bounded by
    :data:`TEARDOWN_TIMEOUT_S`; collect the garbage; mark ``torn_down``."""
    global _snapshot_thread, _snapshot_group, _last_copy
    # Not joined: its barrier may wait for a dead peer until the group's timeout. It
    # keeps its own references; the next snapshot copies into fresh buffers and
    # creates its group anew.
    _snapshot_thread, _snapshot_group, _last_copy = None, None, None
    _stop_rejoin_watch()
    if _distributed():
        leave = nccl_teardown.teardown_call(dist.get_backend(), c10d)
        finished = threading.Event()
        failures: list[BaseException] = []

        def destroy() -> None:
            try:
                with _abort_lock:  # after the watch's abort, if it began one: never two at once
                    if _distributed():  # the watch's abort leaves nothing to leave
                        leave()
            except BaseException as error:
                failures.append(error)
            finally:
                finished.set()

        threading.Thread(target=destroy, name="lazarus-teardown", daemon=True).start()
        if not finished.wait(TEARDOWN_TIMEOUT_S):
            # Where it stuck (every thread's Python stack), for the incident's log.
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            _give_up(
                f"the process group did not tear down within {TEARDOWN_TIMEOUT_S:g} s; "
                "exiting so the controller restarts the generation"
            )
        if failures and _distributed():
            _give_up(f"the process group could not be torn down ({_one_line(failures[0])})")
    # The failed generation's DDP lived in the frames of the traceback just dropped:
    # it must be collected before the next DDP registers its hooks. A full collection
    # takes 0.2 s with torch loaded, so it runs while the rank waits for its request and
    # forms the next group; the next train() waits for it (_collected).
    global _collector
    _collected()  # a rejoin that failed before its train(): its collection first
    _collector = threading.Thread(target=gc.collect, name="lazarus-collect", daemon=True)
    _collector.start()
    _watch_aborted.clear()
    rejoin._mark_torn_down()


_watch_stop: threading.Event | None = None
_watch_aborted = threading.Event()
"""Set once the watch aborted this generation's communicators (cleared at teardown)."""
_abort_lock = threading.Lock()
"""Held by whoever aborts or destroys the groups, the watch or the teardown: two
aborts of one communicator from two threads can deadlock inside NCCL (seen on an
H200: the teardown then timed out and the whole generation restarted)."""


def _start_rejoin_watch() -> None:
    """On NCCL, under rejoin: abort the generation's communicators as soon as the
    controller asks this rank to rejoin (:func:`_watch_for_rejoin`). Not on gloo: a
    dead peer's closed sockets already fail gloo's collectives within milliseconds,
    and gloo has no abort for a frozen one."""
    global _watch_stop
    _stop_rejoin_watch()
    if not rejoin_requests._rejoin_armed:
        return
    if not _distributed() or dist.get_backend() != "nccl":
        return
    stop = threading.Event()
    _watch_stop = stop
    threading.Thread(
        target=_watch_for_rejoin, args=(stop,), name="lazarus-rejoin-watch", daemon=True
    ).start()


def _stop_rejoin_watch() -> None:
    global _watch_stop
    if _watch_stop is not None:
        _watch_stop.set()
        _watch_stop = None


def _watch_for_rejoin(stop: threading.Event) -> None:
    """Poll the control file (every
    :data:`lazarus.rank.rejoin_requests.REJOIN_POLL_INTERVAL_S`); when it asks this rank
    to rejoin, abort the process groups as the teardown would.

    Why a thread: NCCL, unlike gloo, does not fail a collective when a peer's process
    dies; the survivor's kernel waits for the group's timeout, and the main thread,
    blocked on the GPU (``loss.item()``, a barrier), never reaches :func:`heartbeat`,
    where :class:`lazarus.rank.RejoinRequested` is raised. Seen on an H200 before this
    watch: the survivor sat 60 s in the collective until NCCL's watchdog fired, past
    the controller's rejoin deadline, and the whole generation restarted. The abort
    ends the pending kernels; the main thread's wait returns or raises (every error
    from then on counts as the peer's: :func:`is_peer_failure`), and its next
    heartbeat or collective leaves the generation through the usual rejoin."""
    while not stop.wait(rejoin_requests.REJOIN_POLL_INTERVAL_S):
        request = control.rejoin_request_now()
        if request is None or stop.is_set():
            continue
        me = identity.info()
        print(
            f"lazarus.rank: rank {me.rank} is asked to rejoin generation "
            f"{request.generation}; aborting generation {me.generation}'s NCCL "
            "communicators (a collective may be waiting on the dead peer)",
            file=sys.stderr,
            flush=True,
        )
        _watch_aborted.set()
        started = time.monotonic()
        try:
            with _abort_lock:
                if _distributed():
                    nccl_teardown.teardown_call("nccl", c10d)()
        except Exception as error:  # the main thread's teardown reports what remains
            print(f"lazarus.rank: abort failed: {_one_line(error)}", file=sys.stderr)
            return
        print(
            f"lazarus.rank: communicators aborted in {time.monotonic() - started:.2f} s",
            file=sys.stderr,
            flush=True,
        )
        return


_collector: threading.Thread | None = None
"""The teardown's garbage collection, running while the rank rejoins."""


def _collected() -> None:
    """Wait for the teardown's collection: the dropped DDP's hooks are gone after it."""
    global _collector
    if _collector is not None:
        _collector.join()
        _collector = None


def _report_rejoin(start_step: int, torn_down_s: float, waited_s: float) -> None:
    me = identity.info()
    print(
        f"lazarus.rank: rank {me.rank} rejoined generation {me.generation} at step "
        f"{start_step} (torn down in {torn_down_s:.2f} s, waited {waited_s:.2f} s)",
        file=sys.stderr,
        flush=True,
    )


def _give_up(why: str) -> NoReturn:
    """Exit at once with :data:`lazarus.rank.REJOIN_TIMEOUT_EXIT_CODE`: no atexit
    handlers and no interpreter teardown, which could block on threads still inside
    a dead group's collectives."""
    print(f"lazarus.rank: {why}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(rejoin.REJOIN_TIMEOUT_EXIT_CODE)


def _one_line(error: BaseException) -> str:
    """``Type: first line of the message``, shortened: for one-line log messages."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."
