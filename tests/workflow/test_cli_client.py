"""The CLI over ``JobClient`` against a real server: its messages and exit codes.

The CLI is presentation over the client; these pin what an operator sees for the
commands that talk to a job (start, status, list, incidents, pause, cancel,
checkpoints) and for the client's typed errors, each one line and exit code 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker
from typer.testing import CliRunner, Result

from lazarus.app import cli
from lazarus.app.client import JobClient, JobNotFound, StatusView
from lazarus.app.devserver import DevServer
from lazarus.app.outcome import Outcome
from lazarus.domain.contracts import AllocationGranted, SubmitAllocationRequest
from tests.workflow import fakes
from workers.controller import CLIENT_CALLS
from workflows.job import JobWorkflow
from workflows.state import Phase
from workflows.worker_call import WorkerCallWorkflow

pytestmark = pytest.mark.timeout(120)


class Cli:
    """``lazarus`` against the test server and a private task queue, run in a thread
    (the CLI runs its own event loop; the worker needs this one)."""

    def __init__(self, address: str, task_queue: str, jobs: JobClient) -> None:
        self.env: dict[str, str | None] = {
            "TEMPORAL_ADDRESS": address,
            "LAZARUS_TASK_QUEUE": task_queue,
        }
        self.jobs = jobs

    async def __call__(self, *args: str) -> Result:
        def invoke() -> Result:
            return CliRunner().invoke(cli.app, list(args), env=self.env)

        return await asyncio.to_thread(invoke)

    async def until(self, job: str, phase: Phase) -> StatusView:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while (view := await self.jobs.status(job)).phase != phase:
            if loop.time() > deadline:
                raise TimeoutError(f"{job} never reached {phase}: {view}")
            await asyncio.sleep(0.1)
        return view


@pytest.fixture
async def lazarus(dev_server: DevServer) -> AsyncIterator[Cli]:
    client = await Client.connect(dev_server.address, data_converter=pydantic_data_converter)
    task_queue = f"cli-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[JobWorkflow, WorkerCallWorkflow],
        activities=[*fakes.ACTIVITIES, *CLIENT_CALLS],  # start's checks: the real ones
    ):
        yield Cli(dev_server.address, task_queue, JobClient(client, task_queue=task_queue))


def _spec_file(tmp_path: Path) -> tuple[str, Path]:
    name = f"cli-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "job.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "command": ["python", "train.py"],
                "checkpoint_dir": "checkpoints/{job_id}",
                "run_dir": "runs",
                "health": {"poll_interval_s": 0.2, "supervisor_heartbeat_timeout_s": 5},
            }
        )
    )
    return name, path


async def test_cli_commands_over_the_client(lazarus: Cli, tmp_path: Path) -> None:
    name, spec_file = _spec_file(tmp_path)
    started = await lazarus("start", str(spec_file), "--json")
    assert started.exit_code == 0, started.output
    assert json.loads(started.stdout)["workflow_id"] == f"lazarus-{name}"
    await lazarus.until(name, Phase.RUNNING)

    again = await lazarus("start", str(spec_file))
    assert again.exit_code == 1
    assert again.stderr.strip() == (
        f"job '{name}' is already running (lazarus-{name}); "
        f"see 'lazarus status {name}', or start it under another --name"
    )
    shown = await lazarus("status", name, "--json")
    assert shown.exit_code == 0, shown.output
    body = json.loads(shown.stdout)
    assert body["phase"] == "RUNNING" and body["workflow_status"] == "RUNNING"
    listed = await lazarus("list", "--json")
    assert name in [row["job"] for row in json.loads(listed.stdout)]
    quiet = await lazarus("incidents", name)
    assert quiet.exit_code == 0 and f"job '{name}' has had no incidents" in quiet.stdout
    where = await lazarus("checkpoints", name, "--json")
    assert where.exit_code == 0, where.output
    assert json.loads(where.stdout) == []  # the job's own checkpoint dir, still empty

    paused = await lazarus("pause", name)
    assert paused.exit_code == 0 and f"asked job '{name}' to pause" in paused.stdout
    await lazarus.until(name, Phase.PAUSED)
    twice = await lazarus("pause", name)
    assert twice.exit_code == 1
    assert twice.stderr.strip() == (
        f"job '{name}' is PAUSED; pause applies only when it is "
        "PENDING or LAUNCHING or RUNNING or RECOVERING: nothing sent"
    )

    cancelled = await lazarus("cancel", name)
    assert cancelled.exit_code == 0
    assert f"cancelling job '{name}': its ranks are being stopped" in cancelled.stdout
    await lazarus.until(name, Phase.CANCELLED)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while (await lazarus.jobs.status(name)).execution_status == "RUNNING":
        assert loop.time() < deadline, "the cancelled job never closed"
        await asyncio.sleep(0.1)
    repeat = await lazarus("cancel", name)
    assert repeat.exit_code == 0
    assert f"job '{name}' is already closed (CANCELED); nothing to cancel" in repeat.stdout
    closed = await lazarus("drain", name, "local")
    assert closed.exit_code == 1
    assert closed.stderr.strip() == f"job '{name}' is already closed (CANCELED)"


async def test_cli_unknown_job_is_one_line(lazarus: Cli) -> None:
    for command in ("status", "cancel", "pause", "incidents"):
        result = await lazarus(command, "no-such-job")
        assert result.exit_code == Outcome.NO_SUCH_JOB.exit_code, result.output
        assert result.stderr.strip() == "no job named 'no-such-job'; see 'lazarus list'"
        assert "Traceback" not in result.output


FAKE_SBATCH = """#!/bin/sh
echo "sbatch $*" >> "$SBATCH_LOG"
case " $* " in
  *" --test-only "*) echo "sbatch: Job 1 to start at 2026-12-03T00:00:00" >&2; exit 0;;
