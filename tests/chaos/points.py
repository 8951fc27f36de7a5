"""The test side of :mod:`lazarus.domain.chaos_points`: arm a point, wait until the product
is held there, release it.

One directory serves a whole matrix run (the worker and every local rank inherit
``LAZARUS_CHAOS_DIR`` from the benchmark process). Every point is released (its
``.go`` file exists) except the one a cell arms, so a cell holds the product at
exactly one place, and nothing else ever waits.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from lazarus.domain.chaos_points import ALL_POINTS, go_file, reached_file

REACH_TIMEOUT_S = 180.0


class ChaosPoints:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.release_all()

    def arm(self, name: str) -> None:
        """The next process to reach ``name`` holds there until :meth:`release`."""
        reached_file(self.directory, name).unlink(missing_ok=True)
        go_file(self.directory, name).unlink(missing_ok=True)

    def release(self, name: str) -> None:
        go_file(self.directory, name).touch()

    def release_all(self) -> None:
        for name in ALL_POINTS:
            self.release(name)

    async def reached(self, name: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
        """Wait until a process is held at ``name`` (a deadline on progress only)."""
        marker = reached_file(self.directory, name)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not marker.exists():
            if loop.time() > deadline:
                raise TimeoutError(f"chaos point {name} not reached in {timeout_s:.0f} s")
            await asyncio.sleep(0.02)
