"""Lazarus sets what torchrun sets, on ssh nodes: the probe rank on two ssh test hosts
(one rank each, gloo across the hosts' network) against torchrun with one agent per
node and c10d rendezvous, compared by :func:`tests.torchrun_parity.assert_parity`."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from activities.launcher import launch_generation
from activities.stop import stop_generations
from lazarus.domain.contracts import LaunchRequest, NodeAccess, StopRequest
from lazarus.domain.spec import parse_spec
from tests.netns.conftest import HostsFactory, ssh_nodes
from tests.torchrun_parity import (
    MAX_RESTARTS,
    PROBE,
    assert_parity,
    under_torchrun,
    wait_for_dumps,
)


@pytest.mark.timeout(300)
def test_ssh_nodes_get_every_variable_torchrun_sets(
    tmp_path: Path, test_hosts: HostsFactory
) -> None:
    parent, torchrun = under_torchrun(tmp_path, nnodes=2, nproc_per_node=1)
    hosts = test_hosts(2)
    probe_dir = tmp_path / "lazarus"
    probe_dir.mkdir()
    spec = parse_spec(
        {
            "name": "ssh-parity",
            "command": [sys.executable, str(PROBE)],
            "nproc_per_node": 1,
            "nodes": ssh_nodes(hosts),
            "ssh": {"known_hosts": str(hosts.known_hosts), "connect_timeout_s": 5},
            "checkpoint_dir": str(tmp_path / "ckpt"),
            "run_dir": str(tmp_path / "runs"),
            "recovery": {"max_restarts": MAX_RESTARTS},
            "env": {
                "ENV_PROBE_DIR": str(probe_dir),
                "ENV_PROBE_INIT": "1",
                "GLOO_SOCKET_IFNAME": hosts.hosts[0].interface,
            },
        },
        "<test>",
    ).resolved(tmp_path)
    run_root = Path(spec.run_dir) / spec.job_id / "run-1"
    try:
        launch_generation(LaunchRequest(spec=spec, generation=1, run_root=str(run_root)))
        lazarus = wait_for_dumps(probe_dir, 2)
    finally:
        stop = StopRequest(
            job_id=spec.job_id,
            run_root=str(run_root),
            access=NodeAccess.of(spec),
            grace_s=0,
            end_of_run=True,
        )
        asyncio.run(stop_generations(stop))
    assert_parity(parent, torchrun, lazarus, spec.job_id, master_addr=hosts.hosts[0].address)
