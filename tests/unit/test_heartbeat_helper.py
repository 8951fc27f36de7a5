"""The one "blocking work in a thread while the activity heartbeats" helper: what
launch, stop, supervise, checkpoint search, transfers and garbage collection rely
on, and that no activity keeps a copy of its own."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from activities.heartbeat import (
    MAX_HEARTBEAT_INTERVAL_S,
    heartbeat_interval,
    in_thread_heartbeating,
)

ACTIVITIES = Path(__file__).resolve().parents[2] / "activities"
WAIT_S = 30.0
"""A deadline on progress, never a speed: a loaded machine still beats within it."""


def short_heartbeats(env: ActivityEnvironment) -> ActivityEnvironment:
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=0.3))
    return env


async def test_outside_an_activity_it_simply_runs_the_work() -> None:
    assert heartbeat_interval() == MAX_HEARTBEAT_INTERVAL_S
    assert await in_thread_heartbeating(lambda: 42, lambda: "detail") == 42


async def test_interval_is_a_third_of_the_heartbeat_timeout_at_most_the_maximum() -> None:
    env = ActivityEnvironment()
    intervals: list[float] = []

    async def probe() -> None:
        intervals.append(heartbeat_interval())

    await env.run(probe)
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=0.9))
    await env.run(probe)
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=60))
    await env.run(probe)
    assert intervals == [MAX_HEARTBEAT_INTERVAL_S, pytest.approx(0.3), MAX_HEARTBEAT_INTERVAL_S]


async def test_beats_the_current_details_while_the_work_runs() -> None:
    env = short_heartbeats(ActivityEnvironment())
    beats: list[tuple[Any, ...]] = []
    two_beats = threading.Event()
    progress = {"done": 0}

    def on_heartbeat(*details: Any) -> None:
        beats.append(details)
        progress["done"] += 1
        if len(beats) >= 2:
            two_beats.set()

    env.on_heartbeat = on_heartbeat

    def work() -> str:
        assert two_beats.wait(WAIT_S), "no heartbeats while the work ran"
        return "finished"

    async def activity_body() -> str:
        return await in_thread_heartbeating(work, lambda: dict(progress))

    assert await env.run(activity_body) == "finished"
    assert beats[0] == ({"done": 0},) and beats[1] == ({"done": 1},)


async def test_none_details_beat_without_details() -> None:
    env = short_heartbeats(ActivityEnvironment())
    beats: list[tuple[Any, ...]] = []
    beaten = threading.Event()

    def on_heartbeat(*details: Any) -> None:
        beats.append(details)
        beaten.set()

    env.on_heartbeat = on_heartbeat

    async def activity_body() -> None:
        await in_thread_heartbeating(lambda: beaten.wait(WAIT_S))

    await env.run(activity_body)
    assert beats and beats[0] == ()


async def test_a_failure_beats_the_freshest_details_once_more_then_raises() -> None:
    env = ActivityEnvironment()  # no heartbeat timeout: the failure comes before any beat
    beats: list[tuple[Any, ...]] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    state = {"parts": 0}

    def work() -> None:
        state["parts"] = 3
        raise ConnectionError("store went away")

    async def activity_body() -> None:
        await in_thread_heartbeating(work, lambda: dict(state))

    with pytest.raises(ConnectionError, match="store went away"):
        await env.run(activity_body)
    assert beats == [({"parts": 3},)]


async def test_cancelling_with_an_event_stops_the_work_before_reraising() -> None:
    env = short_heartbeats(ActivityEnvironment())
    first_beat = asyncio.Event()
    env.on_heartbeat = lambda *_: first_beat.set()
    cancel = threading.Event()
    stopped = threading.Event()

    def work() -> None:
        assert cancel.wait(WAIT_S), "the cancel event was never set"
        stopped.set()

    async def activity_body() -> None:
        await in_thread_heartbeating(work, cancel=cancel)

    running = asyncio.ensure_future(env.run(activity_body))
    await asyncio.wait_for(first_beat.wait(), WAIT_S)
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(running, WAIT_S)
    assert stopped.is_set(), "re-raised while the work was still running"


async def test_cancelling_without_an_event_returns_at_once_and_leaves_the_thread() -> None:
    env = short_heartbeats(ActivityEnvironment())
    first_beat = asyncio.Event()
    env.on_heartbeat = lambda *_: first_beat.set()
    release = threading.Event()
    finished = threading.Event()

    def work() -> None:
        release.wait(WAIT_S)
        finished.set()

    async def activity_body() -> None:
        await in_thread_heartbeating(work)

    running = asyncio.ensure_future(env.run(activity_body))
    try:
        await asyncio.wait_for(first_beat.wait(), WAIT_S)
        env.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(running, WAIT_S)
        assert not finished.is_set()
    finally:
        release.set()
    assert await asyncio.to_thread(finished.wait, WAIT_S)


def test_no_activity_keeps_its_own_copy_of_the_heartbeat_loop() -> None:
    """A loop that awaits a thread with a timeout and beats in between is the
    helper's job alone (issue 11: five copies had grown)."""
    copies = [
        str(path.relative_to(ACTIVITIES))
        for path in sorted(ACTIVITIES.rglob("*.py"))
        if path.name != "heartbeat.py" and re.search(r"asyncio\.wait\(", path.read_text())
    ]
    assert copies == [], f"use activities.heartbeat.in_thread_heartbeating: {copies}"
