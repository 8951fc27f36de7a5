"""The fault-free reference weights every weight-checking test compares against."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

from infra.reference_run import WORLD_SIZE, run_reference


def shared_reference(
    tmp_path_factory: pytest.TempPathFactory, steps: int, world_size: int = WORLD_SIZE
) -> Path:
    """The example's weights after ``steps`` on ``world_size`` plain processes (no
    Lazarus), run once per test session however many xdist workers ask. Each
    reference costs a few CPU-seconds of torch that every worker used to repeat, and
    every extra run was one more chance at the rendezvous port race
    (:class:`infra.reference_run.ReferenceStalled`)."""
    return shared_once(
        tmp_path_factory,
        f"reference-{world_size}x{steps}",
        lambda workdir: run_reference(workdir, steps=steps, world_size=world_size),
    )


def shared_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Path]
) -> Path:
    """What ``build(workdir)`` returns (a path), built once per test session under
    ``name`` however many xdist workers ask: they share the parent of their base
    temp directories, and a file lock makes the others wait for the first."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    workdir = root / name
    done = workdir / "done"
    with FileLock(f"{workdir}.lock"):
        if not done.exists():
            workdir.mkdir(parents=True, exist_ok=True)
            built = build(workdir)
            done.write_text(str(built))
    return Path(done.read_text())
