"""Fixtures shared by every test folder that needs a real Temporal server."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.checkpoints.replica_key import KEY_FILE_ENV
from activities.nodes.ssh_files import SSH_DIRS_ENV
from lazarus.app.devserver import DevServer

# The worker's replica key (activities.checkpoints.replica_key): one of the test
# process's own, shared with every worker and node process it starts, never the
# user's ~/.config.
_KEY_DIR = tempfile.mkdtemp(prefix="lazarus-test-key-")
os.environ.setdefault(KEY_FILE_ENV, os.path.join(_KEY_DIR, "replica.key"))
atexit.register(shutil.rmtree, _KEY_DIR, ignore_errors=True)

# The SSH files of the test hosts (infra/testhosts.py) and of tests' own specs live
# under the temporary directory: the workers this process starts allow it beside
# ~/.ssh (activities.nodes.ssh_files; a worker allows ~/.ssh alone by default).
os.environ.setdefault(SSH_DIRS_ENV, os.pathsep.join(["~/.ssh", tempfile.gettempdir()]))


@pytest.fixture(scope="session")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """One real ``temporal server start-dev`` per test process (per xdist worker)."""
    server = DevServer(tmp_path_factory.mktemp("temporal"), headless=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


LONGEST_FIRST = ("slurm", "netns", "e2e", "integration", "workflow", "unit")
"""The folders in the order their tests start: the longest first, so that under
xdist a four-minute test never starts last and leaves the other workers idle."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Only tests/unit holds fast-tier tests: every other folder's are ``slow``, so
    ``pytest -m "not slow"`` selects the same tests as ``make test-fast``. Then the
    longest folders go first (:data:`LONGEST_FIRST`; a stable sort keeps each file's
    tests together, so module fixtures are set up once)."""
    here = Path(__file__).parent
    unit = here / "unit"
    for item in items:
        if not item.path.is_relative_to(unit):
            item.add_marker(pytest.mark.slow)

    def folder_rank(item: pytest.Item) -> int:
        parts = item.path.relative_to(here).parts if item.path.is_relative_to(here) else ()
        folder = parts[0] if len(parts) > 1 else ""
        return LONGEST_FIRST.index(folder) if folder in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=folder_rank)
