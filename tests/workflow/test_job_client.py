"""``JobClient`` against a real dev server and the real workflow, with fake activities.

The client is the supported Python API (and what the CLI, demo and benches use), so
its typed results and errors are pinned here: start, status, pause/resume, the
job's own refusals, an idempotent cancel, and the errors for a name that does not
exist and a server that is not there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Worker

from lazarus.app.client import (
    JobAlreadyRunning,
    JobClient,
    JobClosed,
    JobHandle,
    JobNotFound,
    NotAJob,
    RequestRejected,
    StartPlan,
    StatusView,
    plan_start,
)
from lazarus.app.devserver import DevServer
from lazarus.app.outcome import Outcome
from lazarus.app.settings import ConnectionSettings, ServerUnreachable
from lazarus.domain.api import FLEET_WORKFLOW_TYPE, fleet_workflow_id, workflow_id_for
from lazarus.domain.contracts import FailureReport
from lazarus.domain.ports import free_port
from lazarus.domain.spec import JobSpec
from tests.workflow import fakes
from tests.workflow.conftest import fake_spec
from workflows.job import JobWorkflow
from workflows.state import JobInput, Phase

pytestmark = pytest.mark.timeout(120)


class _TrackedClient(JobClient):
    """Remembers what it started, so the fixture can end it."""

    started: list[str]

    async def start(self, what: JobSpec | JobInput | StartPlan) -> JobHandle:
        handle = await super().start(what)
        self.started.append(handle.workflow_id)
        return handle


@pytest.fixture
async def jobs(dev_server: DevServer) -> AsyncIterator[JobClient]:
    """A client on a private task queue, served by an in-process worker."""
    client = await Client.connect(dev_server.address, data_converter=pydantic_data_converter)
    task_queue = f"client-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client, task_queue=task_queue, workflows=[JobWorkflow], activities=list(fakes.ACTIVITIES)
    ):
        tracked = _TrackedClient(client, task_queue=task_queue)
        tracked.started = []
        yield tracked
        for workflow_id in tracked.started:
            with contextlib.suppress(RPCError):  # already closed
                await client.get_workflow_handle(workflow_id).terminate("test teardown")


async def _until(
    jobs: JobClient, job: JobHandle, check: Callable[[StatusView], bool], what: str
) -> StatusView:
    """Poll ``status`` until ``check`` holds: a deadline on progress, not on speed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    view = await jobs.status(job)
    while not check(view):
        if loop.time() > deadline:
            raise TimeoutError(f"never saw {what}; last: {view}")
        await asyncio.sleep(0.1)
        view = await jobs.status(job)
    return view


async def test_start_status_pause_resume_and_an_idempotent_cancel(
    jobs: JobClient, tmp_path: Path
) -> None:
    spec = fake_spec(tmp_path)
    plan = plan_start(spec, jobs.task_queue)  # the pure first half (dry_run asks a worker)
    assert plan.workflow_id == workflow_id_for(spec.name) and plan.task_queue == jobs.task_queue

    handle = await jobs.start(plan)
    assert handle.job == spec.name and handle.workflow_id == plan.workflow_id and handle.run_id
    view = await _until(jobs, handle, lambda v: v.phase == Phase.RUNNING, "RUNNING")
    assert view.execution_status == "RUNNING" and view.status is not None
    assert view.job == spec.name

    with pytest.raises(JobAlreadyRunning, match="already running"):
        await jobs.ensure_not_running(spec.name)
    with pytest.raises(JobAlreadyRunning):
        await jobs.start(spec)
    assert spec.name in [row.job for row in await jobs.list()]
    assert await jobs.incidents(spec.name) == []

    await jobs.pause(handle)
    await _until(jobs, handle, lambda v: v.phase == Phase.PAUSED, "PAUSED")
    with pytest.raises(RequestRejected, match="nothing sent") as refused:
        await jobs.pause(spec.name)
    assert "PAUSED" in refused.value.reason
    await jobs.resume(spec.name)
    await _until(jobs, handle, lambda v: v.phase == Phase.RUNNING, "RUNNING again")

    with pytest.raises(RequestRejected, match="no-such-node"):
        await jobs.recover(spec.name, exclude_node="no-such-node")

    first = await jobs.cancel(handle)
    assert first.requested and first.already_closed_as is None
    await _until(jobs, handle, lambda v: v.execution_status != "RUNNING", "the job closed")
    second = await jobs.cancel(handle)
    assert not second.requested and second.already_closed_as == "CANCELED"
    with pytest.raises(JobClosed, match="cannot resume it"):
        await jobs.resume(handle)
    with pytest.raises(JobClosed, match=r"already closed \(CANCELED\)"):
        await jobs.drain(handle, "local")


