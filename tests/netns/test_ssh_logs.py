"""``lazarus logs --previous`` on ssh nodes (issue 39): two hosts (network namespaces,
an sshd each), the real dev server and worker, a standard-library job with one rank
per host whose rank 0 crashes in generation 1. The CLI reads each rank's log through
the node's agent over SSH (host keys checked), as an operator after the incident would."""

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
from tests import tiers
from tests.e2e.conftest import Job
from tests.logs_job import expected, job_lines, lazarus, logs_job
from tests.netns.conftest import HostsFactory, ssh_nodes
from workflows.state import Phase

StartJob = Callable[..., Awaitable[Job]]

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@tiers.twin_of(
    "test_slurm_logs.py::test_logs_previous_shows_the_crashed_generation_on_slurm_nodes",
    "over ssh: both read a node's log through the same shim verb",
)
@pytest.mark.timeout(240)
async def test_logs_previous_shows_the_crashed_generation_on_ssh_nodes(
    test_hosts: HostsFactory, start_job: StartJob, stack: LocalStack, tmp_path: Path
) -> None:
    hosts = test_hosts(2)
    name = f"logs-{uuid.uuid4().hex[:8]}"
    data = logs_job(
        tmp_path,
        name,
        sys.executable,
        nproc_per_node=1,
        nodes=ssh_nodes(hosts),
        ssh={"known_hosts": str(hosts.known_hosts), "connect_timeout_s": 2},
    )
    job = await start_job(parse_spec(data, "<test>").resolved(tmp_path))
    status = await job.result(timeout_s=200)
    assert status.phase == Phase.SUCCEEDED and status.generation == 2, status
    [incident] = status.incidents
    assert incident.kind == "crash" and incident.generation == 1 and incident.node == "h1"
    previous = await asyncio.to_thread(lazarus, stack, "logs", name, "--previous")
    assert previous.returncode == 0, previous.stderr
    assert job_lines(previous.stdout) == expected(1, 2)
    assert "crash of rank 0 (exit 3) on node h1" in previous.stderr
    as_json = await asyncio.to_thread(lazarus, stack, "logs", name, "--previous", "--json")
    assert as_json.returncode == 0, as_json.stderr
    documents = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert {(d["generation"], d["rank"], d["node"]) for d in documents} == {
        (1, 0, "h1"),
        (1, 1, "h2"),
    }
    current = await asyncio.to_thread(lazarus, stack, "logs", name, "--tail", "1")
    assert current.returncode == 0, current.stderr
    assert current.stdout.splitlines() == [
        "[rank 0] gen 2 rank 0 line 2",
        "[rank 1] gen 2 rank 1 line 2",
    ]
