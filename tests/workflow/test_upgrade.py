"""A running job survives a controller upgrade (Worker Versioning, real server).

Version N runs the job, pinned. Version N+1 starts beside it and becomes the
deployment's current version; the job keeps running on N until its next workflow
task, then continues as new (AUTO_UPGRADE) and its next run runs on N+1, after which
N's worker can go. Fake activities stand in for ranks: this is about the workflow.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from temporalio.api.workflowservice.v1 import SetWorkerDeploymentCurrentVersionRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Worker

from lazarus.app.devserver import DevServer
from lazarus.domain.api import QUERY_STATUS, WORKFLOW_TYPE, workflow_id_for
from tests.workflow import fakes
from tests.workflow.conftest import fake_spec
from workers.versioning import WorkerDeployment
from workflows.job import JobWorkflow
from workflows.state import JobInput, JobStatus, Phase

pytestmark = pytest.mark.timeout(180)


def versioned_worker(client: Client, task_queue: str, deployment: WorkerDeployment) -> Worker:
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[JobWorkflow],
        activities=list(fakes.ACTIVITIES),
        deployment_config=deployment.config(),
    )


async def make_current(client: Client, deployment: WorkerDeployment) -> None:
    """Point the deployment at this build; retried until its worker has registered."""
    for _ in range(120):
        try:
            await client.workflow_service.set_worker_deployment_current_version(
                SetWorkerDeploymentCurrentVersionRequest(
                    namespace="default",
                    deployment_name=deployment.name,
                    build_id=deployment.build_id,
                )
            )
            return
        except RPCError:
            await asyncio.sleep(0.5)
    raise TimeoutError(f"{deployment} never became current")


async def running_build(handle: WorkflowHandle[object, object]) -> str:
    described = await handle.describe()
    info = described.raw_description.workflow_execution_info.versioning_info
    return info.deployment_version.build_id


async def wait_until(check: object, what: str, timeout_s: float = 90.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if await check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.3)
    raise TimeoutError(f"never saw {what}")


async def test_a_running_job_moves_to_the_new_build_at_its_next_continue_as_new(
    dev_server: DevServer, tmp_path: Path
) -> None:
    client = await Client.connect(dev_server.address, data_converter=pydantic_data_converter)
    task_queue = f"upgrade-{uuid.uuid4().hex[:8]}"
    name = f"lazarus-{uuid.uuid4().hex[:6]}"
    old = WorkerDeployment(name=name, build_id="v1")
    new = WorkerDeployment(name=name, build_id="v2")
    spec = fake_spec(tmp_path, health={"report_interval_s": 1, "supervisor_heartbeat_timeout_s": 5})

    async with versioned_worker(client, task_queue, old) as old_worker:
        await make_current(client, old)
        handle = await client.start_workflow(
            WORKFLOW_TYPE,
            JobInput(spec=spec, strict_phases=True),
            id=workflow_id_for(spec.name),
            task_queue=task_queue,
        )

        async def running() -> bool:
            status = await handle.query(QUERY_STATUS, result_type=JobStatus)
            return status.phase == Phase.RUNNING

        await wait_until(running, "the job running on v1")
        assert await running_build(handle) == "v1"

        async with versioned_worker(client, task_queue, new):
            await make_current(client, new)

            async def upgraded() -> bool:
                return await running_build(handle) == "v2"

            await wait_until(upgraded, "the job's next run on v2")
            await old_worker.shutdown()  # version N goes away; the job does not notice
            status = await handle.query(QUERY_STATUS, result_type=JobStatus)
            assert status.runs >= 2
            assert status.phase == Phase.RUNNING
            assert status.generation == 1  # the live ranks were adopted, not relaunched
            await handle.terminate("test done")