async def test_result_is_the_final_status(jobs: JobClient, tmp_path: Path) -> None:
    spec = fake_spec(tmp_path)
    fakes.script_for(spec.job_id).succeed_at.add(1)
    handle = await jobs.start(spec)
    final = await asyncio.wait_for(jobs.result(handle), timeout=60)
    assert final.phase == Phase.SUCCEEDED
    view = await jobs.status(handle)
    assert view.execution_status == "COMPLETED" and view.is_terminal
    assert view.status is not None and view.status.phase == Phase.SUCCEEDED


async def test_an_unknown_job_is_job_not_found(jobs: JobClient) -> None:
    name = f"never-started-{uuid.uuid4().hex[:6]}"
    for call in (jobs.status, jobs.cancel, jobs.pause, jobs.incidents):
        with pytest.raises(JobNotFound, match=f"no job named '{name}'"):
            await call(name)
    await jobs.ensure_not_running(name)  # a free name is fine to start


async def test_a_job_command_on_a_fleets_workflow_id_sends_nothing(jobs: JobClient) -> None:
    """Issue 37, N6: job ``fleet-<x>``'s id is fleet ``<x>``'s (``lazarus-fleet-<x>``),
    and ``lazarus cancel fleet-<x>`` used to cancel the fleet (its leases, quarantines
    and lemon history with it). A fleet workflow on a queue nobody polls stands in for
    the fleet: every job command is refused before anything reaches it."""
    fleet = f"n6-{uuid.uuid4().hex[:6]}"
    handle = await jobs.temporal.start_workflow(
        FLEET_WORKFLOW_TYPE,
        id=fleet_workflow_id(fleet),
        task_queue=f"nobody-{uuid.uuid4().hex[:8]}",
    )
    try:
        name = f"fleet-{fleet}"
        assert workflow_id_for(name) == handle.id  # the collision the names rule out
        calls: list[Callable[[str], Awaitable[object]]] = [
            jobs.cancel,
            jobs.pause,
            jobs.resume,
            lambda job: jobs.recover(job),
            lambda job: jobs.drain(job, "a"),
            jobs.status,
        ]
        for call in calls:
            with pytest.raises(NotAJob, match="LazarusFleet workflow, not a job; nothing sent"):
                await call(name)
        await jobs.ensure_not_running(name)  # no job of that name runs
        history = await handle.fetch_history()
        kinds = [EventType.Name(e.event_type) for e in history.events]
        assert not [k for k in kinds if "CANCEL" in k or "SIGNAL" in k], kinds
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    finally:
        await handle.terminate("test teardown")


async def test_no_server_is_server_unreachable() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ServerUnreachable, match=f"cannot reach Temporal at {address}"):
        await JobClient.connect(ConnectionSettings(address=address))


def _crash(node: str = "a") -> FailureReport:
    now = time.time()
    return FailureReport(
        kind="crash",
        failure_class="unknown",
        rank=0,
        node=node,
        exit_code=1,
        fault_at=now,
        detected_at=now,
        evidence=["exit 1"],
    )


async def test_wait_ends_with_the_outcome(jobs: JobClient, tmp_path: Path) -> None:
    """``lazarus wait``'s engine: SUCCEEDED, a job stuck for a person (NEEDS_OPERATOR,
    an outcome, not a hang), then CANCELLED once someone cancels it, a timeout that
    leaves the job alone, and a name nobody started."""
    spec = fake_spec(tmp_path)
    fakes.script_for(spec.job_id).succeed_at.add(1)
    handle = await jobs.start(spec)
    phases: list[str | None] = []
    done = await asyncio.wait_for(
        jobs.wait(handle, poll_s=0.2, on_change=lambda v: phases.append(v.phase)), timeout=60
    )
    assert done.outcome == Outcome.SUCCEEDED and done.outcome.exit_code == 0
    assert done.view.phase == Phase.SUCCEEDED and phases[-1] == Phase.SUCCEEDED
    assert (await jobs.spec(spec.name)).name == spec.name

    stuck = fake_spec(tmp_path, nodes=[{"name": "a"}, {"name": "b"}])
    script = fakes.script_for(stuck.job_id)
    script.failures[1] = _crash()
    script.unreachable_at_launch[2] = "b"
    await jobs.start(stuck)
    waiting = await asyncio.wait_for(jobs.wait(stuck.name, poll_s=0.2), timeout=60)
    assert waiting.outcome == Outcome.NEEDS_OPERATOR and waiting.outcome.exit_code == 5
    assert waiting.view.status is not None and waiting.view.status.operator_reason
    timed_out = await jobs.wait(stuck.name, timeout_s=0.5, stop_at_operator=False, poll_s=0.1)
    assert timed_out.outcome == Outcome.TIMEOUT and timed_out.view.execution_status == "RUNNING"
    await jobs.cancel(stuck.name)
    ended = await asyncio.wait_for(
        jobs.wait(stuck.name, stop_at_operator=False, poll_s=0.2), timeout=60
    )
    assert ended.outcome == Outcome.CANCELLED and ended.outcome.exit_code == 4

    with pytest.raises(JobNotFound):
        await jobs.wait(f"never-started-{uuid.uuid4().hex[:6]}")