esac
echo 999
"""


def _submit_spec_file(tmp_path: Path) -> tuple[str, Path, Path]:
    """A submit-mode spec, and a fake ``sbatch`` on PATH that logs every call."""
    name, path = _spec_file(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["slurm"] = {"nodes": 2, "partition": "gpu"}
    path.write_text(yaml.safe_dump(data))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(FAKE_SBATCH)
    sbatch.chmod(0o755)
    return name, path, bin_dir


async def test_start_in_submit_mode_leaves_the_submission_to_the_workflow(
    lazarus: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27: ``lazarus start`` asks Slurm only whether it would take the holder
    (``sbatch --test-only``); the allocation is the workflow's first step, so the CLI
    and ``JobClient.start`` start the same job."""
    name, spec_file, bin_dir = _submit_spec_file(tmp_path)
    log = tmp_path / "sbatch.log"
    monkeypatch.setitem(lazarus.env, "SBATCH_LOG", str(log))
    monkeypatch.setitem(lazarus.env, "PATH", f"{bin_dir}:{os.environ.get('PATH', '')}")
    fakes.script_for(name).allocations = [AllocationGranted(job_id=31, nodes=["n1", "n2"])]
    started = await lazarus("start", str(spec_file))
    assert started.exit_code == 0, started.output
    assert f"job {name} is PENDING: its first step submits the Slurm allocation" in (started.stdout)
    assert f"started job {name}" in started.stdout
    calls = log.read_text().splitlines()
    assert calls and all("--test-only" in call for call in calls), calls
    view = await lazarus.until(name, Phase.RUNNING)
    assert view.status is not None and view.status.slurm_job_id == 31
    (asked,) = fakes.script_for(name).allocation_requests
    assert isinstance(asked, SubmitAllocationRequest) and asked.token == "start"
    assert [n.name for n in fakes.script_for(name).launches[0].nodes] == ["n1", "n2"]


