"""The memory tier's per-user private roots, moved under a test's own directory."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

from lazarus.domain import memory_tier


@contextmanager
def private_roots_under(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path/shm`` stands in for ``/dev/shm`` (sticky, world-writable, as there):
    every ``/dev/shm/lazarus-<uid>`` the code makes lands under it."""
    shm = tmp_path / "shm"
    shm.mkdir()
    shm.chmod(0o1777)
    with mock.patch.object(memory_tier, "PRIVATE_ROOT_PREFIX", f"{shm}/lazarus-"):
        yield shm
