"""``lazarus logs --previous`` on Slurm nodes (issue 39): the session's real Slurm
(n1, n2 on this host), the real dev server and worker, a standard-library job with one
rank per node, each generation a job step in the holder allocation, whose rank 0
crashes in generation 1. The CLI reads the logs through the nodes' Slurm agents."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path

import pytest

from infra.slurm import TestSlurm
from lazarus.app.devserver import DevServer
from lazarus.domain.spec import parse_spec
from tests.logs_job import expected, job_lines, lazarus, logs_job
from tests.slurm.test_slurm_e2e import HOST, harness
from workflows.state import Phase

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.timeout(400)
async def test_logs_previous_shows_the_crashed_generation_on_slurm_nodes(
    slurm: TestSlurm, allocation: int, dev_server: DevServer, tmp_path: Path
) -> None:
    name = f"logs-{uuid.uuid4().hex[:8]}"
    data = logs_job(
        tmp_path,
        name,
        sys.executable,
        nproc_per_node=1,
        nodes=[{"name": n, "launcher": "slurm", "host": HOST} for n in ("n1", "n2")],
        slurm={"job_id": allocation},
    )
    data["health"] = {**data["health"], "startup_timeout_s": 120}
    async with harness(dev_server, tmp_path, slurm) as h:
        job = await h.start(parse_spec(data, "<test>").resolved(tmp_path))
        status = await job.result(timeout_s=300)
        assert status.phase == Phase.SUCCEEDED and status.generation == 2, status
        [incident] = status.incidents
        assert incident.kind == "crash" and incident.generation == 1 and incident.rank == 0
        previous = await asyncio.to_thread(lazarus, h.stack, "logs", name, "--previous")
        assert previous.returncode == 0, previous.stderr
        assert job_lines(previous.stdout) == expected(1, 2)
        assert "crash of rank 0 (exit 3)" in previous.stderr
        as_json = await asyncio.to_thread(lazarus, h.stack, "logs", name, "--previous", "--json")
        assert as_json.returncode == 0, as_json.stderr
        documents = [json.loads(line) for line in as_json.stdout.splitlines()]
        assert {(d["generation"], d["rank"], d["node"]) for d in documents} == {
            (1, 0, "n1"),
            (1, 1, "n2"),
        }
        followed = await asyncio.to_thread(lazarus, h.stack, "logs", name, "-f", "--rank", "1")
        assert followed.returncode == 0, followed.stderr  # ended: printed, then the end
        assert followed.stdout.splitlines() == [f"gen 2 rank 1 line {i}" for i in range(3)]
