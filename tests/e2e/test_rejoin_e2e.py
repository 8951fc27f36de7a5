"""Rejoin in place, end to end (issue 16): the real 2-rank DDP example over gloo in its
``--resilient`` mode, a real worker, a real dev server.

- A SIGKILLed rank: the surviving rank keeps its pid, only the killed rank starts again,
  and the weights equal a fault-free run's; with continue-as-new every few events, so
  the job also hops runs while survivors wait and rejoin.
- A SIGSTOPped rank: a hang, which restarts the whole generation.
- A survivor that never rejoins (frozen as its peer dies): supervision reports it after
  ``rejoin.timeout_s`` and the whole generation restarts.
- The worker SIGKILLed during the rejoin: no duplicate rank, the job completes.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from activities.nodes.rundir import GenerationDir, read_json
from infra import chaos
from lazarus.app.local_stack import LocalStack
from lazarus.domain.spec import JobSpec
from tests.e2e.conftest import STEPS, Job, assert_same_weights, ddp_spec, rank_census
from workflows.state import Phase

StartJob = Callable[..., Awaitable[Job]]
REJOIN_S = 20
REJOINED = re.compile(rb"rank 0 rejoined generation (\d+)")


def resilient_spec(tmp_path: Path, **overrides: object) -> JobSpec:
    overrides.setdefault("rejoin", {"enabled": True, "timeout_s": REJOIN_S})
    spec = ddp_spec(tmp_path, steps=STEPS, step_time=0.1, **overrides)
    return spec.model_copy(update={"command": [*spec.command, "--resilient"]})


def generation_pid(job: Job, generation: int, rank: int) -> int:
    [gen] = [
        GenerationDir.of(path.parent, generation)
        for path in job.run_root.glob(f"*/gen-{generation:05d}")
    ]
    record = read_json(gen.pid_file(rank))
    assert record is not None, f"no pid file for rank {rank} in generation {generation}"
    return int(record["pid"])


@pytest.mark.timeout(300)
async def test_a_killed_rank_is_replaced_and_the_survivor_keeps_its_process(
    start_job: StartJob, tmp_path: Path, fault_free_weights: Path
) -> None:
    job = await start_job(resilient_spec(tmp_path), continue_as_new_after_events=25)
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 20)
    survivor = generation_pid(job, 1, 0)
    with rank_census(job) as counts:
        chaos.signal_rank(job.run_root, rank=1, sig=signal.SIGKILL)
        status = await job.result(timeout_s=240)

    assert status.phase == Phase.SUCCEEDED
    assert status.generation == 2
    [incident] = status.incidents
    assert incident.kind == "crash" and incident.rank == 1
    assert incident.restart_path == "rejoin", incident.evidence
    assert generation_pid(job, 2, 0) == survivor, "rank 0 kept its process"
    assert generation_pid(job, 2, 1) != generation_pid(job, 1, 1)
    assert any(f"carried rank 0 (pid {survivor})" in e for e in incident.evidence)
    assert incident.timeline is not None
    assert incident.timeline.rejoin_received_at is not None
    assert max(counts) <= job.spec.world_size
    assert status.runs > 1, "continue-as-new happened around the rejoin"
    log = next(job.run_root.glob("*/gen-00001/rank-0.log")).read_bytes()
    assert [int(g) for g in REJOINED.findall(log)] == [2]
    assert_same_weights(job.weights, fault_free_weights)


@pytest.mark.timeout(300)
async def test_a_stopped_rank_restarts_the_whole_generation(
    start_job: StartJob, tmp_path: Path, fault_free_weights: Path
) -> None:
    job = await start_job(resilient_spec(tmp_path))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 20)
    survivor = generation_pid(job, 1, 0)
    chaos.signal_rank(job.run_root, rank=1, sig=signal.SIGSTOP)
    status = await job.result(timeout_s=240)

    assert status.phase == Phase.SUCCEEDED
    incident = status.incidents[0]
    assert incident.kind == "hang" and incident.restart_path == "whole_generation"
    assert generation_pid(job, 2, 0) != survivor
    assert_same_weights(job.weights, fault_free_weights)


@pytest.mark.timeout(300)
async def test_a_survivor_that_never_rejoins_is_replaced(
    start_job: StartJob, tmp_path: Path, fault_free_weights: Path
) -> None:
    job = await start_job(resilient_spec(tmp_path))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 20)
    chaos.signal_rank(job.run_root, rank=0, sig=signal.SIGSTOP)
    chaos.signal_rank(job.run_root, rank=1, sig=signal.SIGKILL)
    status = await job.result(timeout_s=240)

    assert status.phase == Phase.SUCCEEDED
    crash, never = status.incidents[:2]
    assert crash.kind == "crash" and crash.restart_path == "rejoin"
    assert never.kind == "hang" and never.rank == 0, never.evidence
    assert any("did not rejoin" in e for e in never.evidence), never.evidence
    assert never.restart_path == "whole_generation"
    assert_same_weights(job.weights, fault_free_weights)


@pytest.mark.timeout(300)
async def test_the_worker_killed_during_the_rejoin_duplicates_nothing(
    start_job: StartJob, stack: LocalStack, tmp_path: Path, fault_free_weights: Path
) -> None:
    # The survivor waits rejoin.timeout_s for its request: longer than the controller
    # can be away here, on a loaded machine (a new worker process imports for seconds).
    job = await start_job(resilient_spec(tmp_path, rejoin={"enabled": True, "timeout_s": 120}))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 20)
    survivor = generation_pid(job, 1, 0)
    with rank_census(job) as counts:
        chaos.signal_rank(job.run_root, rank=1, sig=signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not (await job.status()).incidents:  # the recovery has begun
            assert time.monotonic() < deadline, "the crash was not noticed"
            await asyncio.sleep(0.05)
        stack.kill_worker(signal.SIGKILL)
        await asyncio.sleep(2.0)
        stack.start_worker()
        status = await job.result(timeout_s=240)

    assert status.phase == Phase.SUCCEEDED
    assert max(counts) <= job.spec.world_size, counts
    assert status.generation == 2 and len(status.incidents) == 1
    assert status.incidents[0].restart_path == "rejoin", status.incidents[0].evidence
    assert generation_pid(job, 2, 0) == survivor
    assert_same_weights(job.weights, fault_free_weights)
