"""The framework-free half of the integrations (standard library only): where a
framework's checkpoint lands in the ledger and how it gets there, and the loss a
framework hands a callback, as the heartbeat wants it. Kept apart so it is tested
without importing any framework."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lazarus.rank import resume


def resume_file(name: str | None = None) -> str | None:
    """The checkpoint to resume from: the step directory the controller chose (outside
    Lazarus, the newest committed one), or the file ``name`` inside it; None to start
    fresh. Call it once, at startup."""
    directory = resume.resume_path()
    if directory is None:
        return None
    return str(directory if name is None else directory / name)


def move_into(source: Path, target: Path) -> None:
    """Move every entry of ``source`` into ``target`` by rename (no copy: keep both on
    one filesystem), then remove ``source``. An entry already in ``target`` is replaced
    (a re-save of the same step)."""
    for entry in sorted(source.iterdir()):
        os.replace(entry, target / entry.name)
    source.rmdir()


def loss_of(outputs: Any) -> float | None:
    """The loss a training step returned (a number or tensor, or a mapping with
    ``"loss"``) as a float for the heartbeat, or None when there is none."""
    value: Any = outputs.get("loss") if isinstance(outputs, dict) else outputs
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of many values
        return None
