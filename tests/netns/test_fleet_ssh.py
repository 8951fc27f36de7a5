"""The fleet over real SSH hosts (network namespaces, one sshd each): a killed host is
quarantined in the fleet, stays out when it comes back, and is not leased again.

Job A leases two of the fleet's hosts and loses one; the fleet's shared spare takes
its place and the job ends with the fault-free weights. The dead host could not be
fenced when job A ended, so the fleet keeps it quarantined until an operator vouches
for it; returned, it is still a lemon, and job B's lease leaves it out.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from infra import chaos
from infra.testhosts import TestHosts
from lazarus.app.client import RequestRejected
from lazarus.domain.fleet import NodeState
from lazarus.domain.spec import JobSpec
from tests import tiers
from tests.e2e import test_fleet_e2e
from tests.e2e.conftest import STEPS, Job, assert_same_weights, ddp_spec
from tests.e2e.test_fleet_e2e import Fleets, held_by, node
from tests.netns.conftest import HostsFactory, ssh_nodes
from tests.reference_weights import shared_reference
from workflows.state import Phase

StartJob = Callable[..., Awaitable[Job]]

fleets = test_fleet_e2e.fleets
"""The fixture: fleets on the test's worker, terminated at teardown."""


@pytest.fixture(scope="module")
def world2_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_reference(tmp_path_factory, STEPS, world_size=2)


def ssh_settings(hosts: TestHosts) -> dict[str, object]:
    return {"known_hosts": str(hosts.known_hosts), "connect_timeout_s": 2, "command_timeout_s": 2}


def fleet_job(tmp_path: Path, label: str, hosts: TestHosts, fleet: str) -> JobSpec:
    """The example DDP job on two one-rank hosts leased from ``fleet``."""
    workdir = tmp_path / label
    workdir.mkdir()
    return ddp_spec(
        workdir,
        name=f"{label}-{uuid.uuid4().hex[:6]}",
        steps=STEPS,
        step_time=0.1,
        nproc_per_node=1,
        fleet={"name": fleet, "nodes": 2},
        ssh=ssh_settings(hosts),
        env={"GLOO_SOCKET_IFNAME": hosts.hosts[0].interface},
        node_timeout_s=4,
    )


@pytest.mark.timeout(480)
@tiers.twin_of(
    "tests/e2e/test_fleet_e2e.py::test_two_jobs_share_one_spare_pool_and_failed_nodes_are_not_leased_again",
    "with the fleet's nodes on ssh hosts (the fleet's moves do not depend on the transport)",
)
async def test_a_killed_host_is_quarantined_in_the_fleet_and_not_leased_again(
    test_hosts: HostsFactory,
    start_job: StartJob,
    fleets: Fleets,
    tmp_path: Path,
    world2_weights: Path,
) -> None:
    hosts = test_hosts(4)
    entries = ssh_nodes(hosts)
    fleet = await fleets.start(
        nodes=entries[:3],
        spares=entries[3:],
        ssh=ssh_settings(hosts),
        lemon={"incidents": 1, "window_h": 24},
    )

    job_a = await start_job(fleet_job(tmp_path, "a", hosts, fleet.name))
    a = await job_a.wait_phase(Phase.RUNNING)
    assert a.fleet == fleet.name and len(a.nodes.active) == 2
    victim = a.nodes.active[1]
    await asyncio.to_thread(chaos.wait_for_step, job_a.run_root, 15)
    hosts.kill_host(victim)
    done = await job_a.result(timeout_s=240)
    assert done.phase == Phase.SUCCEEDED
    # One node loss. Under heavy load (a 2-core machine at load 8+) a second incident
    # was seen once: the assertion names every incident so the next sighting says why.
    incident = done.incidents[0]
    assert len(done.incidents) == 1, [
        (i.kind, i.failure_class, i.node, i.rank, i.evidence[:3]) for i in done.incidents
    ]
    assert incident.kind == "node_lost" and incident.node == victim
    assert "h4" in done.nodes.active, "the fleet's shared spare took the dead host's slot"
    assert any("replacement for" in e and "h4" in e for e in incident.evidence), incident.evidence
    assert_same_weights(job_a.weights, world2_weights)

    # Job A released its hosts; the dead one stays quarantined, unfenced, a lemon.
    after = await fleets.status_until(
        fleet.name, lambda s: not held_by(s, job_a.spec.job_id), "job A's release"
    )
    dead = next(v for v in after.nodes if v.name == victim)
    assert dead.state == NodeState.QUARANTINED and not dead.fenced and dead.lemon
    assert dead.failure_class == "node_lost"
    assert any(e.node == victim and "--fenced" in e.what for e in after.log)

    # The host comes back. Its job never fenced it, so a plain return is refused; an
    # operator who checked it vouches with --fenced, and it is in service, as a lemon.
    await asyncio.to_thread(hosts.restart_sshd, victim)
    with pytest.raises(RequestRejected, match="never reached it"):
        await fleets.client.return_node(fleet.name, victim)
    assert "again" in await fleets.client.return_node(fleet.name, victim, fenced=True)

    job_b = await start_job(fleet_job(tmp_path, "b", hosts, fleet.name))
    b = await job_b.wait_phase(Phase.RUNNING)
    assert victim not in b.nodes.active
    assert any(f"lemons excluded: {victim}" in n for n in b.fleet_notes), b.fleet_notes
    finished = await job_b.result(timeout_s=240)
    assert finished.phase == Phase.SUCCEEDED and finished.incidents == []
    assert_same_weights(job_b.weights, world2_weights)
    final = await fleets.status_until(
        fleet.name, lambda s: not held_by(s, job_b.spec.job_id), "job B's release"
    )
    assert node(final, victim)[0] in (NodeState.HEALTHY, NodeState.SPARE)
