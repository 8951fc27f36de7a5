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

Memory snapshots, and why a committed one is consistent: every rank holds the same
state in data parallel training, so each node's local rank 0 alone copies it into
CPU memory (tensors cloned, so later steps cannot change the copy) and returns;
a background thread writes the copy to the node's tmpfs, joins a barrier of every
rank's snapshot thread (on a gloo group of its own, so it never interleaves with
the training's collectives), and only then commits. A marker for step k on any
node therefore means every node's copy of step k was whole in tmpfs first; a node
that dies between the barrier and its commit still holds step k-1 committed,
because a snapshot starts only after the previous one's thread finished.
"""

from __future__ import annotations

import copy
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

import lazarus.rank as lazarus_rank
from lazarus.domain import environment, phases
from lazarus.rank import memory

STATE_FILE = "state.pt"

__all__ = [
    "STATE_FILE",
    "checkpoint",
    "flush_snapshots",
    "init_process_group",
    "load",
    "save",
    "should_checkpoint",
    "snapshot",
]

State = Mapping[str, Any] | Callable[[], Mapping[str, Any]]
"""A state dict, or a function building one (called only when a save is due)."""

lazarus_rank.mark(phases.FRAMEWORK_IMPORTED)


def init_process_group(*args: Any, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group``, marking ``process_group_ready``
    when it returns (scripts that create the group themselves call
    ``lazarus.rank.mark("process_group_ready")``)."""
    dist.init_process_group(*args, **kwargs)
    lazarus_rank.mark(phases.PROCESS_GROUP_READY)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _global_rank() -> int:
    # The process group is the truth once it exists; the environment is all there
    # is before (or without) it.
    return dist.get_rank() if _distributed() else lazarus_rank.info().rank


def save(step: int, state: Mapping[str, Any]) -> Path | None:
    """Checkpoint ``state`` as completed step ``step``. Every rank must call it
    (it contains a barrier); rank 0 writes and commits and gets the directory
    back, other ranks get None.

    The barrier sits between the write and the commit so the marker can only
    appear once every rank has reached the same step, which is what makes a
    committed checkpoint a consistent resume point. A slow save counts against
    the process group's timeout, so give ``init_process_group`` room for it."""
    if lazarus_rank.checkpoint_dir() is None:
        # Raise on every rank alike, before any collective, rather than leaving
        # the other ranks waiting in the barrier for a rank 0 that failed.
        raise RuntimeError(
            f"no checkpoint directory: set {environment.CHECKPOINT_DIR} or call "
            "lazarus.rank.configure(checkpoint_dir=...)"
        )
    is_writer = _global_rank() == 0
    if is_writer:
        _save_state_file(state, lazarus_rank.checkpoint_path(step) / STATE_FILE)
    if _distributed():
        dist.barrier()
    if is_writer:
        return lazarus_rank.commit_checkpoint(step)
    return None


def _save_state_file(state: Mapping[str, Any], target: Path) -> None:
    temp = lazarus_rank.temp_path_for(target)
    try:
        torch.save(dict(state), temp)
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


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
    point = lazarus_rank.resume_point(agree=_newest_common_step if several else None)
    if point is None:
        lazarus_rank.mark(phases.CHECKPOINT_LOADED)
        return None
    step, directory = point
    state = torch.load(directory / STATE_FILE, map_location=map_location, weights_only=weights_only)
    if not isinstance(state, dict):
        raise TypeError(f"{directory / STATE_FILE} holds a {type(state).__name__}, not a dict")
    lazarus_rank.mark(phases.CHECKPOINT_LOADED)
    return step, state


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
        return lazarus_rank.should_checkpoint(step, every=every)
    wanted = dist.get_rank() == 0 and lazarus_rank.should_checkpoint(step, every=every)
    return _broadcast_from_rank0([wanted])[0]


def snapshot(step: int, state: State) -> bool:
    """Snapshot ``state`` as completed step ``step`` into the memory tier when it is
    on (``LAZARUS_MEMORY_CHECKPOINT_DIR``) and the memory interval says so; True if
    a snapshot was started. Every rank calls it at the same point (a broadcast,
    skipped entirely when the tier is off). The write and commit run in the
    background (see the module docstring); the next snapshot waits for them."""
    if memory.directory() is None:
        return False
    wanted = _global_rank() == 0 and memory.due(step)
    if _distributed() and dist.get_world_size() > 1:
        wanted = _broadcast_from_rank0([wanted])[0]
    if wanted:
        _start_snapshot(step, state)
    return wanted


