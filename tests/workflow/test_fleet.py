"""The fleet workflow with real jobs (fake activities, real dev server): two jobs share
one spare pool, a node that failed in one job is not leased to the next, a restarted or
continued-as-new fleet loses no lease, and a job whose fleet is gone keeps running."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Replayer, Worker

from lazarus.app.client import RequestRejected
from lazarus.app.devserver import DevServer
from lazarus.app.fleet_client import FleetClient, FleetEndedBefore, FleetNotFound
from lazarus.domain.api import (
    FLEET_UPDATE_LEASE,
    WORKFLOW_TYPE,
    fleet_workflow_id,
    workflow_id_for,
)
from lazarus.domain.contracts import FailureReport
from lazarus.domain.fleet import FleetConfig, FleetStatus, Lease, LeaseRequest
from lazarus.domain.spec import JobSpec
from tests.workflow import fakes
from tests.workflow.conftest import FakeJob, fake_spec
from workflows.fleet import FleetWorkflow
from workflows.job import JobWorkflow
from workflows.state import JobInput, Phase

pytestmark = pytest.mark.timeout(180)


class Cluster:
    """One task queue with a worker hosting jobs and fleets, as the controller does."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self.client = client
        self.task_queue = task_queue
        self.fleets = FleetClient(client, task_queue=task_queue)
        self.handles: list[WorkflowHandle[object, object]] = []

    async def start_fleet(self, **overrides: object) -> FleetConfig:
        data: dict[str, object] = {
            "name": f"f-{uuid.uuid4().hex[:6]}",
            "nodes": [{"name": f"n{i}"} for i in range(4)],
            "spares": [{"name": "s0"}],
            "lemon": {"incidents": 1, "window_h": 24},
        }
        data.update(overrides)
        config = FleetConfig.model_validate(data)
        await self.fleets.start(config)
        self.handles.append(self.client.get_workflow_handle(fleet_workflow_id(config.name)))
        return config

    async def start_job(self, spec: JobSpec) -> FakeJob:
        handle = await self.client.start_workflow(
            WORKFLOW_TYPE,
            JobInput(spec=spec, strict_phases=True),
            id=workflow_id_for(spec.name),
            task_queue=self.task_queue,
        )
        self.handles.append(handle)
        return FakeJob(spec, handle)


def lost(node: str) -> FailureReport:
    now = time.time()
    return FailureReport(
        kind="node_lost",
        failure_class="node_lost",
        rank=0,
        node=node,
        fault_at=now,
        detected_at=now,
        evidence=["node unreachable"],
    )


async def fleet_status_until(
    cluster: Cluster, fleet: str, check: Callable[[FleetStatus], bool], what: str
) -> FleetStatus:
    deadline = time.monotonic() + 60
    last = None
    while time.monotonic() < deadline:
        last = await cluster.fleets.status(fleet)
        if check(last):
            return last
        await asyncio.sleep(0.1)
    raise TimeoutError(f"never saw {what}; last: {last}")


def leased(status: FleetStatus, job: str) -> list[str]:
    return sorted(n.name for n in status.nodes if n.state == "leased" and n.job == job)


@contextlib.asynccontextmanager
async def worker(client: Client, task_queue: str) -> AsyncIterator[None]:
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[JobWorkflow, FleetWorkflow],
        activities=list(fakes.ACTIVITIES),
    ):
        yield


@pytest.fixture
async def cluster(dev_server: DevServer) -> AsyncIterator[Cluster]:
    client = await Client.connect(dev_server.address, data_converter=pydantic_data_converter)
    made = Cluster(client, f"fleet-{uuid.uuid4().hex[:8]}")
    async with worker(client, made.task_queue):
        yield made
    for handle in made.handles:
        with contextlib.suppress(RPCError):
            await handle.terminate("test teardown")


def fleet_job(tmp_path: Path, fleet: str, **lease: object) -> JobSpec:
    return fake_spec(tmp_path, fleet={"name": fleet, **lease})


