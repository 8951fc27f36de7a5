"""The ssh pool keeps one idle login per node while that node is in use
(activities/nodes/ssh/pool.py): a crash's search and preflight, which run at once,
then find a connection each instead of logging in. Fake connections: the pool only
asks a connection whether its transport is active, sets its keepalive and closes it."""

from __future__ import annotations

import time
from typing import Any

import pytest

from activities.nodes.ssh import pool as pool_module
from activities.nodes.ssh.pool import ConnectionPool

pytestmark = pytest.mark.timeout(60)


class _Transport:
    def __init__(self) -> None:
        self.active = True
        self.keepalive = 0

    def is_active(self) -> bool:
        return self.active

    def set_keepalive(self, interval: int) -> None:
        self.keepalive = interval


class _Connection:
    def __init__(self) -> None:
        self.transport = _Transport()
        self.closed = False

    def get_transport(self) -> _Transport:
        return self.transport

    def close(self) -> None:
        self.closed = True
        self.transport.active = False


def _wait(predicate: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_login_in_use_keeps_one_spare_past_the_idle_time() -> None:
    pool = ConnectionPool(idle_s=0.1)
    supervising, spare, extra = _Connection(), _Connection(), _Connection()
    pool.hold("h1", supervising)  # type: ignore[arg-type]
    pool.park("h1", spare, [])  # type: ignore[arg-type]
    pool.park("h1", extra, [])  # type: ignore[arg-type]

    _wait(lambda: extra.closed)
    time.sleep(0.5)  # several idle times
    assert extra.closed and not spare.closed and len(pool) == 1
    assert spare.transport.keepalive == pool_module.KEEPALIVE_S

    pool.park("h1", supervising, [])  # type: ignore[arg-type]
    assert pool.take("h1") == (supervising, [])  # the crash's search...
    assert pool.take("h1") == (spare, [])  # ...and its preflight: no login
    pool.close_all()


def test_the_spare_goes_once_nothing_uses_the_login() -> None:
    pool = ConnectionPool(idle_s=0.1)
    agent, spare, other = _Connection(), _Connection(), _Connection()
    pool.hold("h1", agent)  # type: ignore[arg-type]
    pool.park("h1", spare, [])  # type: ignore[arg-type]
    pool.park("h2", other, [])  # type: ignore[arg-type]
    _wait(lambda: other.closed)
    assert other.closed and not spare.closed  # only the login in use keeps one

    pool.release("h1", agent)  # type: ignore[arg-type]
    agent.close()
    _wait(lambda: spare.closed)
    assert spare.closed and len(pool) == 0
