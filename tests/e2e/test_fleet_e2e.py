"""The fleet end to end on logical local nodes: a real worker process hosting the job
and fleet workflows, a real dev server, and the real example DDP job.

Two jobs lease from one fleet and share its single shared spare: the first job's lost
node takes it, and the second job's loss then finds none left. The nodes that failed
are fenced when their jobs end, pass probation (the real preflight activity runs the
health command on them), and come back into service as lemons: a third job's lease
leaves them out. The job that completes ends with the fault-free run's weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from infra import chaos
from lazarus.app.fleet_client import FleetClient
from lazarus.app.local_stack import LocalStack
from lazarus.domain.api import fleet_workflow_id
from lazarus.domain.fleet import FleetConfig, FleetStatus, NodeState
from lazarus.domain.spec import JobSpec
from tests.e2e.conftest import STEPS, Job, assert_same_weights, ddp_spec
from workflows.state import Phase

StartJob = Callable[..., Awaitable[Job]]

IN_SERVICE = (NodeState.HEALTHY, NodeState.SPARE)


class Fleets:
    """Start fleets on the test's worker; every one is terminated at teardown."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self.client = FleetClient(client, task_queue=task_queue)
        self.names: list[str] = []

    async def start(self, **config: object) -> FleetConfig:
        parsed = FleetConfig.model_validate({"name": f"f-{uuid.uuid4().hex[:6]}", **config})
        await self.client.start(parsed)
        self.names.append(parsed.name)
        return parsed

    async def status_until(
        self, fleet: str, check: Callable[[FleetStatus], bool], what: str, timeout_s: float = 90
    ) -> FleetStatus:
        deadline = time.monotonic() + timeout_s
        last: FleetStatus | None = None
        while time.monotonic() < deadline:
            with contextlib.suppress(RPCError):
                last = await self.client.status(fleet)
                if check(last):
                    return last
            await asyncio.sleep(0.2)
        raise TimeoutError(f"fleet {fleet}: never saw {what}; last: {last}")


@pytest.fixture
async def fleets(client: Client, stack: LocalStack) -> AsyncIterator[Fleets]:
    made = Fleets(client, stack.task_queue)
    yield made
    for name in made.names:
        with contextlib.suppress(RPCError):
            await client.get_workflow_handle(fleet_workflow_id(name)).terminate("test teardown")


def fleet_job(
    tmp_path: Path, label: str, fleet: str, nodes: int = 2, steps: int = STEPS, **overrides: object
) -> JobSpec:
    """The example DDP job leasing ``nodes`` one-rank nodes from ``fleet``: world size
    2 matches the fault-free reference. Each job has its own directories."""
    workdir = tmp_path / label
    workdir.mkdir()
    return ddp_spec(
        workdir,
        name=f"{label}-{uuid.uuid4().hex[:6]}",
        steps=steps,
        nproc_per_node=1,
        fleet={"name": fleet, "nodes": nodes},
        **overrides,
    )


def node(status: FleetStatus, name: str) -> tuple[NodeState, str | None]:
    view = next(v for v in status.nodes if v.name == name)
    return view.state, view.job


def held_by(status: FleetStatus, job: str) -> list[str]:
    return sorted(v.name for v in status.nodes if v.state == NodeState.LEASED and v.job == job)


@pytest.mark.timeout(420)
async def test_two_jobs_share_one_spare_pool_and_failed_nodes_are_not_leased_again(
    start_job: StartJob, fleets: Fleets, tmp_path: Path, fault_free_weights: Path
) -> None:
    fleet = await fleets.start(
        nodes=[{"name": f"n{i}"} for i in range(4)],
        spares=[{"name": "s0"}],
        lemon={"incidents": 1, "window_h": 24},
        probation={"health_command": ["sh", "-c", "true"], "passes": 2, "interval_s": 0.5},
    )
    # Job A runs slowly enough to still hold the shared spare when job B loses a node;
    # job B runs until it is cancelled.
    job_a = await start_job(fleet_job(tmp_path, "a", fleet.name, step_time=0.25))
    job_b = await start_job(fleet_job(tmp_path, "b", fleet.name, steps=100_000, step_time=0.1))
    a = await job_a.wait_phase(Phase.RUNNING)
    b = await job_b.wait_phase(Phase.RUNNING)
    assert sorted([*a.nodes.active, *b.nodes.active]) == ["n0", "n1", "n2", "n3"]
    assert a.fleet == fleet.name and a.nodes.spares == [] and b.nodes.spares == []

    # Job A loses a node: the fleet's shared spare takes its slot.
    bad_a = a.nodes.active[1]
    await asyncio.to_thread(chaos.wait_for_step, job_a.run_root, 15)
    assert chaos.kill_node(job_a.run_root, bad_a) == [1]
    # The job asks for the replacement first, then reports the quarantine.
    taken = await fleets.status_until(
        fleet.name,
        lambda s: node(s, bad_a)[0] == NodeState.QUARANTINED,
        f"{bad_a} quarantined",
    )
    assert node(taken, "s0") == (NodeState.LEASED, job_a.spec.job_id)
    assert node(taken, bad_a) == (NodeState.QUARANTINED, job_a.spec.job_id)
    assert taken.counts["spare"] == 0

    # Job B then loses a node while A holds the spare: one spare fewer, so none left.
    bad_b = b.nodes.active[1]
    await asyncio.to_thread(chaos.wait_for_step, job_b.run_root, 5)
    assert chaos.kill_node(job_b.run_root, bad_b) == [1]
    stuck = await job_b.wait_phase(Phase.NEEDS_OPERATOR, timeout_s=90)
    assert any(f"replacement for {bad_b}: none left" in n for n in stuck.fleet_notes), (
        stuck.fleet_notes
    )

    done = await job_a.result(timeout_s=240)
    assert done.phase == Phase.SUCCEEDED
    [incident] = done.incidents
    assert incident.kind == "node_lost" and incident.node == bad_a
    assert "s0" in done.nodes.active and bad_a not in done.nodes.active
    assert any("replacement for" in e and "s0" in e for e in incident.evidence), incident.evidence
    assert_same_weights(job_a.weights, fault_free_weights)

    # Job B is cancelled: its nodes go back, and its failed node is fenced by its stop.
    await job_b.handle.cancel()
    # Each failed node was fenced by its job's last stop, passed probation (the health
    # command ran on it twice) and is in service again, but as a lemon.
    back = await fleets.status_until(
        fleet.name,
        lambda s: all(v.state in IN_SERVICE for v in s.nodes),
        "every node back in service",
    )
    assert sorted(back.lemons) == sorted([bad_a, bad_b])
    assert back.counts["spare"] == 1, "the shared spare pool is refilled first"
    passed = [e.node for e in back.log if e.what.startswith("passed probation")]
    assert sorted(passed) == sorted([bad_a, bad_b])

    # Job C: the two healthy non-lemon nodes, never a node that failed in A or B.
    job_c = await start_job(fleet_job(tmp_path, "c", fleet.name))
    c = await job_c.wait_phase(Phase.RUNNING)
    assert bad_a not in c.nodes.active and bad_b not in c.nodes.active
    assert any("lemons excluded" in n for n in c.fleet_notes), c.fleet_notes
    finished = await job_c.result(timeout_s=240)
    assert finished.phase == Phase.SUCCEEDED and finished.incidents == []
    assert_same_weights(job_c.weights, fault_free_weights)
    released = await fleets.status_until(
        fleet.name, lambda s: not held_by(s, job_c.spec.job_id), "job C's release"
    )
    assert released.counts["leased"] == 0
