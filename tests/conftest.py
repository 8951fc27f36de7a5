"""Fixtures shared by every test folder that needs a real Temporal server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lazarus.devserver import DevServer


@pytest.fixture(scope="session")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """One real ``temporal server start-dev`` per test process (per xdist worker)."""
    server = DevServer(tmp_path_factory.mktemp("temporal"), headless=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()
