"""A hung rank under the learned hang budget, end to end (issue 38): the example DDP
job with ``health.hang_budget: {mode: learned}``, SIGSTOP on rank 0 once the budget is
learned; the job is back with correct weights, the stopped rank named in well under
``hang_timeout_s``, and the incident says what the silence was judged against."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from temporalio.client import Client

from infra import chaos
from lazarus.app.client import JobClient
from lazarus.rank.rank_stacks import py_spy
from tests.e2e.conftest import Job, assert_same_weights, ddp_spec
from tests.reference_weights import shared_reference
from workflows.state import Phase

StartJob = Callable[..., Awaitable[Job]]
LONG_STEPS = 300
"""15 s of 0.05 s steps: room to learn the budget on a loaded machine, and to hang after."""


async def wait_for_learned_budget(jobs: JobClient, name: str, timeout_s: float = 60) -> None:
    """Until ``lazarus status``'s live view shows a learned hang budget."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        live = (await jobs.status(name)).live
        if (
            live is not None
            and live.hang_budget is not None
            and live.hang_budget.source == "learned"
        ):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"no learned hang budget within {timeout_s:g} s")


@pytest.mark.timeout(180)
async def test_a_hang_is_found_within_the_learned_budget(
    start_job: StartJob, client: Client, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    spec = ddp_spec(tmp_path, steps=LONG_STEPS, health={"hang_budget": {"mode": "learned"}})
    job = await start_job(spec)
    # 0.05 s steps, a heartbeat every 0.2 s: step 45 is ~11 writes a rank in, past the
    # warm-up and min_intervals (10, pooled) on a quiet machine. A loaded one may take
    # longer to learn (its slow first steps are left out), so the rank is stopped once
    # the live supervisor says the budget is learned; LONG_STEPS leaves it the time.
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 45)
    await wait_for_learned_budget(JobClient(client), spec.name)
    chaos.signal_rank(job.run_root, rank=0, sig=signal.SIGSTOP)
    status = await job.result()
    assert status.phase == Phase.SUCCEEDED
    [incident] = status.incidents
    assert incident.kind == "hang" and incident.rank == 0, incident.evidence
    hang_timeout = spec.health.hang_timeout_s
    assert incident.detection_s < hang_timeout / 3, incident.evidence
    assert "hang budget" in incident.evidence[0] and "learned" in incident.evidence[0]
    if py_spy() is not None:
        assert incident.evidence[1].startswith("rank 0 (pid "), incident.evidence
    assert_same_weights(job.weights, shared_reference(tmp_path_factory, LONG_STEPS))
