"""The product's chaos points: free unless armed, held exactly until released."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from lazarus.domain import chaos_points
from lazarus.domain.chaos_points import CHAOS_DIR_ENV, chaos_point, go_file, reached_file


def test_without_the_environment_it_does_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CHAOS_DIR_ENV, raising=False)
    chaos_point("anything")  # returns at once: nothing to wait for
    assert list(tmp_path.iterdir()) == []


def test_an_armed_point_holds_until_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CHAOS_DIR_ENV, str(tmp_path))
    passed = threading.Event()

    def product() -> None:
        chaos_point("launch.before_pids")
        passed.set()

    thread = threading.Thread(target=product, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not reached_file(tmp_path, "launch.before_pids").exists():
        assert time.monotonic() < deadline, "the point was never reached"
        time.sleep(0.01)
    assert not passed.wait(0.2), "an armed point must hold"
    go_file(tmp_path, "launch.before_pids").touch()
    assert passed.wait(30)
    thread.join(30)


def test_a_released_or_skipped_point_passes_and_the_wait_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CHAOS_DIR_ENV, str(tmp_path))
    go_file(tmp_path, "released").touch()
    chaos_point("released")
    chaos_point("skipped", when=False)
    assert not reached_file(tmp_path, "skipped").exists()
    monkeypatch.setattr(chaos_points, "MAX_WAIT_S", 0.1)
    started = time.monotonic()
    chaos_point("forgotten")  # never released: goes on after MAX_WAIT_S
    assert reached_file(tmp_path, "forgotten").exists()
    assert time.monotonic() - started < 30
