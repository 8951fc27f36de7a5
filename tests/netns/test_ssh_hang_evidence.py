"""A hang on ssh nodes carries each rank's stack and the flight recorder (issue 38).

Two real sshd hosts in network namespaces, one rank on each, over gloo
(``lazarus.rank.torch.init_process_group``: the flight recorder is on and the
watcher answers). After five all-reduces rank 0 enters a sixth; rank 1, on h2,
SIGSTOPs itself and never joins. The supervisor (the fixed ``hang_timeout_s`` clock:
the budget is not what is tested here) declares the hang and, before the stop, asks
each node over ssh for its evidence (the shim's ``hang-evidence``: py-spy and the
flight recorder read on the node by the node's python). The incident carries the
stopped rank's stack, its peer's stack inside the collective, and the recorder's
line naming the collective and the rank that gave no dump."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.launcher import launch_generation
from activities.nodes.agent import HANG_EVIDENCE_TIMEOUT_S
from activities.stop import stop_generations
from infra import chaos
from infra.testhosts import TestHosts
from lazarus.domain.contracts import LaunchRequest, NodeAccess, StopRequest, SuperviseRequest
from lazarus.domain.spec import JobSpec, parse_spec
from lazarus.rank.rank_stacks import py_spy
from tests.netns.conftest import HostsFactory, ssh_nodes

pytestmark = pytest.mark.timeout(240)

SCRIPT = """
import os, signal, time
import torch, torch.distributed as dist
import lazarus.rank as lz
import lazarus.rank.torch as lt
lt.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
for step in range(1, 6):
    dist.all_reduce(t)
    lz.heartbeat(step)
    time.sleep(0.2)
if rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)  # never joins the next collective
dist.all_reduce(t)  # rank 0 waits here for rank 1
"""


@pytest.fixture
def hung_job(tmp_path: Path, test_hosts: HostsFactory) -> Iterator[tuple[JobSpec, TestHosts]]:
    hosts = test_hosts(2)
    spec = parse_spec(
        {
            "name": f"ssh-hang-evidence-{os.getpid()}",
            "command": [sys.executable, "-c", SCRIPT],
            "workdir": str(tmp_path),
            "nproc_per_node": 1,
            "nodes": ssh_nodes(hosts),
            "run_dir": str(tmp_path / "runs"),
            "checkpoint_dir": str(tmp_path / "ckpt"),
            "env": {"GLOO_SOCKET_IFNAME": hosts.hosts[0].interface},
            "ssh": {
                "known_hosts": str(hosts.known_hosts),
                "connect_timeout_s": 2,
                "command_timeout_s": 5,
            },
            "health": {
                "startup_timeout_s": 120.0,
                "hang_timeout_s": 4.0,
                "poll_interval_s": 0.2,
                "hang_budget": {"mode": "off"},
            },
        },
        "<test>",
    ).resolved(tmp_path)
    root = Path(spec.run_dir) / spec.job_id
    try:
        yield spec, hosts
    finally:
        # The stop sends SIGCONT with SIGTERM: the stopped rank dies too.
        asyncio.run(
            stop_generations(
                StopRequest(
                    job_id=spec.job_id,
                    run_root=str(root),
                    access=NodeAccess.of(spec),
                    grace_s=0,
                )
            )
        )
        assert chaos.live_rank_processes(root) == []


def test_a_stopped_rank_on_an_ssh_node_leaves_its_stack_in_the_incident(
    hung_job: tuple[JobSpec, TestHosts],
) -> None:
    from activities.supervise import supervise

    spec, hosts = hung_job
    launched = launch_generation(LaunchRequest(spec=spec, generation=1))
    assert [(r.rank, r.node) for r in launched.ranks] == [(0, "h1"), (1, "h2")]
    assert launched.ranks[1].pid in hosts.pids("h2"), "rank 1 runs on the remote host h2"
    request = SuperviseRequest(
        job_id=spec.job_id,
        generation=1,
        run_dir=launched.run_dir,
        world_size=spec.world_size,
        nproc_per_node=spec.nproc_per_node,
        health=spec.health,
        access=NodeAccess.of(spec),
        report_after_s=200.0,
    )
    outcome = asyncio.run(ActivityEnvironment().run(supervise, request))
    returned_after = time.time()
    assert outcome.failure is not None and outcome.failure.kind == "hang", outcome
    evidence = outcome.failure.evidence
    print("\n".join(evidence))
    # The evidence (logs, stacks, recorder: both nodes over ssh at once) before the stop.
    took = returned_after - outcome.failure.detected_at
    print(f"detection to the supervisor's return: {took:.2f} s")
    assert took < HANG_EVIDENCE_TIMEOUT_S + 3, took
    assert outcome.failure.rank == 1, evidence  # the stopped one is certain
    assert not [line for line in evidence if line.startswith("rank stacks")], evidence
    stacks = [line for line in evidence if " stack, innermost first: " in line]
    assert py_spy() is not None, "the test venv has py-spy (the diagnose extra)"
    pid0, pid1 = launched.ranks[0].pid, launched.ranks[1].pid
    assert stacks[0].startswith(f"rank 1 (pid {pid1}, stopped) stack"), evidence
    assert "<module> (<string>:" in stacks[0], stacks[0]
    assert stacks[1].startswith(f"rank 0 (pid {pid0}) stack"), evidence
    assert "all_reduce" in stacks[1], stacks[1]  # inside the collective rank 1 never joined
    recorder = [line for line in evidence if line.startswith("flight recorder, group ")]
    assert recorder, evidence
    assert "gloo:all_reduce #6" in recorder[0] and "entered by rank 0" in recorder[0], recorder
    assert "no dump from rank 1 (stopped" in recorder[0], recorder
    assert "flight-recorder on nodes h2, h1)" in recorder[-1], recorder  # read there
    assert evidence.index(stacks[0]) == 1, evidence  # right after the line naming the hang
