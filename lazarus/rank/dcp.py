"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP), issue 29.

:func:`lazarus.rank.torch.save` writes one ``state.pt`` from rank 0, which suits
data parallel jobs. A sharded job (FSDP) holds only its shard of each parameter,
so every rank must write: :func:`save_sharded` has DCP write every rank's shards
(``__<rank>_0.distcp``) and the global ``.metadata`` into
:func:`lazarus.rank.checkpoint_path`, then a barrier, then rank 0 seals the
directory through the same ledger as every other checkpoint (the manifest lists
each shard with its size and sha256, then ``COMMITTED``). The controller's verify,
fallback, tiering and retention therefore see an ordinary directory of files.

:func:`load_sharded` reads the resume point the controller chose. DCP reshards on
load from the saved ``.metadata``, so a job restarted on fewer ranks (``min_nodes``)
loads the same state into its smaller world.

Kept apart from :mod:`lazarus.rank` (standard library only) so that importing the
helper never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

import lazarus.rank as lazarus_rank
from lazarus.domain import phases
from lazarus.rank.checkpoints import _checkpoint_root
from lazarus.rank.torch import _distributed

__all__ = ["load_sharded", "save_sharded"]


def save_sharded(step: int, state_dict: dict[str, Any]) -> Path | None:
    """Save ``state_dict`` (sharded tensors allowed) as completed step ``step``.

    Every rank must call it: DCP's save is a collective and every rank writes its
    own shards. The barrier before the commit makes the ``COMMITTED`` marker appear
    only once every rank's shards are on disk. Rank 0 gets the committed directory
    back, other ranks get None. For model and optimizer state, build ``state_dict``
    with ``torch.distributed.checkpoint.state_dict.get_state_dict``."""
    _checkpoint_root()  # no directory: raise on every rank alike, before any collective
    rank = dist.get_rank() if _distributed() else lazarus_rank.info().rank
    # Every rank creates (or finds) the same directory: a shared filesystem, or
    # one directory per node for single-node jobs.
    directory = lazarus_rank.checkpoint_path(step)
    dcp_save(state_dict, checkpoint_id=directory)
    if _distributed():
        dist.barrier()
    if rank == 0:
        return lazarus_rank.commit_checkpoint(step)
    return None


def load_sharded(state_dict: dict[str, Any]) -> int | None:
    """Load the resume point into ``state_dict`` in place (DCP reshards to this
    world) and return its step, or None to start fresh; marks
    ``checkpoint_loaded`` either way. Every rank must call it.

    ``state_dict`` gives the shapes and shardings to load into: the same
    ``get_state_dict`` the save used, on the freshly built model; apply the result
    with ``set_state_dict``."""
    point = lazarus_rank.resume_point()
    if point is None:
        lazarus_rank.mark(phases.CHECKPOINT_LOADED)
        return None
    step, directory = point
    dcp_load(state_dict, checkpoint_id=directory)
    lazarus_rank.mark(phases.CHECKPOINT_LOADED)
    return step
