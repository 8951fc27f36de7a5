"""The supervise activity against real rank processes (issue 10, defects 15 and 17).

A plain script that never heartbeats and has no ``progress_regex`` runs past
``startup_timeout_s`` without being called hung; killing it with SIGKILL is still
detected, and, with no OOM record for its pid, classified ``killed``.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.launcher import launch_generation
from activities.stop import stop_generations
from infra import chaos
from lazarus.domain.contracts import LaunchRequest, StopRequest, SuperviseRequest
from lazarus.domain.spec import JobSpec, parse_spec

PLAIN_SCRIPT = "import time\nprint('training without lazarus.rank', flush=True)\ntime.sleep(120)\n"
STARTUP_S = 2.0


@pytest.fixture
def plain_job(tmp_path: Path) -> Iterator[JobSpec]:
    spec = parse_spec(
        {
            "name": "plain",
            "command": [sys.executable, "-c", PLAIN_SCRIPT],
            "nproc_per_node": 2,
            "health": {
                "startup_timeout_s": STARTUP_S,
                "hang_timeout_s": 2.0,
                "poll_interval_s": 0.1,
            },
        },
        "<test>",
    ).resolved(tmp_path)
    yield spec
    asyncio.run(
        stop_generations(
            StopRequest(job_id=spec.job_id, run_root=str(Path(spec.run_dir) / "plain"), grace_s=0)
        )
    )
    assert chaos.live_rank_processes(Path(spec.run_dir) / "plain") == []


def _supervise_request(spec: JobSpec, run_dir: str, report_after_s: float) -> SuperviseRequest:
    return SuperviseRequest(
        job_id=spec.job_id,
        generation=1,
        run_dir=run_dir,
        world_size=spec.world_size,
        nproc_per_node=spec.nproc_per_node,
        health=spec.health,
        report_after_s=report_after_s,
    )


@pytest.mark.timeout(120)
def test_a_plain_script_is_not_hung_after_the_startup_timeout_and_crashes_are_seen(
    plain_job: JobSpec,
) -> None:
    from activities.supervise import supervise

    launched = launch_generation(LaunchRequest(spec=plain_job, generation=1))
    env = ActivityEnvironment()
    # Report after twice the startup timeout: the old rule called it a hang at 2 s.
    request = _supervise_request(plain_job, launched.run_dir, report_after_s=2 * STARTUP_S + 1)
    outcome = asyncio.run(env.run(supervise, request))
    assert outcome.kind == "progress", outcome.failure
    assert outcome.progress_signal == "none"
    assert all(r.alive for r in outcome.ranks)

    chaos.signal_rank(Path(plain_job.run_dir) / "plain", rank=1, sig=signal.SIGKILL)
    outcome = asyncio.run(env.run(supervise, request))
    assert outcome.kind == "failed" and outcome.failure is not None
    failure = outcome.failure
    assert failure.kind == "crash" and failure.rank == 1 and failure.signal == "SIGKILL"
    # No OOM happened: whatever the kernel log and cgroup hold, nothing names this pid.
    assert failure.failure_class == "killed", failure.evidence
