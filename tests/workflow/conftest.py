"""The real job workflow on a real dev server, with the fake activities of ``fakes``.

One dev server for the session; each test gets its own task queue and in-process
worker, so its fake cluster (a :class:`fakes.Script`) is private to it.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Worker

from lazarus.app.devserver import DevServer
from lazarus.domain.api import QUERY_STATUS, WORKFLOW_TYPE, workflow_id_for
from lazarus.domain.spec import JobSpec, parse_spec
from tests.workflow import fakes
from workflows.job import JobWorkflow
from workflows.state import JobInput, JobStatus, Phase


class FakeJob:
    def __init__(self, spec: JobSpec, handle: WorkflowHandle[object, object]) -> None:
        self.spec = spec
        self.handle = handle
        self.script = fakes.script_for(spec.job_id)

    async def status(self) -> JobStatus:
        return await self.handle.query(QUERY_STATUS, result_type=JobStatus)

    async def wait_for(
        self, check: Callable[[JobStatus], bool], what: str, timeout_s: float = 60.0
    ) -> JobStatus:
        import asyncio

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        last: JobStatus | None = None
        while loop.time() < deadline:
            last = await self.status()
            if check(last):
                return last
            await asyncio.sleep(0.1)
        raise TimeoutError(f"never saw {what}; last status: {last}")

    async def wait_phase(self, *phases: Phase, timeout_s: float = 60.0) -> JobStatus:
        return await self.wait_for(lambda s: s.phase in phases, f"phase {phases}", timeout_s)


StartFakeJob = Callable[..., Awaitable[FakeJob]]


def fake_spec(tmp_path: Path, **overrides: object) -> JobSpec:
    data: dict[str, object] = {
        "name": f"wf-{uuid.uuid4().hex[:8]}",
        "command": ["python", "train.py"],
        "workdir": str(tmp_path),
        "checkpoint_dir": str(tmp_path / "checkpoints" / "{job_id}"),
        "run_dir": str(tmp_path / "runs"),
        "recovery": {"max_restarts": 5, "backoff_initial_s": 0.1, "backoff_max_s": 0.2},
        "health": {"poll_interval_s": 0.2, "supervisor_heartbeat_timeout_s": 5},
    }
    data.update(overrides)
    return parse_spec(data, "<test>").resolved(tmp_path)


@pytest.fixture
async def start_fake_job(dev_server: DevServer) -> AsyncIterator[StartFakeJob]:
    client = await Client.connect(dev_server.address, data_converter=pydantic_data_converter)
    task_queue = f"wf-{uuid.uuid4().hex[:8]}"
    handles: list[WorkflowHandle[object, object]] = []
    async with Worker(
        client, task_queue=task_queue, workflows=[JobWorkflow], activities=list(fakes.ACTIVITIES)
    ):

        async def start(spec: JobSpec, **input_overrides: object) -> FakeJob:
            handle = await client.start_workflow(
                WORKFLOW_TYPE,
                # A phase change not drawn on Phase fails the job here (it is only
                # logged in production).
                JobInput(spec=spec, **{"strict_phases": True, **input_overrides}),  # type: ignore[arg-type]
                id=workflow_id_for(spec.name),
                task_queue=task_queue,
            )
            handles.append(handle)
            return FakeJob(spec, handle)

        yield start
        for handle in handles:
            with contextlib.suppress(RPCError):  # already closed
                await handle.terminate("test teardown")
