"""Multi-node jobs over real SSH: 3 nodes + 1 spare, each a network namespace with
its own sshd, running a real DDP job over gloo. The controller (dev server and
worker) runs in the root namespace and reaches the nodes across a bridge."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from infra import chaos
from infra.testhosts import TestHosts
from lazarus.app.local_stack import LocalStack
from lazarus.domain.spec import JobSpec
from tests import tiers
from tests.e2e.conftest import STEPS, Job, assert_same_weights, ddp_spec
from tests.netns.conftest import HostsFactory, ssh_nodes
from tests.reference_weights import shared_reference
from workflows.state import Phase

StartJob = Callable[..., Awaitable[Job]]


@pytest.fixture(scope="module")
def world3_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_reference(tmp_path_factory, STEPS, world_size=3)


def ssh_spec(
    tmp_path: Path, hosts: TestHosts, nodes: int = 3, spares: int = 1, **overrides: object
) -> JobSpec:
    entries = ssh_nodes(hosts)
    overrides.setdefault(
        "ssh",
        {"known_hosts": str(hosts.known_hosts), "connect_timeout_s": 2, "command_timeout_s": 2},
    )
    return ddp_spec(
        tmp_path,
        steps=STEPS,
        step_time=0.1,
        nproc_per_node=1,
        nodes=entries[:nodes],
        spares=entries[nodes : nodes + spares],
        env={"GLOO_SOCKET_IFNAME": hosts.hosts[0].interface},
        node_timeout_s=4,
        **overrides,
    )


def ranks_on(hosts: TestHosts, name: str, run_root: Path) -> list[int]:
    """The job's rank processes, of any generation, in a host's namespace: by the
    ranks' own pid records, since a rank forked warm from the zygote carries the
    zygote's command line, not the script's."""
    return sorted(set(hosts.pids(name)) & set(chaos.live_rank_processes(run_root)))


@tiers.twin_of(
    "test_killed_host_is_replaced_by_the_spare",
    "without the fault (every ssh job test here runs one across the hosts to the reference)",
)
@pytest.mark.timeout(240)
async def test_fault_free_run_across_hosts(
    test_hosts: HostsFactory, start_job: StartJob, tmp_path: Path, world3_weights: Path
) -> None:
    hosts = test_hosts(4)
    job = await start_job(ssh_spec(tmp_path, hosts))
    status = await job.result(timeout_s=200)
    assert status.phase == Phase.SUCCEEDED and status.incidents == []
    assert status.world_size == 3 and status.nodes.active == ["h1", "h2", "h3"]
    assert_same_weights(job.weights, world3_weights)


@pytest.mark.timeout(360)  # 175 s once in CI, with a collateral restart
@pytest.mark.parametrize(
    "victim",
    [
        pytest.param(
            "h2",
            id="worker-node",
            marks=tiers.twin_of("the master-node case", "a host that holds no rendezvous"),
        ),
        pytest.param("h1", id="master-node"),
    ],
)
async def test_killed_host_is_replaced_by_the_spare(
    test_hosts: HostsFactory,
    start_job: StartJob,
    tmp_path: Path,
    world3_weights: Path,
    victim: str,
) -> None:
    hosts = test_hosts(4)
    job = await start_job(ssh_spec(tmp_path, hosts))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 15)
    killed_at = time.time()
    hosts.kill_host(victim)
    status = await job.result(timeout_s=300)
    assert status.phase == Phase.SUCCEEDED
    # The kill is the first incident and the only node lost. On CI's shared 2 cores
    # the new generation once met a second, recovered incident (its kind was not
    # printed); such a collateral restart may follow, but it quarantines nothing.
    incident, *collateral = status.incidents
    assert incident.kind == "node_lost" and incident.node == victim, status.incidents
    assert all(i.kind != "node_lost" for i in collateral), status.incidents
    # The fault is dated at the host's last answer, before the kill: a poll interval
    # on a quiet machine, more when a loaded machine stretches a poll's round trip.
    assert incident.fault_at >= killed_at - 3
    assert victim not in status.nodes.active and "h4" in status.nodes.active
    assert [q.node for q in status.nodes.quarantined] == [victim]
    assert_same_weights(job.weights, world3_weights)


@pytest.mark.timeout(240)
async def test_partition_that_heals_is_fenced(
    test_hosts: HostsFactory, start_job: StartJob, tmp_path: Path, world3_weights: Path
) -> None:
    hosts = test_hosts(4)
    job = await start_job(ssh_spec(tmp_path, hosts))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 15)
    hosts.partition("h2")
    assert ranks_on(hosts, "h2", job.run_root), "a partitioned node's ranks keep running"
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 3, 120, 2)
    hosts.heal("h2")
    status = await job.result(timeout_s=200)
    assert status.phase == Phase.SUCCEEDED
    [quarantined] = status.nodes.quarantined
    assert quarantined.node == "h2" and quarantined.fenced
    assert ranks_on(hosts, "h2", job.run_root) == [], "h2's stale generation was killed on heal"
    assert_same_weights(job.weights, world3_weights)


@tiers.twin_of(
    "test_nodes_local.py::test_preflight_failure_replaces_the_node_before_launch",
    "over ssh: the preflight runs through the node agent, which ssh jobs walk in every test",
)
@pytest.mark.timeout(240)
async def test_preflight_failure_on_one_node_replaces_it_before_launch(
    test_hosts: HostsFactory, start_job: StartJob, tmp_path: Path, world3_weights: Path
) -> None:
    hosts = test_hosts(4)
    bad = hosts.host("h3").address
    spec = ssh_spec(
        tmp_path,
        hosts,
        preflight={"health_command": ["sh", "-c", f"! ip -4 addr | grep -q 'inet {bad}/'"]},
    )
    job = await start_job(spec)
    status = await job.result(timeout_s=200)
    assert status.phase == Phase.SUCCEEDED and status.generation == 1, status.incidents
    assert status.nodes.active == ["h1", "h2", "h4"]
    assert [q.node for q in status.nodes.quarantined] == ["h3"]
    assert_same_weights(job.weights, world3_weights)


@tiers.twin_of(
    "test_nodes_local.py::test_no_spare_needs_operator_until_a_node_is_returned",
    "over ssh: the decision is the workflow's, whatever the transport",
)
@pytest.mark.timeout(240)
async def test_no_spare_and_no_shrinking_needs_operator(
    test_hosts: HostsFactory, start_job: StartJob, tmp_path: Path
) -> None:
    hosts = test_hosts(3)
    job = await start_job(ssh_spec(tmp_path, hosts, spares=0))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 10)
    hosts.kill_host("h3")
    status = await job.wait_phase(Phase.NEEDS_OPERATOR, timeout_s=120)
    assert status.operator_reason and "h3" in status.operator_reason
    assert [q.node for q in status.nodes.quarantined] == ["h3"]


def cli(stack: LocalStack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lazarus.app.cli", *args],
        env=stack.worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.timeout(120)
def test_bad_hosts_are_refused_at_start_and_nothing_runs(
    test_hosts: HostsFactory, stack: LocalStack, tmp_path: Path
) -> None:
    import yaml

    hosts = test_hosts(2)
    wrong_keys = tmp_path / "wrong_known_hosts"
    other_key = tmp_path / "other"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True
    )
    public = (other_key.with_suffix(".pub")).read_text().split()
    wrong_keys.write_text("".join(f"{h.address} {public[0]} {public[1]}\n" for h in hosts.hosts))
    cases = {
        "wrong host key": {"ssh": {"known_hosts": str(wrong_keys), "connect_timeout_s": 2}},
        "unknown host key": {
            "ssh": {"known_hosts": str(tmp_path / "empty"), "connect_timeout_s": 2}
        },
        "bad identity": {"identity_file": str(tmp_path / "missing_key")},
        # An address on our own test bridge that no host holds: nothing leaves this machine.
        "unreachable": {"host": hosts.hosts[0].address.rsplit(".", 1)[0] + ".99"},
    }
    for label, change in cases.items():
        spec = ssh_spec(tmp_path, hosts, nodes=2, spares=0)
        data = spec.model_dump(mode="json")
        if "ssh" in change:
            data["ssh"].update(change["ssh"])  # type: ignore[arg-type]
        else:
            data["nodes"][1].update(change)
        spec_file = tmp_path / f"{label.replace(' ', '-')}.yaml"
        spec_file.write_text(yaml.safe_dump(data))
        done = cli(stack, "start", str(spec_file))
        assert done.returncode == 2, (label, done.stdout, done.stderr)
        assert f"{spec_file}: nodes[" in done.stderr, (label, done.stderr)
        assert not Path(spec.run_dir).exists(), f"{label}: nothing may be launched"
