"""The controller itself fails: the worker dies, or the Temporal server restarts.

Ranks are never children of the worker, so training must not notice: no steps
lost, never more rank processes than the world size, and the job completes.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from infra import chaos
from lazarus.app.local_stack import LocalStack
from tests.e2e.conftest import STEPS, Job, assert_same_weights, ddp_spec, rank_census
from workflows.state import Phase

StartJob = Callable[..., Awaitable[Job]]


@pytest.mark.timeout(180)
async def test_worker_sigkill_during_training_loses_nothing(
    start_job: StartJob, stack: LocalStack, tmp_path: Path, fault_free_weights: Path
) -> None:
    job = await start_job(ddp_spec(tmp_path, steps=STEPS, step_time=0.1))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 15)
    with rank_census(job) as counts:
        stack.kill_worker(signal.SIGKILL)
        _, before = chaos.current_step(job.run_root)
        await asyncio.sleep(2.0)
        _, during = chaos.current_step(job.run_root)
        assert during is not None and before is not None and during > before, (
            "training must go on while no controller runs"
        )
        stack.start_worker()
        status = await job.result()
    assert status.phase == Phase.SUCCEEDED
    assert status.generation == 1, "the new worker must re-attach, not relaunch"
    assert status.incidents == []
    assert max(counts) <= job.spec.world_size
    assert_same_weights(job.weights, fault_free_weights)


@pytest.mark.timeout(180)
async def test_worker_sigkill_during_recovery(
    start_job: StartJob, stack: LocalStack, tmp_path: Path, fault_free_weights: Path
) -> None:
    spec = ddp_spec(
        tmp_path,
        steps=STEPS,
        step_time=0.1,
        recovery={"backoff_initial_s": 3.0, "backoff_max_s": 3.0},
    )
    job = await start_job(spec)
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 15)
    with rank_census(job) as counts:
        chaos.signal_rank(job.run_root, rank=1, sig=signal.SIGKILL)
        await job.wait_phase(Phase.RECOVERING, Phase.LAUNCHING, timeout_s=30)
        stack.kill_worker(signal.SIGKILL)
        await asyncio.sleep(2.0)
        stack.start_worker()
        status = await job.result()
    assert status.phase == Phase.SUCCEEDED
    assert status.generation == 2
    assert len(status.incidents) == 1
    assert max(counts) <= job.spec.world_size
    assert_same_weights(job.weights, fault_free_weights)


@pytest.mark.timeout(240)
async def test_dev_server_restart_mid_run(
    start_job: StartJob, stack: LocalStack, tmp_path: Path, fault_free_weights: Path
) -> None:
    job = await start_job(ddp_spec(tmp_path, steps=STEPS, step_time=0.15))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 10)
    await asyncio.to_thread(stack.restart_server, 1.0)
    status = await job.result(timeout_s=200)
    assert status.phase == Phase.SUCCEEDED
    assert status.generation == 1
    assert_same_weights(job.weights, fault_free_weights)


@pytest.mark.timeout(180)
async def test_worker_sigterm_drains_gracefully_and_ranks_keep_running(
    start_job: StartJob, stack: LocalStack, tmp_path: Path
) -> None:
    job = await start_job(ddp_spec(tmp_path, steps=STEPS, step_time=0.1))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 10)
    worker_pid = stack.worker_pid
    started = time.monotonic()
    stack.kill_worker(signal.SIGTERM, timeout_s=20)
    assert time.monotonic() - started < 20, f"worker {worker_pid} did not drain on SIGTERM"
    assert len(chaos.live_rank_processes(job.run_root)) == job.spec.world_size
    stack.start_worker()
    status = await job.result()
    assert status.phase == Phase.SUCCEEDED and status.generation == 1
