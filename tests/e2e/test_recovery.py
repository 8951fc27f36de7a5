"""The core promise, end to end: a real 2-rank DDP job survives faults with correct weights."""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from infra import chaos
from tests.e2e.conftest import STEPS, Job, assert_same_weights, ddp_spec
from workflows.state import Phase

StartJob = Callable[..., Awaitable[Job]]


@pytest.mark.timeout(180)
async def test_fault_free_run_matches_reference(
    start_job: StartJob, tmp_path: Path, fault_free_weights: Path
) -> None:
    job = await start_job(ddp_spec(tmp_path, steps=STEPS))
    status = await job.result()
    assert status.phase == Phase.SUCCEEDED
    assert status.generation == 1 and status.incidents == []
    assert status.step == STEPS
    assert_same_weights(job.weights, fault_free_weights)


@pytest.mark.timeout(180)
async def test_rank_crash_recovers_with_identical_weights(
    start_job: StartJob, tmp_path: Path, fault_free_weights: Path
) -> None:
    job = await start_job(ddp_spec(tmp_path, steps=STEPS))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 25)
    fault = chaos.signal_rank(job.run_root, rank=1, sig=signal.SIGKILL)
    status = await job.result()
    assert status.phase == Phase.SUCCEEDED
    assert status.generation == 2
    [incident] = status.incidents
    assert incident.rank == 1 and incident.kind == "crash" and incident.signal == "SIGKILL"
    assert incident.recovery_s is not None
    assert incident.resumed_from_step == 20
    phases = [
        incident.fault_at,
        incident.detected_at,
        incident.stopped_at,
        incident.relaunched_at,
        incident.first_step_at,
    ]
    assert None not in phases and phases == sorted(phases), f"phase times out of order: {phases}"
    assert status.mttr_s == incident.recovery_s and status.steps_lost == incident.steps_lost
    assert incident.steps_lost is not None and incident.steps_lost >= (fault.step or 0) - 20
    assert_same_weights(job.weights, fault_free_weights)


@pytest.mark.timeout(180)
async def test_hang_is_detected_named_and_recovered(
    start_job: StartJob, tmp_path: Path, fault_free_weights: Path
) -> None:
    job = await start_job(ddp_spec(tmp_path, steps=STEPS))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 25)
    chaos.signal_rank(job.run_root, rank=0, sig=signal.SIGSTOP)
    status = await job.result()
    assert status.phase == Phase.SUCCEEDED
    [incident] = status.incidents
    assert incident.kind == "hang" and incident.failure_class == "hang"
    assert incident.rank == 0, "the SIGSTOPped rank must be named, not its blocked peer"
    # Judged against the budget it spent: the learned one once the job's rhythm is
    # known (step 25 usually is, a loaded machine's late start may not be), else the
    # configured timeout.
    learned = re.search(r"hang budget ([0-9.]+) s", " ".join(incident.evidence))
    budget = float(learned[1]) if learned else job.spec.health.hang_timeout_s
    assert budget <= incident.detection_s < budget + 4
    assert_same_weights(job.weights, fault_free_weights)
