"""The host copy of a state dict a memory snapshot writes from.

The training thread pays for this copy and nothing else of a snapshot (the write, the
commit and the push run in the background), so it reuses the previous snapshot's
buffers: a fresh allocation's page faults are most of a copy's cost.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["copy_to_cpu"]


def copy_to_cpu(value: Any, reuse: Any = None) -> Any:
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
        items = ((key, copy_to_cpu(item, previous.get(key))) for key, item in value.items())
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
            copy_to_cpu(item, previous_items[index] if previous_items is not None else None)
            for index, item in enumerate(value)
        ]
        return copied if isinstance(value, list) else tuple(copied)
    return copy.deepcopy(value)
