"""Prewarmed spares over ssh (issue 28): real sshd hosts in network namespaces.

With warm starts on, the launch of a generation starts the run's zygote on each spare
of the pool too (the shim's ``warm`` with ``prewarm``), not waiting for it, so the
launch that swaps the spare in after a node loss forks its ranks instead of waiting
for a fresh interpreter to import ``preload``.

- The launcher alone, with a torch-free stand-in rank: generation 1 prewarms h3's
  zygote in h3's own namespace; h2 dies; generation 2 on h1 and h3 forks h3's ranks
  from that zygote; the end of the run stops it.
- The whole stack with the DDP example over gloo and ``preload: [torch]``, 2 hosts x 2
  ranks and a spare: h2 is killed, its ranks start warm on h3, h1's restart warm, the
  weights are a fault-free run's, and no zygote is left on any host.

The hosts share this machine's filesystem and pid space, so the tests read the
nodes' run directories and /proc directly."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from activities.launcher import launch_generation
from activities.nodes import zygote_client
from activities.nodes.procfs import is_alive
from activities.nodes.rundir import read_json
from activities.nodes.zygote_socket import ZYGOTE_DIR_PREFIX, zygote_dir
from activities.stop import stop_generations
from infra.testhosts import TestHosts
from lazarus.domain.contracts import LaunchRequest, NodeAccess, StopRequest
from lazarus.domain.spec import JobSpec, WarmStartSpec, parse_spec
from tests.e2e.conftest import STEPS, Job, assert_same_weights
from tests.netns.conftest import HostsFactory, ssh_nodes
from tests.netns.test_ssh_rejoin import describe, resilient_ssh_spec, ssh_options
from tests.reference_weights import shared_reference
from workflows.state import Phase

FAKE_RANK = Path(__file__).resolve().parents[1] / "fixtures" / "fake_rank.py"
StartJob = Callable[..., Awaitable[Job]]


def live_zygotes(run_root: Path) -> list[str]:
    """Every zygote of the runs under ``run_root`` still alive (start ticks checked)."""
    alive = []
    for directory in run_root.glob(f"**/{ZYGOTE_DIR_PREFIX}*"):
        info = zygote_client.read_zygote(directory)
        if info is not None and is_alive(info.pid, info.start_ticks):
            alive.append(f"{directory.name} (pid {info.pid})")
    return alive


def wait_serving(directory: Path, timeout_s: float = 90) -> zygote_client.ZygoteInfo:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = zygote_client.read_zygote(directory)
        if info is not None and info.state != "starting":
            return info
        time.sleep(0.1)
    pytest.fail(f"the zygote in {directory} did not serve within {timeout_s} s")


# ------------------------------------------------------------------ the launcher alone


@pytest.fixture
def fake_job(tmp_path: Path, test_hosts: HostsFactory) -> Iterator[tuple[JobSpec, TestHosts]]:
    """h1 and h2 run ranks, h3 is the spare; teardown ends the run on every host."""
    hosts = test_hosts(3)
    entries = ssh_nodes(hosts)
    spec = parse_spec(
        {
            "name": f"sshspare-{os.getpid()}",
            "command": [sys.executable, str(FAKE_RANK)],
            "workdir": str(tmp_path),
            "nproc_per_node": 2,
            "nodes": entries[:2],
            "spares": entries[2:],
            "checkpoint_dir": str(tmp_path / "ckpt"),
            "run_dir": str(tmp_path / "runs"),
            "env": {"FAKE_STEPS": "100000", "FAKE_STEP_S": "0.1"},
            "ssh": ssh_options(hosts),
            "warm_start": {"preload": ["json"], "standby": 1},
        },
        "<test>",
    ).resolved(tmp_path)
    yield spec, hosts
    asyncio.run(
        stop_generations(
            StopRequest(
                job_id=spec.job_id,
                run_root=str(Path(spec.run_dir) / spec.job_id),
                access=NodeAccess.of(spec, [*spec.nodes, *spec.spares]),
                grace_s=0,
                end_of_run=True,
            )
        )
    )


@pytest.mark.timeout(240)
def test_the_spare_is_prewarmed_and_its_ranks_fork_after_a_node_loss(
    fake_job: tuple[JobSpec, TestHosts],
) -> None:
    spec, hosts = fake_job
    h1, h2 = spec.nodes
    [h3] = spec.spares
    run_root = Path(spec.run_dir) / spec.job_id / "run-a"

    first = launch_generation(
        LaunchRequest(spec=spec, generation=1, run_root=str(run_root), prewarm=[h3])
    )
    assert first.warm_start is not None, first
    assert first.warm_start.warm_ranks == [0, 1, 2, 3], first.warm_start
    assert first.warm_start.prewarmed == ["h3"], first.warm_start
    assert first.warm_start.not_prewarmed == []
    assert {r.node for r in first.ranks} == {"h1", "h2"}, "the spare runs no rank"
    spare = zygote_dir(run_root, "h3")
    prewarmed = wait_serving(spare)
    assert prewarmed.state == "serving", prewarmed.reason
    # Started on the spare, through its shim: in h3's network namespace.
    assert prewarmed.pid in hosts.pids("h3")

    hosts.kill_host("h2")
    stopped = asyncio.run(
        stop_generations(
            StopRequest(
                job_id=spec.job_id,
                run_root=str(run_root),
                access=NodeAccess.of(spec, [h1]),
                grace_s=0,
            )
        )
    )
    assert stopped.unreachable == []

    second = launch_generation(
        LaunchRequest(spec=spec, generation=2, run_root=str(run_root), nodes=[h1, h3])
    )
    assert second.warm_start is not None, second
    assert second.warm_start.cold_ranks == [], second.warm_start.fallback_reasons
    assert second.warm_start.warm_ranks == [0, 1, 2, 3]
    on_spare = [r for r in second.ranks if r.node == "h3"]
    assert [r.rank for r in on_spare] == [2, 3]
    for rank in on_spare:
        assert is_alive(rank.pid, rank.start_ticks) and rank.pid in hosts.pids("h3")
    again = zygote_client.read_zygote(spare)
    assert again is not None and again.pid == prewarmed.pid, "forked by the prewarmed zygote"

    asyncio.run(
        stop_generations(
            StopRequest(
                job_id=spec.job_id,
                run_root=str(run_root),
                access=NodeAccess.of(spec, [h1, h2, h3]),
                grace_s=0,
                end_of_run=True,
            )
        )
    )
    assert live_zygotes(run_root) == []
    assert not any(is_alive(r.pid, r.start_ticks) for r in second.ranks)


# ------------------------------------------------------------------- the whole stack


@pytest.fixture(scope="module")
def world4_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_reference(tmp_path_factory, STEPS, world_size=4)


@pytest.mark.timeout(600)
async def test_a_lost_host_is_replaced_by_a_prewarmed_spare_whose_ranks_start_warm(
    test_hosts: HostsFactory, start_job: StartJob, tmp_path: Path, world4_weights: Path
) -> None:
    from infra import chaos

    hosts = test_hosts(3)
    spec = resilient_ssh_spec(tmp_path, hosts, nodes=2, spares=1, rejoin_s=60, pg_timeout_s=30)
    # The default for a node loss: the whole generation restarts, every rank warm (h1's
    # from its own zygote, h2's from the spare's prewarmed one). rejoin.node_loss is
    # tests/netns/test_ssh_rejoin.py's.
    assert spec.rejoin is not None
    spec = spec.model_copy(
        update={
            "warm_start": WarmStartSpec(preload=["torch"], standby=1),
            "rejoin": spec.rejoin.model_copy(update={"node_loss": False}),
        }
    )
    job = await start_job(spec)
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 20)
    [first] = [read_json(p) or {} for p in job.run_root.glob("*/gen-00001/launch.json")]
    assert first["warm_start"]["prewarmed"] == ["h3"], first["warm_start"]
    [spare] = list(job.run_root.glob(f"*/{ZYGOTE_DIR_PREFIX}h3"))
    await asyncio.to_thread(wait_serving, spare, 240)
    hosts.kill_host("h2")
    status = await job.result(timeout_s=420)

    assert status.phase == Phase.SUCCEEDED, status
    incident = status.incidents[0]
    assert incident.kind == "node_lost" and incident.node == "h2", describe(status.incidents)
    [launched] = [read_json(p) or {} for p in job.run_root.glob("*/gen-00002/launch.json")]
    nodes = {r["rank"]: r["node"] for r in launched["ranks"]}
    assert nodes == {0: "h1", 1: "h1", 2: "h3", 3: "h3"}, "h2's ranks started on the spare"
    assert incident.restart_path == "whole_generation", incident.evidence
    started = launched["warm_start"]
    assert started["warm_ranks"] == [0, 1, 2, 3], describe(status.incidents)
    assert started["cold_ranks"] == [], started["fallback_reasons"]
    assert any(e.startswith("warm start: ") for e in incident.evidence), incident.evidence
    assert_same_weights(job.weights, world4_weights)
    assert live_zygotes(job.run_root) == [], "a zygote outlived the job"
