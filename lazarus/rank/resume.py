"""Where a (re)started rank resumes from: the controller's choice under Lazarus
(``LAZARUS_RESUME_FROM`` / ``LAZARUS_RESUME_STEP``), else the newest committed
checkpoint across the memory and disk tiers, so a ``torchrun`` restart resumes too."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from lazarus.domain import checkpoint_layout, environment, memory_tier
from lazarus.rank import memory
from lazarus.rank.identity import _env_int, _under_lazarus, checkpoint_dir
from lazarus.rank.marks import _note_resume


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
