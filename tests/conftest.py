"""Fixtures shared by every test folder that needs a real Temporal server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lazarus.app.devserver import DevServer


@pytest.fixture(scope="session")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """One real ``temporal server start-dev`` per test process (per xdist worker)."""
    server = DevServer(tmp_path_factory.mktemp("temporal"), headless=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Only tests/unit holds fast-tier tests: every other folder's are ``slow``, so
    ``pytest -m "not slow"`` selects the same tests as ``make test-fast``."""
    unit = Path(__file__).parent / "unit"
    for item in items:
        if not item.path.is_relative_to(unit):
            item.add_marker(pytest.mark.slow)
