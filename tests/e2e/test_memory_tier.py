"""The memory checkpoint tier, end to end: a crash costs a step or two, not a disk interval.

A real 2-rank DDP job with ``memory_every_steps: 1`` and a disk interval of 20 has a
rank SIGKILLed past step 25: the relaunch must resume from the memory tier (a step
newer than disk's 20, at most two behind the crash) and end with the weights of a
fault-free run.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from infra import chaos
from lazarus.domain.memory_tier import MEMORY_ROOT, on_node
from tests.e2e.conftest import STEPS, Job, assert_same_weights, ddp_spec
from workflows.state import Phase

StartJob = Callable[..., Awaitable[Job]]
STEP_LINE = re.compile(rb"^step (\d+) loss", re.MULTILINE)


@pytest.fixture
def job_name() -> Iterator[str]:
    """Set up before ``start_job`` (first in the test's arguments), so its teardown
    runs after every rank is stopped: then the run's tmpfs snapshots are removed."""
    name = f"mem-{uuid.uuid4().hex[:8]}"
    yield name
    shutil.rmtree(Path(on_node(MEMORY_ROOT, os.getuid())) / name, ignore_errors=True)


def last_step_logged(job: Job, generation: int) -> int:
    gen = job.run_root.glob(f"*/gen-{generation:05d}")
    steps = [
        int(m)
        for g in gen
        for log in g.glob("rank-*.log")
        for m in STEP_LINE.findall(log.read_bytes())
    ]
    return max(steps, default=0)


@pytest.mark.timeout(240)
async def test_a_crash_resumes_from_the_memory_tier_losing_at_most_two_steps(
    job_name: str, start_job: StartJob, tmp_path: Path, fault_free_weights: Path
) -> None:
    spec = ddp_spec(
        tmp_path,
        name=job_name,
        steps=STEPS,
        checkpoints={"memory_every_steps": 1, "every_steps": 20},
    )
    job = await start_job(spec)
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 25)
    chaos.signal_rank(job.run_root, rank=1, sig=signal.SIGKILL)
    status = await job.result()

    assert status.phase == Phase.SUCCEEDED
    assert status.generation == 2
    [incident] = status.incidents
    assert incident.kind == "crash" and incident.rank == 1
    resumed = incident.resumed_from_step
    assert resumed is not None and resumed > 20, "the memory tier, not disk step 20"
    crashed_at = last_step_logged(job, 1)
    assert crashed_at - resumed <= 2, (crashed_at, resumed)
    assert incident.steps_lost is not None and incident.steps_lost <= 2
    assert_same_weights(job.weights, fault_free_weights)
