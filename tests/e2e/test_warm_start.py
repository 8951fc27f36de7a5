"""Warm-started relaunches end to end: a real dev server, a real worker, real 2-rank
DDP ranks forked from the run's zygote (``warm_start``), and their cold fallbacks.

The launch outcome (``LaunchResult.warm_start``) is read from each generation's
``launch.json``, where the launcher records it. Teardown stops every zygote the test
started (the workflow's end-of-run stop is not relied on here)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from activities.nodes import zygote_client
from activities.nodes.procfs import is_alive
from activities.nodes.rundir import GenerationDir, latest_run, read_json
from activities.nodes.zygote_socket import zygote_dir
from infra import chaos
from lazarus.domain.contracts import WarmStartOutcome
from tests.e2e.conftest import STEPS, Job, assert_same_weights, ddp_spec
from workflows.state import Phase

StartJob = Callable[..., Awaitable[Job]]
WARM = {"preload": ["torch"], "standby": 1}


@pytest.fixture(autouse=True)
def stop_zygotes(tmp_path: Path) -> Iterator[None]:
    yield
    for directory in tmp_path.rglob(".zygote-*"):
        zygote_client.stop_zygote(directory)


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except zygote_client.ZygoteUnavailable:
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")


def run_root(job: Job) -> Path:
    root = latest_run(job.run_root)
    assert root is not None, "nothing launched yet"
    return root


def outcome(job: Job, generation: int, timeout_s: float = 90.0) -> WarmStartOutcome:
    def read() -> dict[str, Any] | None:
        root = latest_run(job.run_root)
        return read_json(GenerationDir.of(root, generation).launch_file) if root else None

    launched = wait_for(read, timeout_s, f"generation {generation}'s launch.json")
    assert launched.get("warm_start") is not None, launched
    return WarmStartOutcome.model_validate(launched["warm_start"])


def zygote(job: Job) -> Path:
    return zygote_dir(run_root(job), "local")


async def crash_rank_1(job: Job, at_step: int, min_generation: int) -> None:
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, at_step, 120.0, min_generation)
    chaos.signal_rank(job.run_root, rank=1, sig=signal.SIGKILL)


@pytest.mark.timeout(240)
async def test_a_crash_with_warm_start_relaunches_warm_with_identical_weights(
    start_job: StartJob, tmp_path: Path, fault_free_weights: Path
) -> None:
    job = await start_job(ddp_spec(tmp_path, steps=STEPS, warm_start=WARM))
    await crash_rank_1(job, 25, 1)
    status = await job.result()
    assert status.phase == Phase.SUCCEEDED and status.generation == 2
    first, second = outcome(job, 1), outcome(job, 2)
    assert first.warm_ranks == [0, 1], first
    assert second.warm_ranks == [0, 1] and second.cold_ranks == [], second
    assert second.from_standby >= 1, "the relaunch took the idle standby"
    assert_same_weights(job.weights, fault_free_weights)


@pytest.mark.timeout(300)
async def test_a_killed_zygote_falls_back_cold_then_comes_back(
    start_job: StartJob, tmp_path: Path
) -> None:
    job = await start_job(ddp_spec(tmp_path, steps=400, warm_start=WARM))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 5)
    info = zygote_client.read_zygote(zygote(job))
    assert info is not None
    os.kill(info.pid, signal.SIGKILL)
    await asyncio.to_thread(
        wait_for, lambda: not is_alive(info.pid, info.start_ticks), 10, "the zygote to die"
    )
    await crash_rank_1(job, 8, 1)
    second = outcome(job, 2)
    assert second.cold_ranks == [0, 1], second
    assert any("dead" in r and "restarted" in r for r in second.fallback_reasons), second

    # Generation 2's launch restarted it: once it serves, the next relaunch is warm.
    await asyncio.to_thread(
        wait_for,
        lambda: zygote_client.zygote_status(zygote(job)).idle_standby_pids,
        90,
        "the restarted zygote to serve with a standby",
    )
    await crash_rank_1(job, 12, 2)
    third = outcome(job, 3)
    assert third.warm_ranks == [0, 1] and third.cold_ranks == [], third
    await job.wait_phase(Phase.RUNNING)


@pytest.mark.timeout(240)
async def test_a_failed_preload_starts_cold_and_the_launch_says_why(
    start_job: StartJob, tmp_path: Path
) -> None:
    spec = ddp_spec(tmp_path, steps=20, warm_start={"preload": ["no_such_module"]})
    job = await start_job(spec)
    status = await job.result()
    assert status.phase == Phase.SUCCEEDED and status.step == 20
    first = outcome(job, 1)
    assert first.cold_ranks == [0, 1] and first.warm_ranks == []
    [reason] = first.fallback_reasons
    assert reason.startswith("local: ") and "preload failed" in reason
    assert "no_such_module" in reason


@pytest.mark.timeout(240)
async def test_a_killed_standby_is_refilled(start_job: StartJob, tmp_path: Path) -> None:
    job = await start_job(ddp_spec(tmp_path, steps=400, warm_start=WARM))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 3)
    [idle] = await asyncio.to_thread(
        wait_for,
        lambda: zygote_client.zygote_status(zygote(job)).idle_standby_pids,
        60,
        "an idle standby",
    )
    os.kill(idle, signal.SIGKILL)
    [refilled] = await asyncio.to_thread(
        wait_for,
        lambda: [
            p for p in zygote_client.zygote_status(zygote(job)).idle_standby_pids if p != idle
        ],
        60,
        "the standby to be replaced",
    )
    assert refilled != idle
    # The replacement serves: a crash now is relaunched from it.
    await crash_rank_1(job, 6, 1)
    second = outcome(job, 2)
    assert second.warm_ranks == [0, 1] and second.from_standby >= 1, second