async def test_two_jobs_share_one_spare_pool(cluster: Cluster, tmp_path: Path) -> None:
    fleet = await cluster.start_fleet()
    first = await cluster.start_job(fleet_job(tmp_path, fleet.name, nodes=2))
    second = await cluster.start_job(fleet_job(tmp_path, fleet.name, nodes=2))
    a = await first.wait_phase(Phase.RUNNING)
    b = await second.wait_phase(Phase.RUNNING)
    assert sorted([*a.nodes.active, *b.nodes.active]) == ["n0", "n1", "n2", "n3"]
    assert a.fleet == fleet.name and a.nodes.spares == []

    first.script.failures[1] = lost(a.nodes.active[0])
    a2 = await first.wait_for(lambda s: s.generation == 2 and s.phase == Phase.RUNNING, "gen 2")
    assert "s0" in a2.nodes.active and a.nodes.active[0] not in a2.nodes.active
    # The fleet's answer is on the incident it was asked for, next to the root cause.
    assert f"fleet: replacement for {a.nodes.active[0]}: s0" in a2.incidents[-1].evidence[:3]
    status = await cluster.fleets.status(fleet.name)
    assert status.counts["spare"] == 0 and "s0" in leased(status, first.spec.job_id)

    second.script.failures[1] = lost(b.nodes.active[1])
    b2 = await second.wait_phase(Phase.NEEDS_OPERATOR)
    assert any("none left" in line for line in b2.fleet_notes), b2.fleet_notes

    # The first job ends: its healthy nodes go back (the spare pool first), the lost
    # node stays quarantined, fenced by the job's stops.
    first.script.succeed_at.add(2)
    await first.wait_phase(Phase.SUCCEEDED)
    after = await fleet_status_until(
        cluster, fleet.name, lambda s: not leased(s, first.spec.job_id), "the release"
    )
    assert after.counts["spare"] == 1
    assert after.counts["quarantined"] == 2


def gpu_fault(node: str) -> FailureReport:
    """A crash the playbook answers by replacing the node: its ranks died, so the stop
    reaches the node and fences it."""
    return lost(node).model_copy(update={"kind": "crash", "failure_class": "gpu_hardware"})


async def start_repairing_fleet(cluster: Cluster) -> FleetConfig:
    """Three nodes, no shared spare, a lax lemon rule and fast probation: a failed node
    the job hands back is healthy again within seconds."""
    return await cluster.start_fleet(
        nodes=[{"name": f"n{i}"} for i in range(3)],
        spares=[],
        lemon={"incidents": 3, "window_h": 24},
        probation={"health_command": ["true"], "passes": 2, "interval_s": 0.2},
    )


async def repaired(cluster: Cluster, fleet: str, node: str) -> None:
    await fleet_status_until(
        cluster,
        fleet,
        lambda s: any(n.name == node and n.state == "healthy" for n in s.nodes),
        f"{node} passing probation",
    )


