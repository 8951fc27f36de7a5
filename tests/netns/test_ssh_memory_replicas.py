"""Memory-tier replicas over real SSH hosts: a lost node costs a memory interval, not
a disk interval (issue 28, item 3).

Three nodes and a spare, each a network namespace with its own ``/dev/shm``, run the
example DDP job with a snapshot every step, disk every 20 steps, and
``memory_replicas``: each node pushes its committed snapshot to the next node (a
ring). A host is killed past step 25, taking its tmpfs with it; the spare takes its
slot, the search finds the lost node's snapshot in its buddy's replicas, copies it
onto the spare, and every rank resumes from that memory step (not disk step 20),
ending with the weights of a fault-free run.

The same kill without replicas (disk serves, a disk interval lost) is the other half
of the benchmark's ``node_loss_replicas`` scenario and of the chaos cell
``node_and_buddy_lost@replicated``; it is not repeated here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from infra import chaos
from tests.e2e.conftest import STEPS, Job, assert_same_weights
from tests.netns.conftest import HostsFactory
from tests.netns.test_ssh_jobs import ssh_spec
from tests.reference_weights import shared_reference
from workflows.state import Phase

StartJob = Callable[..., Awaitable[Job]]
DISK_EVERY = 20


@pytest.fixture(scope="module")
def world3_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_reference(tmp_path_factory, STEPS, world_size=3)


@pytest.mark.timeout(360)
async def test_a_killed_host_resumes_on_the_spare_from_its_buddys_replica(
    test_hosts: HostsFactory, start_job: StartJob, tmp_path: Path, world3_weights: Path
) -> None:
    hosts = test_hosts(4)
    checkpoints = {
        "memory_every_steps": 1,
        "every_steps": DISK_EVERY,
        "memory_replicas": True,
    }
    job = await start_job(ssh_spec(tmp_path, hosts, checkpoints=checkpoints))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 26)
    _, step_at_kill = chaos.current_step(job.run_root)
    assert step_at_kill is not None
    killed_at = time.time()
    hosts.kill_host("h2")
    status = await job.result(timeout_s=300)

    assert status.phase == Phase.SUCCEEDED
    incident = status.incidents[0]
    assert incident.kind == "node_lost" and incident.node == "h2", status.incidents
    # The fault is dated at the host's last answer, before the kill: a poll interval
    # on a quiet machine, more when a loaded machine stretches a poll's round trip.
    assert incident.fault_at >= killed_at - 3
    assert "h4" in status.nodes.active and "h2" not in status.nodes.active
    resumed = incident.resumed_from_step
    assert resumed is not None
    # The memory tier through h3's replica of h2's slot: a step past disk's 20,
    # within a few steps of where the kill found the job.
    assert resumed > DISK_EVERY, f"resumed from {resumed}: disk, not the replica"
    assert resumed >= step_at_kill - 2, (step_at_kill, resumed)
    assert_same_weights(job.weights, world3_weights)