def checkpoint(
    step: int, state: State, *, every: int | None = None
) -> Literal["disk", "memory"] | None:
    """:func:`should_checkpoint` then :func:`save`, or else :func:`snapshot`, with one
    broadcast instead of two: which tier ``step`` went to, or None. A step saved to
    disk is not snapshotted too; the disk copy serves as that step's resume point."""
    if _global_rank() == 0:
        flags = [lazarus_rank.should_checkpoint(step, every=every), memory.due(step)]
    else:
        flags = [False, False]
    if _distributed() and dist.get_world_size() > 1:
        flags = _broadcast_from_rank0(flags)
    if flags[0]:
        save(step, _resolve(state))
        return "disk"
    if flags[1]:
        _start_snapshot(step, state)
        return "memory"
    return None


def flush_snapshots() -> None:
    """Wait until the snapshot in flight (if any) is written and committed. Call it
    before ``destroy_process_group``: the snapshot thread may be in its barrier."""
    global _snapshot_thread
    thread = _snapshot_thread
    if thread is not None:
        thread.join()
        _snapshot_thread = None


_snapshot_thread: threading.Thread | None = None
_snapshot_group: Any = None
"""The gloo group only snapshot threads' barriers use (created on first use)."""
_last_copy: Any = None
"""The previous snapshot's CPU copy, whose tensors the next copy reuses."""


def _start_snapshot(step: int, state: State) -> None:
    global _snapshot_thread, _snapshot_group, _last_copy
    flush_snapshots()  # one write at a time: bounded RAM, commits in step order, buffers free
    group = None
    if _distributed() and dist.get_world_size() > 1:
        if _snapshot_group is None:
            # Every rank reaches its first snapshot at the same step (the decision
            # was broadcast), so this collective call lines up.
            _snapshot_group = dist.new_group(backend="gloo")
        group = _snapshot_group
    copied = _copy_to_cpu(_resolve(state), _last_copy) if memory.is_writer() else None
    _last_copy = copied
    _snapshot_thread = threading.Thread(
        target=_write_snapshot,
        args=(step, copied, group),
        name=f"lazarus-snapshot-{step}",
        daemon=True,
    )
    _snapshot_thread.start()


def _write_snapshot(step: int, state: Mapping[str, Any] | None, group: Any) -> None:
    """Background: write this node's copy, wait for every node's, then commit. A
    failure is reported and the snapshot skipped: the disk tier still serves."""
    written = False
    if state is not None:
        try:
            _save_state_file(state, memory.write_dir(step) / STATE_FILE)
            written = True
        except Exception as exc:  # a snapshot must never kill training
            print(
                f"lazarus.rank: memory snapshot of step {step} not written: {exc}", file=sys.stderr
            )
    try:
        if group is not None:
            dist.barrier(group=group)  # every node's copy is in tmpfs before any commit
        if written:
            memory.commit(step)
    except Exception as exc:
        print(f"lazarus.rank: memory snapshot of step {step} not committed: {exc}", file=sys.stderr)


def _resolve(state: State) -> Mapping[str, Any]:
    return state() if callable(state) else state


def _copy_to_cpu(value: Any, reuse: Any = None) -> Any:
    """A deep copy of a state dict in CPU memory: tensors copied, containers rebuilt
    (an ``OrderedDict``'s ``_metadata`` kept, which ``load_state_dict`` reads), other
    values deep-copied, so nothing the training mutates afterwards is shared with
    the copy being written.

    ``reuse`` is the previous snapshot's copy: a tensor of the same shape, dtype and
    layout at the same place is copied into rather than allocated anew, which saves
    the page faults of fresh memory (most of the copy's cost). Safe because the
    previous write has finished before the next copy starts."""
    if isinstance(value, torch.Tensor):
        source = value.detach()
        if (
            isinstance(reuse, torch.Tensor)
            and reuse.shape == source.shape
            and reuse.dtype == source.dtype
            and reuse.layout == source.layout == torch.strided
        ):
            return reuse.copy_(source)
        return source.to("cpu", copy=True)
    if isinstance(value, Mapping):
        previous = reuse if isinstance(reuse, Mapping) else {}
        items = ((key, _copy_to_cpu(item, previous.get(key))) for key, item in value.items())
        if not isinstance(value, OrderedDict):
            return dict(items)
        rebuilt: OrderedDict[Any, Any] = OrderedDict(items)
        metadata = getattr(value, "_metadata", None)
        if metadata is not None:
            rebuilt._metadata = copy.deepcopy(metadata)  # type: ignore[attr-defined]
        return rebuilt
    if isinstance(value, list | tuple):
        previous_items = (
            reuse if isinstance(reuse, list | tuple) and len(reuse) == len(value) else None
        )
        copied = [
            _copy_to_cpu(item, previous_items[index] if previous_items is not None else None)
            for index, item in enumerate(value)
        ]
        return copied if isinstance(value, list) else tuple(copied)
    return copy.deepcopy(value)


def _broadcast_from_rank0(flags: list[bool]) -> list[bool]:
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
    tensor = torch.tensor([1 if flag else 0 for flag in flags], dtype=torch.uint8, device=device)
    dist.broadcast(tensor, src=0)
    return [bool(value) for value in tensor.tolist()]