async def test_start_says_why_slurm_refused_the_first_allocation(
    lazarus: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, spec_file, bin_dir = _submit_spec_file(tmp_path)
    monkeypatch.setitem(lazarus.env, "SBATCH_LOG", str(tmp_path / "sbatch.log"))
    monkeypatch.setitem(lazarus.env, "PATH", f"{bin_dir}:{os.environ.get('PATH', '')}")
    started = await lazarus("start", str(spec_file))  # the fake Slurm grants nothing
    assert started.exit_code == 1, started.output
    assert f"job {name} failed: slurm: the allocation was not granted" in started.stderr
    assert "no nodes" in started.stderr
    assert fakes.script_for(name).launches == []


async def test_the_checks_run_on_the_worker_and_refuse_naming_the_field(
    lazarus: Cli, tmp_path: Path
) -> None:
    """Issue 40, part 2: the CLI runs no check itself. A program the worker cannot find
    is refused with exit code 2 naming ``command``, and no job exists; the dry run's
    plan and ``checkpoints --dir`` are the worker's answers too, each a call workflow
    (``lazarus-call-...``) that ``lazarus list`` does not show."""
    name, spec_file = _spec_file(tmp_path)
    text = spec_file.read_text().replace("python", "pyhton-lazarus-typo")
    spec_file.write_text(text)
    refused = await lazarus("start", str(spec_file))
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.strip().startswith(
        f"{spec_file}: command: program 'pyhton-lazarus-typo' not found on PATH"
    )
    with pytest.raises(JobNotFound):
        await lazarus.jobs.query(name)

    spec_file.write_text(text.replace("pyhton-lazarus-typo", "python"))
    planned = await lazarus("start", str(spec_file), "--dry-run", "--json")
    assert planned.exit_code == 0, planned.output
    plan = json.loads(planned.stdout)
    assert plan["workflow_id"] == f"lazarus-{name}" and plan["ranks"][0]["RANK"] == "0"
    assert plan["nodes"][0]["launcher"] == "local"
    with pytest.raises(JobNotFound):
        await lazarus.jobs.query(name)  # a dry run starts nothing

    listed = await lazarus("checkpoints", "--dir", str(tmp_path / "none"), "--json")
    assert listed.exit_code == 0 and json.loads(listed.stdout) == [], listed.output
    assert name not in [row.job for row in await lazarus.jobs.list()]


async def test_without_a_worker_a_start_is_refused(
    dev_server: DevServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After :data:`~lazarus.app.worker_client.WORKER_WAIT_S` (30 s; 1 s here) for a
    worker's first poll, nothing checked and nothing started."""
    from lazarus.app import worker_client

    monkeypatch.setattr(worker_client, "WORKER_WAIT_S", 1.0)
    _, spec_file = _spec_file(tmp_path)
    env = {"TEMPORAL_ADDRESS": dev_server.address, "LAZARUS_TASK_QUEUE": "nobody-polls-this"}
    result = await asyncio.to_thread(
        CliRunner().invoke, cli.app, ["start", str(spec_file)], env=env
    )
    assert result.exit_code == 1, result.output
    assert "no worker polls task queue 'nobody-polls-this'" in result.stderr


async def test_a_log_is_read_by_the_worker_byte_for_byte(lazarus: Cli, tmp_path: Path) -> None:
    """``lazarus logs`` of a node the CLI cannot read itself: the worker's agent reads it
    by offset (``activities/node_logs.py``), and bytes that are not UTF-8 cross the call
    workflow unchanged (base64 in JSON). A local node's agent stands in for ssh's."""
    from lazarus.domain.spec import NodeSpec, SSHSpec
    from lazarus.domain.worker_calls import RanksEndedRequest, ReadLogRequest

    gen = tmp_path / "gen-00001"
    gen.mkdir()
    data = b"caf\xe9 \xff\x00 line\n" * 3
    (gen / "rank-0.log").write_bytes(data)
    on_node = {"node": NodeSpec(), "ssh": SSHSpec(), "gen_dir": str(gen)}
    got = await lazarus.jobs.read_log(ReadLogRequest(**on_node, rank=0, offset=4, max_bytes=8))
    assert (got.data, got.size, got.error) == (data[4:12], len(data), None)
    absent = await lazarus.jobs.read_log(ReadLogRequest(**on_node, rank=1, max_bytes=8))
    assert absent.size is None and absent.error is None
    ended = await lazarus.jobs.ranks_ended(RanksEndedRequest(**on_node, ranks=[0]))
    assert ended.error is None and ended.ended is False  # no exit record, no pid: not yet
