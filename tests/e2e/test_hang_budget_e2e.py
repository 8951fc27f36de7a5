"""A hung rank under the learned hang budget, end to end (issue 38): the example DDP
job with ``health.hang_budget: {mode: learned}``, SIGSTOP on rank 0 once the budget is
learned; the job is back with correct weights, the stopped rank named in well under
``hang_timeout_s``, and the incident says what the silence was judged against."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from infra import chaos
from lazarus.rank.rank_stacks import py_spy
from tests.e2e.conftest import STEPS, Job, assert_same_weights, ddp_spec
from workflows.state import Phase

StartJob = Callable[..., Awaitable[Job]]


@pytest.mark.timeout(180)
async def test_a_hang_is_found_within_the_learned_budget(
    start_job: StartJob, tmp_path: Path, fault_free_weights: Path
) -> None:
    spec = ddp_spec(tmp_path, steps=STEPS, health={"hang_budget": {"mode": "learned"}})
    job = await start_job(spec)
    # 0.05 s steps, a heartbeat every 0.2 s: step 45 is ~11 writes a rank in, past the
    # warm-up and min_intervals (10, pooled).
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 45)
    chaos.signal_rank(job.run_root, rank=0, sig=signal.SIGSTOP)
    status = await job.result()
    assert status.phase == Phase.SUCCEEDED
    [incident] = status.incidents
    assert incident.kind == "hang" and incident.rank == 0, incident.evidence
    assert_same_weights(job.weights, fault_free_weights)
    if "hang budget" not in incident.evidence[0]:
        # A loaded machine's slow warm-up (left out of the learning) can leave the
        # budget still learning at step 45, so hang_timeout_s judged: recovered and
        # named, as checked above, but not what this test is about.
        pytest.skip(f"the budget was still learning at the SIGSTOP: {incident.evidence[0]}")
    hang_timeout = spec.health.hang_timeout_s
    assert incident.detection_s < hang_timeout / 3, incident.evidence
    assert "hang budget" in incident.evidence[0] and "learned" in incident.evidence[0]
    if py_spy() is not None:
        assert incident.evidence[1].startswith("rank 0 (pid "), incident.evidence
    assert_same_weights(job.weights, fault_free_weights)
