"""A hang's incident names the collective and the rank that never joined it (issue 38).

Two real ranks over gloo (``lazarus.rank.torch.init_process_group``, so the flight
recorder is on and the watcher answers), five all-reduces, then rank 0 enters a sixth
that rank 1 never joins: rank 1 sleeps in Python (its watcher answers: it is *behind*),
or is SIGSTOPped (it cannot answer: *no dump*). The supervisor reports the hang at
``hang_timeout_s`` (the fixed clock: the budget is not what is tested here), and the
incident's evidence carries the recorder's reading before the stop.
"""

from __future__ import annotations

import asyncio
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

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SCRIPT = """
import os, signal, sys, time
import torch, torch.distributed as dist
import lazarus.rank as lz
import lazarus.rank.torch as lt
lt.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
for step in range(1, 6):
    dist.all_reduce(t)
    lz.heartbeat(step)
    time.sleep(0.2)
if rank == 1:
    if sys.argv[1] == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(3600)  # never joins the next collective
dist.all_reduce(t)  # rank 0 waits here for rank 1
"""


def _spec(tmp_path: Path, how: str) -> JobSpec:
    return parse_spec(
        {
            "name": f"flight-{how}",
            "command": [sys.executable, "-c", SCRIPT, how],
            "nproc_per_node": 2,
            "health": {
                "startup_timeout_s": 120.0,
                "hang_timeout_s": 4.0,
                "poll_interval_s": 0.2,
                "hang_budget": {"mode": "off"},
            },
        },
        "<test>",
    ).resolved(tmp_path)


@pytest.fixture
def jobs() -> Iterator[list[JobSpec]]:
    started: list[JobSpec] = []
    yield started
    for spec in started:
        root = Path(spec.run_dir) / spec.job_id
        asyncio.run(
            stop_generations(StopRequest(job_id=spec.job_id, run_root=str(root), grace_s=0))
        )
        assert chaos.live_rank_processes(root) == []


def _hang_evidence(spec: JobSpec) -> list[str]:
    from activities.supervise import supervise

    launched = launch_generation(LaunchRequest(spec=spec, generation=1))
    request = SuperviseRequest(
        job_id=spec.job_id,
        generation=1,
        run_dir=launched.run_dir,
        world_size=spec.world_size,
        nproc_per_node=spec.nproc_per_node,
        health=spec.health,
        report_after_s=150.0,
    )
    outcome = asyncio.run(ActivityEnvironment().run(supervise, request))
    assert outcome.failure is not None and outcome.failure.kind == "hang", outcome
    return outcome.failure.evidence


def _recorder_line(evidence: list[str]) -> str:
    found = [line for line in evidence if line.startswith("flight recorder, group ")]
    assert found, evidence
    return found[0]


def test_a_rank_that_never_joins_the_collective_is_named(
    tmp_path: Path, jobs: list[JobSpec]
) -> None:
    spec = _spec(tmp_path, "sleep")
    jobs.append(spec)
    line = _recorder_line(_hang_evidence(spec))
    # Five all-reduces done by both; rank 0 entered the sixth, rank 1 never did.
    assert "gloo:all_reduce #6" in line and "entered by rank 0" in line, line
    assert "never joined by rank 1 (last #5)" in line, line
    print(line)


def test_a_stopped_rank_gives_no_dump_and_is_named(tmp_path: Path, jobs: list[JobSpec]) -> None:
    spec = _spec(tmp_path, "stop")
    jobs.append(spec)
    line = _recorder_line(_hang_evidence(spec))
    assert "gloo:all_reduce #6" in line and "entered by rank 0" in line, line
    assert "no dump from rank 1 (stopped" in line, line
    print(line)
