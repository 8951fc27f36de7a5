"""What the Web UI reads, on the real workflow with fake activities: the start summary
and details, the current details (by the UI's own metadata query, never in history),
and the search attributes, upserted only when they change."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Replayer, Worker

from lazarus.app.client import JobClient
from lazarus.app.devserver import DevServer
from lazarus.domain.api import FAILURE_CLASS_ATTRIBUTE, GENERATION_ATTRIBUTE, PHASE_ATTRIBUTE
from lazarus.domain.contracts import FailureReport
from tests.workflow import fakes
from tests.workflow.conftest import fake_spec
from workflows.job import JobWorkflow
from workflows.state import JobStatus, Phase

pytestmark = pytest.mark.timeout(120)

METADATA_QUERY = "__temporal_workflow_metadata"
"""The built-in query the Web UI calls for a workflow's current details."""


@pytest.fixture
async def ui_client(dev_server: DevServer) -> AsyncIterator[tuple[Client, JobClient]]:
    client = await Client.connect(dev_server.address, data_converter=pydantic_data_converter)
    task_queue = f"ui-{uuid.uuid4().hex[:8]}"
    jobs = JobClient(client, task_queue=task_queue)
    async with Worker(
        client, task_queue=task_queue, workflows=[JobWorkflow], activities=list(fakes.ACTIVITIES)
    ):
        yield client, jobs


async def _current_details(client: Client, workflow_id: str) -> str:
    handle = client.get_workflow_handle(workflow_id)
    metadata = await handle.query(METADATA_QUERY, result_type=WorkflowMetadata)
    return metadata.current_details


async def _until_details(client: Client, workflow_id: str, *needles: str) -> str:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    text = ""
    while loop.time() < deadline:
        text = await _current_details(client, workflow_id)
        if all(needle in text for needle in needles):
            return text
        await asyncio.sleep(0.1)
    raise TimeoutError(f"current details never showed {needles}; last:\n{text}")


async def test_the_ui_sees_details_summary_and_attributes_but_history_does_not(
    ui_client: tuple[Client, JobClient], tmp_path: Path
) -> None:
    client, jobs = ui_client
    spec = fake_spec(tmp_path, nodes=[{"name": "a"}, {"name": "b"}])
    script = fakes.script_for(spec.job_id)
    now = time.time()
    script.failures[1] = FailureReport(
        kind="crash",
        failure_class="killed",
        rank=1,
        node="b",
        signal="SIGKILL",
        fault_at=now,
        detected_at=now,
        evidence=["rank 1 killed by SIGKILL"],
    )
    script.succeed_at = {2}
    started = await jobs.start(spec)
    handle = client.get_workflow_handle(started.workflow_id, result_type=JobStatus)
    try:
        final = await asyncio.wait_for(handle.result(), 90)
        assert final.phase == Phase.SUCCEEDED and final.generation == 2

        description = await handle.describe()
        assert (
            await description.static_summary() == f"Lazarus job {spec.name}: 2 ranks on 2 node(s)"
        )
        assert "`a` (local), `b` (local)" in (await description.static_details() or "")
        attributes = description.typed_search_attributes
        assert attributes.get(PHASE_ATTRIBUTE) == "SUCCEEDED"
        assert attributes.get(GENERATION_ATTRIBUTE) == 2
        assert attributes.get(FAILURE_CLASS_ATTRIBUTE) == "killed"

        # A closed workflow's query is answered by replaying it: the details are rebuilt.
        details = await _until_details(client, started.workflow_id, "**SUCCEEDED**")
        # The fake's generation 2 succeeds without a first step: the incident stays open.
        assert "incident** #1 crash (class `killed`): rank 1 on `b` (SIGKILL)" in details
        assert "**Decision** `restart`" in details
        assert "**Waiting for:** nothing: the job ended (SUCCEEDED)" in details

        history = await handle.fetch_history()
        assert "Waiting for" not in history.to_json(), "current details must not enter history"
        upserts = [
            event.upsert_workflow_search_attributes_event_attributes.search_attributes
            for event in history.events
            if event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
        ]
        with_generation = [a for a in upserts if GENERATION_ATTRIBUTE.name in a.indexed_fields]
        # (none, 0) at start, (none, 1) launched, (killed, 1) the incident, (killed, 2).
        assert len(with_generation) == 4, "upserted only when the class or generation changed"
        await Replayer(
            workflows=[JobWorkflow], data_converter=pydantic_data_converter
        ).replay_workflow(history)
    finally:
        with contextlib.suppress(RPCError):
            await handle.terminate("test teardown")


async def test_a_running_job_explains_itself_live(
    ui_client: tuple[Client, JobClient], tmp_path: Path
) -> None:
    client, jobs = ui_client
    spec = fake_spec(tmp_path, nodes=[{"name": "a"}])
    started = await jobs.start(spec)
    try:
        text = await _until_details(client, started.workflow_id, "**RUNNING**", "generation 1")
        assert "**Waiting for:** the supervisor of generation 1 (a)" in text
        await jobs.pause(started)
        text = await _until_details(client, started.workflow_id, "**PAUSED**")
        assert "an operator" in text and "`lazarus resume`" in text
    finally:
        with contextlib.suppress(RPCError):
            await client.get_workflow_handle(started.workflow_id).terminate("test teardown")
