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
    if step % 100 == 0 or lazarus_torch.should_checkpoint():
        lazarus_torch.save(step, {"model": model.state_dict()})  # every rank calls it
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import lazarus.rank as lazarus_rank
from lazarus.domain import environment

STATE_FILE = "state.pt"

__all__ = ["STATE_FILE", "load", "save", "should_checkpoint"]


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
        target = lazarus_rank.checkpoint_path(step) / STATE_FILE
        temp = lazarus_rank.temp_path_for(target)
        try:
            torch.save(dict(state), temp)
            os.replace(temp, target)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
    if _distributed():
        dist.barrier()
    if is_writer:
        return lazarus_rank.commit_checkpoint(step)
    return None


def load(
    map_location: str | torch.device | None = "cpu", *, weights_only: bool = True
) -> tuple[int, dict[str, Any]] | None:
    """The ``(step, state)`` saved by :func:`save` at the resume point chosen by
    :func:`lazarus.rank.resume_point`, or None to start fresh.

    ``weights_only`` stays on by default: model and optimizer state dicts need
    nothing more, and it refuses to run code hidden in a checkpoint file."""
    point = lazarus_rank.resume_point()
    if point is None:
        return None
    step, directory = point
    state = torch.load(directory / STATE_FILE, map_location=map_location, weights_only=weights_only)
    if not isinstance(state, dict):
        raise TypeError(f"{directory / STATE_FILE} holds a {type(state).__name__}, not a dict")
    return step, state


def should_checkpoint() -> bool:
    """:func:`lazarus.rank.should_checkpoint`, decided by rank 0 and broadcast, so
    every rank answers the same at the same step (ranks reading the control file
    themselves would notice a request at different steps and deadlock in the
    checkpoint's barrier). Every rank must call it at the same point: it is a
    collective, costing one tiny broadcast."""
    if not _distributed() or dist.get_world_size() == 1:
        return lazarus_rank.should_checkpoint()
    wanted = dist.get_rank() == 0 and lazarus_rank.should_checkpoint()
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
    flag = torch.tensor([1 if wanted else 0], dtype=torch.uint8, device=device)
    dist.broadcast(flag, src=0)
    return bool(flag.item())
