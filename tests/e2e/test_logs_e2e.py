"""``lazarus logs`` after an incident, on local nodes (issue 39): the real dev server,
a real worker, a two-rank standard-library job whose rank 0 crashes in generation 1;
``--previous`` shows that generation's lines, ``--generation`` and ``--json`` too."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from lazarus.app.local_stack import LocalStack
from lazarus.domain.spec import parse_spec
from tests.e2e.conftest import Job
from tests.logs_job import expected, job_lines, lazarus, logs_job
from workflows.state import Phase

StartJob = Callable[..., Awaitable[Job]]

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.timeout(180)
async def test_logs_previous_shows_the_crashed_generation_on_local_nodes(
    start_job: StartJob, stack: LocalStack, tmp_path: Path
) -> None:
    name = f"logs-{uuid.uuid4().hex[:8]}"
    spec = parse_spec(logs_job(tmp_path, name, sys.executable), "<test>").resolved(tmp_path)
    job = await start_job(spec)
    status = await job.result(timeout_s=150)
    assert status.phase == Phase.SUCCEEDED and status.generation == 2, status
    [incident] = status.incidents
    assert incident.kind == "crash" and incident.generation == 1 and incident.rank == 0
    previous = await asyncio.to_thread(lazarus, stack, "logs", name, "--previous")
    assert previous.returncode == 0, previous.stderr
    assert job_lines(previous.stdout) == expected(1, 2)
    assert "generation 1" in previous.stderr and "crash of rank 0 (exit 3)" in previous.stderr
    current = await asyncio.to_thread(lazarus, stack, "logs", name)
    assert current.returncode == 0 and job_lines(current.stdout) == expected(2, 2)
    named = await asyncio.to_thread(
        lazarus, stack, "logs", name, "--generation", "1", "--rank", "0", "--json"
    )
    assert named.returncode == 0, named.stderr
    documents = [json.loads(line) for line in named.stdout.splitlines()]
    assert [d["line"] for d in documents] == [
        line.removeprefix("[rank 0] ") for line in expected(1, 2) if line.startswith("[rank 0]")
    ]
    assert {(d["generation"], d["rank"], d["node"], d["time"]) for d in documents} == {
        (1, 0, "local", None)
    }
    beyond = await asyncio.to_thread(lazarus, stack, "logs", name, "--generation", "3")
    assert beyond.returncode == 2 and "generations 1 to 2" in beyond.stderr
