"""The fast tier's guard: ``make test-fast`` runs every test here not marked ``slow``.

That tier has to stay under a minute on a 2-core machine, so a test in it may neither
start a process nor take long. This hook fails a test that is not marked ``slow``
when its call

- uses over ``LAZARUS_FAST_TEST_LIMIT_S`` seconds of CPU (default 2; raise it on a
  machine that is known to be slow, never to let one test through), or
- starts a process (``subprocess``, ``os.fork``, ``os.system``, ``posix_spawn``, ``exec``),
  seen through Python's audit events.

CPU time, not wall time: the suite must pass on a busy machine (CI shares 2 cores),
where a 0.3 s test can wait seconds for a core; a test that *computes* for over 2 s
is too slow wherever it runs. A test that waits instead (a sleep, a timeout) uses no
CPU, so wall time has a backstop too: ``WALL_BACKSTOP`` times the limit, far beyond
what load alone does to a test under the CPU limit.

A test that needs either is marked ``@pytest.mark.slow`` (with the reason in a
comment) or moves to ``tests/integration``. ``make test`` runs every tier, ``slow``
included.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Generator

import pytest

LIMIT_ENV = "LAZARUS_FAST_TEST_LIMIT_S"
DEFAULT_LIMIT_S = 2.0
WALL_BACKSTOP = 10
"""A fast test may take this many times the limit in wall time (a wait, not work)."""

_SPAWN_EVENTS = frozenset(
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.system", "os.posix_spawn", "os.exec"}
)
_watching = False
_spawned: list[str] = []


def _audit(event: str, args: tuple[object, ...]) -> None:
    if _watching and event in _SPAWN_EVENTS:
        _spawned.append(f"{event} {args[0]!r}" if args else event)


sys.addaudithook(_audit)  # an audit hook cannot be removed: it only records while a test calls
platform.uname().processor  # noqa: B018 cached by the standard library; the first read runs `uname -p`


def _limit_s() -> float:
    value = os.environ.get(LIMIT_ENV, "")
    try:
        return float(value) if value else DEFAULT_LIMIT_S
    except ValueError:
        raise pytest.UsageError(f"{LIMIT_ENV}={value!r} is not a number of seconds") from None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    global _watching
    if item.get_closest_marker("slow") is not None:
        return (yield)
    _spawned.clear()
    _watching = True
    started = time.process_time()
    started_wall = time.perf_counter()
    try:
        result = yield
    finally:
        _watching = False
    took_s = time.process_time() - started
    waited_s = time.perf_counter() - started_wall
    where = "mark it @pytest.mark.slow or move it to tests/integration"
    if _spawned:
        pytest.fail(f"a fast-tier test started a process ({_spawned[0]}): {where}", pytrace=False)
    limit_s = _limit_s()
    if took_s > limit_s:
        pytest.fail(
            f"a fast-tier test used {took_s:.1f} s of CPU, over the {limit_s:g} s limit "
            f"({LIMIT_ENV}): {where}",
            pytrace=False,
        )
    if waited_s > limit_s * WALL_BACKSTOP:
        pytest.fail(
            f"a fast-tier test took {waited_s:.1f} s, over {WALL_BACKSTOP}x the "
            f"{limit_s:g} s limit ({LIMIT_ENV}): it waits on something: {where}",
            pytrace=False,
        )
    return result


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Record (and refuse) any attempt of the CLI to connect: for commands that must
    answer without a server."""
    from lazarus.app import cli  # here: the rest of the fast tier never imports the CLI

    attempts: list[object] = []

    async def refuse(settings: object, timeout_s: float = 5.0) -> object:
        attempts.append(settings)
        raise AssertionError("this command must not contact a server")

    monkeypatch.setattr(cli, "connect", refuse)
    return attempts
