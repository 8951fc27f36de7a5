"""Fixtures for tests that need real SSH hosts (network namespaces + one sshd each).

Why function scope: tests kill hosts, partition them and leave processes behind; a fresh
set per test keeps one test's damage out of the next. Start-up is cheap (~0.2 s for
four hosts), so there is nothing worth sharing.

Why skip-or-fail: on a developer laptop without root or without openssh-server these
tests cannot run and should say why (skip). In CI (env ``CI`` set) a skip would silently
hide the whole multi-node suite, so the same condition is a hard failure there.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infra.testhost_network import unavailable_reason
from infra.testhosts import TestHosts

HostsFactory = Callable[[int], TestHosts]
netns_unavailable_reason = unavailable_reason


def require_netns() -> None:
    """Skip the calling test (or fail it, when env CI is set) if test hosts cannot run."""
    reason = netns_unavailable_reason()
    if reason is None:
        return
    message = f"real SSH test hosts unavailable: {reason}"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI is set: refusing to skip)", pytrace=False)
    pytest.skip(message)


@pytest.fixture
def netns_required() -> None:
    """For tests that drive TestHosts themselves (e.g. to exercise failure paths)."""
    require_netns()


@pytest.fixture
def test_hosts(tmp_path: Path) -> Iterator[HostsFactory]:
    """Factory: ``test_hosts(3)`` returns started hosts h1..h3; all are stopped afterwards.

    Teardown runs even when the test fails or times out (pytest-timeout's signal method
    raises inside the test), and TestHosts also has an atexit hook as a last resort.
    """
    require_netns()
    created: list[TestHosts] = []

    def factory(count: int) -> TestHosts:
        hosts = TestHosts(count, tmp_path / f"hosts{len(created)}")
        created.append(hosts)
        hosts.start()
        return hosts

    try:
        yield factory
    finally:
        for hosts in reversed(created):
            hosts.stop()


# The job fixtures (one dev server per session, a worker per test, start_job with
# teardown) are the end-to-end suite's; re-exported so the ssh tests share them.
from tests.e2e.conftest import client, stack, start_job  # noqa: E402, F401


def ssh_nodes(hosts: TestHosts) -> list[dict[str, object]]:
    """The job spec's ``nodes`` entries for every test host (root, the hosts' key).

    Each node's ``env.PATH`` puts this test venv's interpreter first, as a node whose
    environment has the job's venv on its PATH: a rank on an ssh node gets the node's
    own PATH unless the spec sets one (issue 39), and the hosts share this machine's
    filesystem, so ``python`` in the example's command is the venv's, with torch."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return [
        {
            "name": h.name,
            "launcher": "ssh",
            "host": h.address,
            "port": h.port,
            "user": "root",
            "identity_file": str(hosts.identity_file),
            "env": {"PATH": path},
        }
        for h in hosts.hosts
    ]
