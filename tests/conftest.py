"""Fixtures shared by every test folder that needs a real Temporal server."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from lazarus.app.devserver import DevServer

T = TypeVar("T")


@pytest.fixture(scope="session")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """One real ``temporal server start-dev`` per test process (per xdist worker)."""
    server = DevServer(tmp_path_factory.mktemp("temporal"), headless=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


FOLDER_WEIGHT = {"slurm": 40, "netns": 45, "e2e": 40, "integration": 10, "workflow": 3, "unit": 3}
"""A test's rough cost in seconds by folder (about its average in the suite on 2
cores), for :func:`balanced`: exact enough to keep the long ones apart."""
ONE_WORKER = ("slurm",)
"""Folders whose tests share a session fixture too costly to start on every worker
(the test Slurm: a slurmctld and three slurmd): they stay together on worker 0."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Only tests/unit holds fast-tier tests: every other folder's are ``slow``, so
    ``pytest -m "not slow"`` selects the same tests as ``make test-fast``. Under xdist
    the order is then :func:`balanced`."""
    unit = Path(__file__).parent / "unit"
    for item in items:
        if not item.path.is_relative_to(unit):
            item.add_marker(pytest.mark.slow)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        items[:] = balanced(items, workers, _folder)


def _folder(item: pytest.Item) -> str:
    here = Path(__file__).parent
    parts = item.path.relative_to(here).parts if item.path.is_relative_to(here) else ()
    return parts[0] if len(parts) > 1 else ""


def balanced(items: list[T], workers: int, folder_of: Callable[[T], str]) -> list[T]:
    """The items in the order that gives each xdist worker an equal share of the work.

    pytest-xdist's ``worksteal`` hands worker ``i`` the ``i``-th contiguous slice of
    the collection (sizes ``len(pending) // workers_left``), and an idle worker later
    steals the end of the longest queue. In folder order, one worker's slice was all
    the Slurm and SSH tests and the others' were quick: the suite ended on stolen
    four-minute tests while three workers idled. So the slices are filled here, the
    heaviest tests first, each into the slice with the least work so far
    (:data:`FOLDER_WEIGHT`), :data:`ONE_WORKER` folders into slice 0; each slice
    runs its heaviest first, so what is stolen from its end is short. The order is a
    pure function of the collection, as xdist requires (every worker collects it)."""
    sizes: list[int] = []
    left = len(items)
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    slices: list[list[T]] = [[] for _ in range(workers)]
    load = [0] * workers
    by_weight = sorted(
        items,
        key=lambda item: (
            folder_of(item) not in ONE_WORKER,
            -FOLDER_WEIGHT.get(folder_of(item), 10),
        ),
    )
    for item in by_weight:
        folder = folder_of(item)
        weight = FOLDER_WEIGHT.get(folder, 10)
        open_slices = [i for i in range(workers) if len(slices[i]) < sizes[i]]
        pinned = [0] if folder in ONE_WORKER and 0 in open_slices else open_slices
        target = min(pinned, key=lambda i: (load[i], i))
        slices[target].append(item)
        load[target] += weight
    return [item for piece in slices for item in piece]
