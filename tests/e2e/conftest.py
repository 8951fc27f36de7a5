"""End-to-end fixtures: one real dev server per session, a real worker process per test.

Each test gets its own task queue and run directories, so a worker killed by one
test cannot pick up another test's work. Teardown always cancels the job and
SIGKILLs every rank of every generation, whatever the test did.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Replayer

from activities.stop import stop_generations
from infra import chaos
from infra.reference_run import weights_match
from lazarus.app.devserver import DevServer
from lazarus.app.local_stack import LocalStack
from lazarus.domain.api import QUERY_STATUS, WORKFLOW_TYPE, workflow_id_for
from lazarus.domain.contracts import StopRequest
from lazarus.domain.spec import JobSpec, parse_spec
from tests.reference_weights import shared_reference
from workflows.job import JobWorkflow
from workflows.state import JobInput, JobStatus, Phase

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_ddp.py"

pytestmark = pytest.mark.e2e


@pytest.fixture
def stack(dev_server: DevServer, tmp_path: Path) -> Iterator[LocalStack]:
    stack = LocalStack(
        tmp_path / "stack", task_queue=f"tq-{uuid.uuid4().hex[:8]}", server=dev_server
    )
    stack.start()
    try:
        yield stack
    finally:
        stack.kill_worker(signal.SIGKILL)


@pytest.fixture
async def client(stack: LocalStack) -> Client:
    return await stack.client()


def ddp_spec(
    tmp_path: Path,
    name: str | None = None,
    steps: int = 60,
    step_time: float = 0.05,
    ckpt_every: int = 10,
    **overrides: object,
) -> JobSpec:
    """The example DDP job, with every path inside the test's tmp dir.

    It runs in the recommended setup, warm (``warm_start``: one zygote per node
    imports torch once and forks every generation's ranks), which is also what keeps
    the suite inside its time: a cold rank spends about 3 s of CPU importing torch
    and ``torch._dynamo`` (DDP imports it), four times per one-crash test. Pass
    ``warm_start=None`` for a cold launch; the cold path and its fallbacks have tests
    of their own (``test_warm_start.py``, ``tests/integration/test_launcher.py``)."""
    name = name or f"job-{uuid.uuid4().hex[:8]}"
    data: dict[str, object] = {
        "name": name,
        "command": [
            "python",
            str(EXAMPLE),
            "--steps",
            str(steps),
            "--step-time",
            str(step_time),
            "--ckpt-every",
            str(ckpt_every),
            "--out",
            str(tmp_path / "out" / "model.pt"),
        ],
        "workdir": str(tmp_path),
        "nproc_per_node": 2,
        "checkpoint_dir": str(tmp_path / "checkpoints"),
        "run_dir": str(tmp_path / "runs"),
        "health": {
            "hang_timeout_s": 15,  # a loaded 2-core CI machine stalls a step for seconds
            "startup_timeout_s": 60,
            "poll_interval_s": 0.2,
            "supervisor_heartbeat_timeout_s": 4,
        },
        "recovery": {
            "max_restarts": 5,
            "backoff_initial_s": 0.2,
            "backoff_max_s": 2,
            "stop_grace_s": 3,
        },
        "warm_start": {"preload": ["torch"]},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}  # type: ignore[dict-item]
        else:
            data[key] = value
    return parse_spec(data, "<test>").resolved(tmp_path)


def run_root(spec: JobSpec) -> Path:
    return Path(spec.run_dir) / spec.job_id


async def replay_and_record(handle: WorkflowHandle[object, object]) -> None:
    """Replay every finished job's history against the current code (catches
    non-determinism), and keep it as a fixture when LAZARUS_RECORD_HISTORIES is set."""
    history = await handle.fetch_history()
    replayer = Replayer(workflows=[JobWorkflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
    record_dir = os.environ.get("LAZARUS_RECORD_HISTORIES")
    if record_dir:
        test = os.environ.get("PYTEST_CURRENT_TEST", history.workflow_id)
        name = test.split("::")[-1].split(" ")[0].removeprefix("test_")
        target = Path(record_dir) / f"{name}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(history.to_json())


class Job:
    """A started job and the handful of things tests do to it."""

    def __init__(self, spec: JobSpec, handle: WorkflowHandle[object, object]) -> None:
        self.spec = spec
        self.handle = handle
        self.run_root = run_root(spec)
        self.weights = Path(spec.workdir) / "out" / "model.pt"

    async def status(self) -> JobStatus:
        return await self.handle.query(QUERY_STATUS, result_type=JobStatus)

    async def wait_phase(self, *phases: Phase, timeout_s: float = 120.0) -> JobStatus:
        deadline = asyncio.get_running_loop().time() + timeout_s
        last: JobStatus | None = None
        while asyncio.get_running_loop().time() < deadline:
            try:
                last = await self.status()
            except RPCError:
                await asyncio.sleep(0.5)  # server restarting, or no worker to answer yet
                continue
            if last.phase in phases:
                return last
            await asyncio.sleep(0.2)
        raise TimeoutError(f"job never reached {phases}; last status: {last}")

    async def result(self, timeout_s: float = 180.0) -> JobStatus:
        status: JobStatus = await asyncio.wait_for(self.handle.result(), timeout_s)  # type: ignore[assignment]
        await replay_and_record(self.handle)
        return status


@pytest.fixture
async def start_job(client: Client, stack: LocalStack) -> AsyncIterator[object]:
    started: list[Job] = []

    async def start(spec: JobSpec, **input_overrides: object) -> Job:
        handle = await client.start_workflow(
            WORKFLOW_TYPE,
            JobInput(spec=spec, **input_overrides),  # type: ignore[arg-type]
            id=workflow_id_for(spec.name),
            task_queue=stack.task_queue,
            result_type=JobStatus,
        )
        job = Job(spec, handle)  # type: ignore[arg-type]
        started.append(job)
        return job

    yield start
    # A terminated workflow runs no cleanup of its own: stop the ranks and, since the
    # jobs run warm, each run's zygote and memory tier (end_of_run), as cancel would.
    for job in started:
        with contextlib.suppress(RPCError):
            await job.handle.terminate("test teardown")
        await stop_generations(
            StopRequest(
                job_id=job.spec.job_id, run_root=str(job.run_root), grace_s=0, end_of_run=True
            )
        )


T = TypeVar("T")

STEPS = 60
"""Every weight-checking test runs this many steps, so one reference serves them all."""


@pytest.fixture(scope="session")
def fault_free_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the same job run straight through by plain subprocesses, no Lazarus."""
    return shared_reference(tmp_path_factory, STEPS)


def assert_same_weights(actual: Path, expected: Path) -> None:
    assert weights_match(actual, expected), f"{actual} differs from the fault-free run {expected}"


@contextmanager
def sampled(probe: Callable[[], T]) -> Iterator[list[T]]:
    """Call ``probe`` every 50 ms in the background while the block runs, keeping
    each answer."""
    answers: list[T] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            answers.append(probe())
            time.sleep(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield answers
    finally:
        done.set()
        thread.join()


@contextmanager
def rank_census(job: Job) -> Iterator[list[int]]:
    """Sample how many rank processes are alive, every 50 ms, in the background,
    while the block runs (a carried-over rank counts once)."""
    with sampled(lambda: len(chaos.live_rank_processes(job.run_root))) as counts:
        yield counts


@contextmanager
def rank_fencing(job: Job) -> Iterator[list[dict[int, list[int]]]]:
    """Sample, every 50 ms while the block runs, the ranks alive in two processes at
    once (:func:`infra.chaos.ranks_alive_twice`): the fencing invariant holds
    when no sample names one (``assert not any(samples)``)."""
    with sampled(lambda: chaos.ranks_alive_twice(job.run_root)) as samples:
        yield samples
