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

**A resume point never runs code** (issue 37, N8). DCP's own reader unpickles
``.metadata`` with plain :func:`pickle.load`, and its planner reads every non-tensor
value with ``torch.load(weights_only=False)``: anyone who can write the checkpoint
directory (or the durable bucket a restore copies from; the manifest's sha256 comes
from the same place) would run code in every rank. :func:`lazarus.rank.torch.load`
keeps ``weights_only=True`` for that reason, and :func:`load_sharded` keeps the same
promise: ``.metadata`` is read by :class:`MetadataUnpickler`, which builds only DCP's
metadata classes, ``torch.Size``, dtypes, layouts and paths and refuses anything else
(:class:`UntrustedCheckpoint`, naming it), and non-tensor values are read with
``weights_only=True`` (plain Python values: numbers, strings, lists, dicts, tuples).

Kept apart from :mod:`lazarus.rank` (standard library only) so that importing the
helper never imports torch.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import IO, Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from lazarus.domain import phases
from lazarus.rank import checkpoints, identity, marks, resume
from lazarus.rank.checkpoints import _checkpoint_root
from lazarus.rank.torch import _distributed

__all__ = ["MetadataUnpickler", "UntrustedCheckpoint", "load_sharded", "save_sharded"]


def save_sharded(step: int, state_dict: dict[str, Any]) -> Path | None:
    """Save ``state_dict`` (sharded tensors allowed) as completed step ``step``.

    Every rank must call it: DCP's save is a collective and every rank writes its
    own shards. The barrier before the commit makes the ``COMMITTED`` marker appear
    only once every rank's shards are on disk. Rank 0 gets the committed directory
    back, other ranks get None. For model and optimizer state, build ``state_dict``
    with ``torch.distributed.checkpoint.state_dict.get_state_dict``.

    Keep non-tensor values plain (numbers, strings, lists, dicts, tuples):
    :func:`load_sharded` reads them with ``weights_only=True`` and refuses any other
    object, since a checkpoint must never run code in the ranks that load it."""
    _checkpoint_root()  # no directory: raise on every rank alike, before any collective
    rank = dist.get_rank() if _distributed() else identity.info().rank
    # Every rank creates (or finds) the same directory: a shared filesystem, or
    # one directory per node for single-node jobs.
    directory = checkpoints.checkpoint_path(step)
    dcp_save(state_dict, checkpoint_id=directory)
    if _distributed():
        dist.barrier()
    if rank == 0:
        return checkpoints.commit_checkpoint(step)
    return None


def load_sharded(state_dict: dict[str, Any]) -> int | None:
    """Load the resume point into ``state_dict`` in place (DCP reshards to this
    world) and return its step, or None to start fresh; marks
    ``checkpoint_loaded`` either way. Every rank must call it.

    ``state_dict`` gives the shapes and shardings to load into: the same
    ``get_state_dict`` the save used, on the freshly built model; apply the result
    with ``set_state_dict``.

    Nothing in the checkpoint runs code: ``.metadata`` is read by
    :class:`MetadataUnpickler` and non-tensor values with ``weights_only=True``; a
    checkpoint holding anything else raises (DCP wraps the
    :class:`UntrustedCheckpoint` or :class:`pickle.UnpicklingError` in its
    ``CheckpointException``)."""
    point = resume.resume_point()
    if point is None:
        marks.mark(phases.CHECKPOINT_LOADED)
        return None
    step, directory = point
    dcp_load(
        state_dict,
        checkpoint_id=directory,
        storage_reader=_TrustedReader(directory),
        planner=_TrustedPlanner(),
    )
    marks.mark(phases.CHECKPOINT_LOADED)
    return step


class UntrustedCheckpoint(pickle.UnpicklingError):
    """A DCP ``.metadata`` that names something other than DCP's metadata: loading it
    would have let the checkpoint run code in this rank."""


_TORCH_NAMES = frozenset({"Size"})
"""``torch.<name>`` globals a ``.metadata`` holds besides dtypes."""
_ALLOWED = frozenset(
    {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),  # a layout by name: torch's own allow-list
        ("pathlib", "Path"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "PureWindowsPath"),
        ("collections", "OrderedDict"),
    }
)
"""Other globals a ``.metadata`` holds: DCP's file index, and what its fields use."""


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles a DCP ``.metadata`` and nothing else: the classes of
    ``torch.distributed.checkpoint.metadata`` (``Metadata``, ``TensorStorageMetadata``,
    ``ChunkStorageMetadata``...), DCP's ``_StorageInfo``, ``torch.Size``, dtypes,
    layouts, paths. Any other global (``os.system``, ``builtins.exec``, a class with a
    ``__reduce__``) raises :class:`UntrustedCheckpoint` before it is called."""

    def find_class(self, module: str, name: str) -> Any:
        if module == dcp_metadata.__name__:
            found = getattr(dcp_metadata, name, None)
            if isinstance(found, type):
                return found
        elif module == "torch":
            found = getattr(torch, name, None)
            if name in _TORCH_NAMES or isinstance(found, torch.dtype):
                return found
        elif (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise UntrustedCheckpoint(
            f"a DCP .metadata may hold only DCP's metadata, not {module}.{name}: "
            "refused, so that a checkpoint cannot run code in the ranks that load it"
        )


def read_metadata(data: bytes) -> Metadata:
    """A ``.metadata`` file's :class:`Metadata`, through :class:`MetadataUnpickler`."""
    metadata = MetadataUnpickler(io.BytesIO(data)).load()
    if not isinstance(metadata, Metadata):
        raise UntrustedCheckpoint(
            f"a DCP .metadata holds a {type(metadata).__name__}, not DCP's Metadata"
        )
    return metadata


class _TrustedReader(FileSystemReader):
    """DCP's file reader with :func:`read_metadata` in place of its ``pickle.load``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = read_metadata(cast(IO[bytes], stream).read())
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _TrustedPlanner(DefaultLoadPlanner):
    """DCP's planner, with non-tensor values read ``weights_only=True`` first: DCP's
    own ``torch.load(weights_only=False)`` then only ever reads bytes that passed."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        data = value.getvalue()
        try:
            torch.load(io.BytesIO(data), weights_only=True)
        except pickle.UnpicklingError as exc:
            raise UntrustedCheckpoint(
                f"{read_item.dest_index.fqn}: not a plain value ({exc}); refused, so that "
                "a checkpoint cannot run code in the ranks that load it"
            ) from None
        super().load_bytes(read_item, io.BytesIO(data))
