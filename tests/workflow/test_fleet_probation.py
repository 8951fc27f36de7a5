"""The fleet's probation loop on a real dev server, with the real preflight activity
running the health command on logical local nodes.

A job's report quarantines its nodes, and its release says which ones its stops
fenced. A fenced node goes on probation: the health command passes N times in a row
and the node is back in service; one whose command fails stays on probation, round
after round, until it passes N times. A node its job could not fence never starts
probation (stale ranks may still run there).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Worker

from activities.preflight import preflight
from lazarus.app.devserver import DevServer
from lazarus.app.fleet_client import FleetClient
from lazarus.domain.api import (
    FLEET_QUERY_STATUS,
    FLEET_UPDATE_LEASE,
    FLEET_UPDATE_RELEASE,
    FLEET_UPDATE_REPORT_QUARANTINE,
)
from lazarus.domain.fleet import (
    FleetConfig,
    FleetStatus,
    Lease,
    LeaseRequest,
    NodeState,
    NodeView,
    QuarantineReport,
    ReleaseRequest,
)
from workflows.fleet import FleetWorkflow

pytestmark = pytest.mark.timeout(120)

PASSES = 3


@pytest.fixture
async def fleet_client(dev_server: DevServer) -> AsyncIterator[FleetClient]:
    """A worker hosting fleets, with the real preflight activity and nothing else."""
    client = await Client.connect(dev_server.address, data_converter=pydantic_data_converter)
    task_queue = f"probation-{uuid.uuid4().hex[:8]}"
    fleets = FleetClient(client, task_queue=task_queue)
    async with Worker(
        client, task_queue=task_queue, workflows=[FleetWorkflow], activities=[preflight]
    ):
        yield fleets


async def start_fleet(fleets: FleetClient, sick_dir: Path) -> WorkflowHandle[object, object]:
    """Nodes ``good``, ``bad`` and ``unfenced``; the health command fails on a node while
    ``sick_dir/<node>`` exists."""
    config = FleetConfig.model_validate(
        {
            "name": f"p-{uuid.uuid4().hex[:6]}",
            "nodes": [{"name": "good"}, {"name": "bad"}, {"name": "unfenced"}],
            "probation": {
                "health_command": ["sh", "-c", f'test ! -e "{sick_dir}/$LAZARUS_NODE"'],
                "passes": PASSES,
                "interval_s": 0.2,
            },
        }
    )
    workflow_id = await fleets.start(config)
    return fleets.temporal.get_workflow_handle(workflow_id)


async def status_until(
    handle: WorkflowHandle[object, object], check: Callable[[FleetStatus], bool], what: str
) -> FleetStatus:
    deadline = time.monotonic() + 60
    last: FleetStatus | None = None
    while time.monotonic() < deadline:
        last = await handle.query(FLEET_QUERY_STATUS, result_type=FleetStatus)
        if check(last):
            return last
        await asyncio.sleep(0.1)
    raise TimeoutError(f"never saw {what}; last: {last}")


def view(status: FleetStatus, name: str) -> NodeView:
    return next(v for v in status.nodes if v.name == name)


async def checks_run(handle: WorkflowHandle[object, object]) -> int:
    """Probation rounds the fleet has completed: its preflight activities."""
    history = await handle.fetch_history()
    return sum(
        1
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
    )


async def test_a_fenced_node_that_passes_returns_and_one_that_fails_stays(
    fleet_client: FleetClient, tmp_path: Path
) -> None:
    (tmp_path / "bad").touch()
    handle = await start_fleet(fleet_client, tmp_path)
    try:
        lease = await handle.execute_update(
            FLEET_UPDATE_LEASE, LeaseRequest(job="j1", nodes=3), result_type=Lease
        )
        assert sorted(n.name for n in lease.nodes) == ["bad", "good", "unfenced"]
        for node in ("good", "bad", "unfenced"):
            await handle.execute_update(
                FLEET_UPDATE_REPORT_QUARANTINE,
                QuarantineReport(
                    job="j1", node=node, failure_class="gpu_hardware", key=f"j1#{node}"
                ),
                result_type=str,
            )
        # The job ends; its last stop reached two of the three nodes.
        await handle.execute_update(
            FLEET_UPDATE_RELEASE, ReleaseRequest(job="j1", fenced=["good", "bad"]), result_type=str
        )

        back = await status_until(
            handle, lambda s: view(s, "good").state == NodeState.HEALTHY, "good back in service"
        )
        assert f"passed probation ({PASSES} checks)" in [
            e.what for e in back.log if e.node == "good"
        ]
        rounds = await checks_run(handle)
        assert rounds >= PASSES
        # Every round also checked ``bad``, and it failed each time.
        bad = view(back, "bad")
        assert bad.state == NodeState.PROBATION and bad.passes == 0
        unfenced = view(back, "unfenced")
        assert unfenced.state == NodeState.QUARANTINED and not unfenced.fenced

        # More rounds: ``bad`` stays on probation while its command fails.
        deadline = time.monotonic() + 60
        while await checks_run(handle) < rounds + PASSES:
            assert time.monotonic() < deadline, "the probation rounds stopped"
            await asyncio.sleep(0.2)
        still = await handle.query(FLEET_QUERY_STATUS, result_type=FleetStatus)
        assert view(still, "bad").state == NodeState.PROBATION
        assert view(still, "bad").passes == 0

        # Fixed: it passes N times in a row and is back in service too.
        (tmp_path / "bad").unlink()
        healed = await status_until(
            handle, lambda s: view(s, "bad").state == NodeState.HEALTHY, "bad back in service"
        )
        assert healed.counts["probation"] == 0
        assert view(healed, "unfenced").state == NodeState.QUARANTINED
    finally:
        with contextlib.suppress(RPCError):
            await handle.terminate("test teardown")


async def test_a_probation_check_the_worker_refuses_says_why_in_the_fleet_log(
    fleet_client: FleetClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's allow-list (read by the activity, in this process) names only python.
    monkeypatch.setenv("LAZARUS_ALLOWED_COMMANDS", "/nonexistent/python")
    handle = await start_fleet(fleet_client, tmp_path)
    try:
        await handle.execute_update(
            FLEET_UPDATE_LEASE, LeaseRequest(job="j1", nodes=1), result_type=Lease
        )
        await handle.execute_update(
            FLEET_UPDATE_REPORT_QUARANTINE,
            QuarantineReport(job="j1", node="good", failure_class="hang", key="j1#1"),
            result_type=str,
        )
        await handle.execute_update(
            FLEET_UPDATE_RELEASE, ReleaseRequest(job="j1", fenced=["good"]), result_type=str
        )
        status = await status_until(
            handle,
            lambda s: any("could not run" in e.what for e in s.log),
            "the refusal in the fleet's log",
        )
        [refused] = [e.what for e in status.log if "could not run" in e.what]
        assert "allowed_commands" in refused
        assert view(status, "good").state == NodeState.PROBATION
    finally:
        with contextlib.suppress(RPCError):
            await handle.terminate("test teardown")