async def test_a_running_job_hands_a_fenced_node_back_and_gets_it_again_repaired(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Three nodes, all leased (two train, one spare): only the failed node, back from
    # probation, can stand in for the next loss.
    fleet = await start_repairing_fleet(cluster)
    job = await cluster.start_job(
        fleet_job(tmp_path, fleet.name, nodes=2, spares=1, hand_back=True)
    )
    first = await job.wait_phase(Phase.RUNNING)
    bad = first.nodes.active[0]
    job.script.failures[1] = gpu_fault(bad)
    second = await job.wait_for(lambda s: s.generation == 2 and s.phase == Phase.RUNNING, "gen 2")
    # Not held until the job ends: the stop fenced it, and the launch handed it back.
    assert bad not in [q.node for q in second.nodes.quarantined], second.nodes
    assert any(f"took {bad} back (on probation)" in line for line in second.fleet_notes)
    await repaired(cluster, fleet.name, bad)
    # No spare of its own is left: the fleet's replacement is the repaired node.
    job.script.failures[2] = gpu_fault(second.nodes.active[1])
    third = await job.wait_for(lambda s: s.generation == 3 and s.phase == Phase.RUNNING, "gen 3")
    assert bad in third.nodes.active, third.nodes
    assert any(f"replacement for {second.nodes.active[1]}: {bad}" in n for n in third.fleet_notes)
    # The hand-back is history like any other call: the job replays deterministically.
    history = await job.handle.fetch_history()
    assert "fleet_hand_back" in history.to_json()
    await Replayer(workflows=[JobWorkflow], data_converter=pydantic_data_converter).replay_workflow(
        history
    )


async def test_a_node_replaced_under_rejoin_is_handed_back_too(
    cluster: Cluster, tmp_path: Path
) -> None:
    # With rejoin the replaced node is stopped alone; that stop fences it as the whole
    # generation's did (before, it stayed in the job until the end: found by the
    # simulator's rejoin row, whose fleet ran dry).
    fleet = await start_repairing_fleet(cluster)
    spec = fake_spec(
        tmp_path,
        fleet={"name": fleet.name, "nodes": 2, "spares": 1, "hand_back": True},
        nproc_per_node=1,
        rejoin={"enabled": True},
    )
    job = await cluster.start_job(spec)
    first = await job.wait_phase(Phase.RUNNING)
    bad = first.nodes.active[0]
    job.script.failures[1] = gpu_fault(bad)
    second = await job.wait_for(lambda s: s.generation == 2 and s.phase == Phase.RUNNING, "gen 2")
    assert second.incidents[-1].restart_path == "rejoin", second.incidents[-1]
    assert bad not in [q.node for q in second.nodes.quarantined], second.nodes
    assert any(f"took {bad} back (on probation)" in line for line in second.fleet_notes)
    history = await job.handle.fetch_history()
    await Replayer(workflows=[JobWorkflow], data_converter=pydantic_data_converter).replay_workflow(
        history
    )


async def test_a_node_lost_again_after_its_repair_gets_a_new_replacement(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Three nodes, the job trains on two with no spare: every replacement is the
    # fleet's, and each lost node comes back from probation for the next loss.
    fleet = await start_repairing_fleet(cluster)
    job = await cluster.start_job(fleet_job(tmp_path, fleet.name, nodes=2, hand_back=True))
    first = await job.wait_phase(Phase.RUNNING)
    a, b = first.nodes.active

    job.script.failures[1] = gpu_fault(a)
    second = await job.wait_for(lambda s: s.generation == 2 and s.phase == Phase.RUNNING, "gen 2")
    [c] = [n for n in second.nodes.active if n != b]
    await repaired(cluster, fleet.name, a)
    job.script.failures[2] = gpu_fault(b)
    third = await job.wait_for(lambda s: s.generation == 3 and s.phase == Phase.RUNNING, "gen 3")
    assert sorted(third.nodes.active) == sorted([a, c]), third.nodes
    await repaired(cluster, fleet.name, b)
    # a is lost a second time. Keyed by the node alone, the fleet answered with c, its
    # first replacement, which the job trains on: no spare, and a page.
    job.script.failures[3] = gpu_fault(a)
    fourth = await job.wait_for(
        lambda s: s.generation == 4 or s.phase == Phase.NEEDS_OPERATOR, "gen 4 or a page"
    )
    assert fourth.phase != Phase.NEEDS_OPERATOR, fourth.operator_reason
    fourth = await job.wait_for(lambda s: s.generation == 4 and s.phase == Phase.RUNNING, "gen 4")
    assert sorted(fourth.nodes.active) == sorted([b, c]), fourth.nodes
    assert f"replacement for {a}: {b}" in fourth.fleet_notes, fourth.fleet_notes


async def test_a_job_short_of_nodes_goes_on_when_its_fleet_has_one_again(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Three nodes, no spare: job b's loss leaves the fleet with none to give, until
    # job a ends and releases two.
    fleet = await cluster.start_fleet(nodes=[{"name": f"n{i}"} for i in range(3)], spares=[])
    a = await cluster.start_job(fleet_job(tmp_path, fleet.name, nodes=2))
    b = await cluster.start_job(fleet_job(tmp_path, fleet.name, nodes=1, retry_s=10))
    await a.wait_phase(Phase.RUNNING)
    first = await b.wait_phase(Phase.RUNNING)
    [dead] = first.nodes.active
    b.script.failures[1] = lost(dead)
    waiting = await b.wait_phase(Phase.NEEDS_OPERATOR)
    assert f"replacement for {dead}: none left" in waiting.fleet_notes, waiting.fleet_notes

    a.script.succeed_at.add(1)
    await a.wait_phase(Phase.SUCCEEDED)
    # No person resumes it: the job's next try finds a released node and goes on.
    again = await b.wait_for(
        lambda s: s.generation == 2 and s.phase == Phase.RUNNING, "gen 2 on a released node"
    )
    [node] = again.nodes.active
    assert node != dead and again.operator_reason is None
    assert f"replacement for {dead}: {node}" in again.fleet_notes, again.fleet_notes
    assert again.fleet_notes.count(f"replacement for {dead}: none left") == 1
    status = await cluster.fleets.status(fleet.name)
    assert node in leased(status, b.spec.job_id)
    history = await b.handle.fetch_history()
    timers = [
        e.user_metadata.summary.data
        for e in history.events
        if e.HasField("timer_started_event_attributes")
    ]
    assert any(b"ask the fleet again" in summary for summary in timers), timers
    await Replayer(workflows=[JobWorkflow], data_converter=pydantic_data_converter).replay_workflow(
        history
    )


async def test_a_node_that_failed_in_job_a_is_not_leased_to_job_b(
    cluster: Cluster, tmp_path: Path
) -> None:
    fleet = await cluster.start_fleet()
    job_a = await cluster.start_job(fleet_job(tmp_path, fleet.name, nodes=2, spares=1))
    a = await job_a.wait_phase(Phase.RUNNING)
    bad = a.nodes.active[0]
    job_a.script.failures[1] = lost(bad)
    job_a.script.succeed_at.add(2)
    await job_a.wait_phase(Phase.SUCCEEDED)
    status = await fleet_status_until(
        cluster, fleet.name, lambda s: not leased(s, job_a.spec.job_id), "job A's release"
    )
    assert bad in status.lemons
    # An operator returns it (fenced: job A ended); it is a lemon all the same.
    assert "again" in await cluster.fleets.return_node(fleet.name, bad)
    job_b = await cluster.start_job(fleet_job(tmp_path, fleet.name, nodes=4))
    b = await job_b.wait_phase(Phase.FAILED)
    assert "lemon" in (b.operator_reason or "") and bad in (b.operator_reason or "")
    job_c = await cluster.start_job(fleet_job(tmp_path, fleet.name, nodes=3))
    c = await job_c.wait_phase(Phase.RUNNING)
    assert bad not in c.nodes.active
    assert any("lemons excluded" in line for line in c.fleet_notes)


async def test_a_restarted_or_continued_as_new_fleet_loses_no_lease(cluster: Cluster) -> None:
    # Its own queue: the worker serving it is stopped and replaced mid-test.
    own = Cluster(cluster.client, f"fleet-{uuid.uuid4().hex[:8]}")
    own.handles = cluster.handles  # terminated by the fixture
    leases: dict[str, Lease] = {}
    async with worker(own.client, own.task_queue):
        fleet = await own.start_fleet(
            nodes=[{"name": f"n{i}"} for i in range(12)], continue_as_new_after_events=20
        )
        handle = own.client.get_workflow_handle(fleet_workflow_id(fleet.name))
        for index in range(6):
            job = f"job-{index}"
            leases[job] = await handle.execute_update(
                FLEET_UPDATE_LEASE, LeaseRequest(job=job, nodes=2), result_type=Lease
            )
        status = await fleet_status_until(own, fleet.name, lambda s: s.runs > 1, "a hop")
    for job, lease in leases.items():
        assert leased(status, job) == sorted(n.name for n in lease.nodes)
    # A new worker, after the first is gone, rebuilds the same inventory from history.
    async with worker(own.client, own.task_queue):
        again = await own.fleets.status(fleet.name)
        # A retried lease returns the same nodes, never a second set.
        repeat = await handle.execute_update(
            FLEET_UPDATE_LEASE, LeaseRequest(job="job-0", nodes=2), result_type=Lease
        )
    assert [leased(again, j) for j in leases] == [leased(status, j) for j in leases]
    assert repeat.nodes == leases["job-0"].nodes


async def test_a_job_whose_fleet_is_unreachable_keeps_running(
    cluster: Cluster, tmp_path: Path
) -> None:
    fleet = await cluster.start_fleet()
    job = await cluster.start_job(fleet_job(tmp_path, fleet.name, nodes=2, spares=1))
    first = await job.wait_phase(Phase.RUNNING)
    await cluster.client.get_workflow_handle(fleet_workflow_id(fleet.name)).terminate("gone")
    job.script.failures[1] = lost(first.nodes.active[0])
    status = await job.wait_for(lambda s: s.generation == 2 and s.phase == Phase.RUNNING, "gen 2")
    assert first.nodes.spares[0] in status.nodes.active  # its own spare
    assert any("unreachable" in line for line in status.fleet_notes), status.fleet_notes
    with pytest.raises(FleetNotFound):
        await cluster.fleets.drain(fleet.name, "n0", "x")


async def test_operator_drain_and_return_are_validated(cluster: Cluster) -> None:
    fleet = await cluster.start_fleet()
    assert "drained" in await cluster.fleets.drain(fleet.name, "n3", "fan")
    with pytest.raises(RequestRejected, match="already drained"):
        await cluster.fleets.drain(fleet.name, "n3", "again")
    with pytest.raises(RequestRejected, match="not in this fleet"):
        await cluster.fleets.return_node(fleet.name, "zz")
    assert "healthy" in await cluster.fleets.return_node(fleet.name, "n3")
    status = await cluster.fleets.status(fleet.name)
    assert [e.what for e in status.log][-2:] == [
        "drained: fan",
        "returned by operator (was quarantined)",
    ]


async def test_the_cli_starts_a_fleet_and_shows_drains_and_returns_its_nodes(
    cluster: Cluster, dev_server: DevServer, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from lazarus.app import cli

    name = f"f-{uuid.uuid4().hex[:6]}"
    config = tmp_path / "fleet.yaml"
    config.write_text(
        f"name: {name}\nnodes: [{{name: n0}}, {{name: n1}}]\nspares: [{{name: s0}}]\n"
    )
    env = {
        "TEMPORAL_ADDRESS": dev_server.address,
        "LAZARUS_TASK_QUEUE": cluster.task_queue,
        "LAZARUS_FLEET": name,
    }

    def run(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(cli.app, list(args), env=env)
        return result.exit_code, result.output

    code, out = await asyncio.to_thread(run, "fleet", "start", str(config))
    cluster.handles.append(cluster.client.get_workflow_handle(fleet_workflow_id(name)))
    assert code == 0 and "2 node(s), 1 shared spare(s)" in out, out
    code, out = await asyncio.to_thread(run, "fleet", "start", str(config))
    assert code == 1 and "already running" in out
    code, out = await asyncio.to_thread(run, "fleet", "drain", "n1", "--reason", "bad fan")
    assert code == 0 and "drained" in out, out
    code, out = await asyncio.to_thread(run, "fleet", "nodes", "--json")
    assert code == 0, out
    by_name = {n["name"]: n for n in json.loads(out)}
    assert by_name["n1"]["state"] == "quarantined" and by_name["s0"]["state"] == "spare"
    code, out = await asyncio.to_thread(run, "fleet", "nodes")
    assert code == 0 and "bad fan" in out
    code, out = await asyncio.to_thread(run, "fleet", "status")
    assert code == 0 and "quarantined 1" in out, out
    code, out = await asyncio.to_thread(run, "fleet", "return", "n0")
    assert code == 1 and "already in service" in out
    code, out = await asyncio.to_thread(run, "fleet", "return", "n1")
    assert code == 0 and "healthy again" in out, out
    code, out = await asyncio.to_thread(run, "fleet", "release", "nobody")
    assert code == 1 and "job nobody holds no leased node" in out, out


# ------------------------------------------------------------------------ issue 26


async def test_a_fleet_job_that_escalated_for_its_budget_waits_for_a_person(
    cluster: Cluster, tmp_path: Path
) -> None:
    # The audit's repro: b's only node is lost with its restart budget spent. b is short
    # of a node too, but a spent budget is a person's call: when a releases a node, b
    # must not relaunch on it by itself.
    fleet = await cluster.start_fleet(nodes=[{"name": "n0"}, {"name": "n1"}], spares=[])
    a = await cluster.start_job(fleet_job(tmp_path, fleet.name, nodes=1))
    spec_b = fake_spec(
        tmp_path,
        fleet={"name": fleet.name, "nodes": 1, "retry_s": 10},
        recovery={"max_restarts": 0, "backoff_initial_s": 0.1, "backoff_max_s": 0.2},
    )
    b = await cluster.start_job(spec_b)
    await a.wait_phase(Phase.RUNNING)
    [dead] = (await b.wait_phase(Phase.RUNNING)).nodes.active
    b.script.failures[1] = lost(dead)
    waiting = await b.wait_phase(Phase.NEEDS_OPERATOR)
    assert "restart budget spent" in (waiting.operator_reason or "")
    a.script.succeed_at.add(1)
    await a.wait_phase(Phase.SUCCEEDED)
    await fleet_status_until(
        cluster, fleet.name, lambda s: not leased(s, a.spec.job_id), "a's release"
    )
    # Past b's retry interval, nobody has touched it: it still waits, on generation 1.
    await asyncio.sleep(12)
    still = await b.status()
    assert still.phase == Phase.NEEDS_OPERATOR and still.generation == 1, still
    assert "restart budget spent" in (still.operator_reason or "")
    history = await b.handle.fetch_history()
    timers = [
        e.user_metadata.summary.data
        for e in history.events
        if e.HasField("timer_started_event_attributes")
    ]
    assert not any(b"ask the fleet again" in summary for summary in timers), timers
    status = await cluster.fleets.status(fleet.name)
    assert not leased(status, b.spec.job_id)
    await Replayer(workflows=[JobWorkflow], data_converter=pydantic_data_converter).replay_workflow(
        history
    )


async def test_a_lease_its_job_left_behind_is_refused_to_the_next_start_until_freed(
    cluster: Cluster, tmp_path: Path
) -> None:
    fleet = await cluster.start_fleet(nodes=[{"name": f"n{i}"} for i in range(3)], spares=[])
    first = await cluster.start_job(fleet_job(tmp_path, fleet.name, nodes=2))
    held = sorted((await first.wait_phase(Phase.RUNNING)).nodes.active)
    name = first.spec.name
    # While the job's workflow is open, its nodes are its own to give back.
    with pytest.raises(RequestRejected, match=f"job '{name}' is still open"):
        await cluster.fleets.release(fleet.name, name)
    await first.handle.terminate("wedged")  # no release reaches the fleet
    # A new start of the name asks for another size: refused, never handed the old lease.
    again = fake_spec(tmp_path, name=name, fleet={"name": fleet.name, "nodes": 1})
    second = await cluster.start_job(again)
    refused = await second.wait_phase(Phase.FAILED)
    await asyncio.wait_for(second.handle.result(), 30)  # closed, after its own release
    assert f"'lazarus fleet release {name} --fleet {fleet.name}'" in (
        refused.operator_reason or ""
    ), refused.operator_reason
    status = await cluster.fleets.status(fleet.name)
    assert leased(status, name) == held  # the failed start's release left them alone
    # The operator frees them: quarantined, not fenced, until each is checked.
    reply = await cluster.fleets.release(fleet.name, name)
    assert "quarantined, not fenced" in reply, reply
    for node in held:
        assert "again" in await cluster.fleets.return_node(fleet.name, node, fenced=True)
    third = await cluster.start_job(again)
    running = await third.wait_phase(Phase.RUNNING)
    assert len(running.nodes.active) == 1


async def test_a_jobs_release_outlasts_a_fleet_that_is_away_for_a_while(
    cluster: Cluster, tmp_path: Path
) -> None:
    fleet = await cluster.start_fleet()
    job = await cluster.start_job(fleet_job(tmp_path, fleet.name, nodes=2))
    await job.wait_phase(Phase.RUNNING)
    await cluster.client.get_workflow_handle(fleet_workflow_id(fleet.name)).terminate("away")
    job.script.succeed_at.add(1)
    await job.wait_phase(Phase.SUCCEEDED)
    await asyncio.sleep(5)  # three tries over three seconds gave up by now
    with pytest.raises(FleetEndedBefore, match="--forget-state"):
        await cluster.fleets.start(fleet)
    await cluster.fleets.start(fleet, forget_state=True)
    await asyncio.wait_for(job.handle.result(), 60)  # the release went through: closed
    notes = (await job.status()).fleet_notes
    assert notes[-1] == "released 0 node(s)", notes
    assert not any("release failed" in line for line in notes), notes


async def test_a_fleet_that_was_ended_is_not_started_afresh_by_accident(
    cluster: Cluster,
) -> None:
    fleet = await cluster.start_fleet()
    handle = cluster.client.get_workflow_handle(fleet_workflow_id(fleet.name))
    await handle.execute_update(
        FLEET_UPDATE_LEASE, LeaseRequest(job="still-running", nodes=2), result_type=Lease
    )
    await handle.terminate("by mistake")
    # Its state ended with it: a fresh fleet would lease still-running's nodes again.
    with pytest.raises(FleetEndedBefore, match=r"was terminated at .*--forget-state"):
        await cluster.fleets.start(fleet)
    await cluster.fleets.start(fleet, forget_state=True)
    status = await cluster.fleets.status(fleet.name)
    assert status.counts["healthy"] == 4 and not leased(status, "still-running")
