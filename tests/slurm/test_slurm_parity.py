"""Lazarus sets what torchrun sets, on Slurm nodes: the probe rank on two nodes of the
test cluster (one rank each, a job step per node in the holder allocation) against
torchrun with one agent per node and c10d rendezvous, compared by
:func:`tests.torchrun_parity.assert_parity`. Slurm's own variables are the step's
(tests/slurm/test_slurm_agent.py checks that they agree with the rank's)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from activities.launcher import launch_generation
from activities.nodes.slurm.agent import SlurmAgent
from lazarus.domain.contracts import LaunchRequest
from lazarus.domain.spec import parse_spec
from tests.torchrun_parity import (
    MAX_RESTARTS,
    PROBE,
    assert_parity,
    under_torchrun,
    wait_for_dumps,
)

HOST = socket.gethostname().split(".")[0]


@pytest.mark.timeout(300)
def test_slurm_nodes_get_every_variable_torchrun_sets(tmp_path: Path, allocation: int) -> None:
    parent, torchrun = under_torchrun(tmp_path, nnodes=2, nproc_per_node=1)
    probe_dir = tmp_path / "lazarus"
    probe_dir.mkdir()
    spec = parse_spec(
        {
            "name": "slurm-parity",
            "command": [sys.executable, str(PROBE)],
            "nproc_per_node": 1,
            "nodes": [{"name": node, "launcher": "slurm", "host": HOST} for node in ("n1", "n2")],
            "slurm": {"job_id": allocation},
            "checkpoint_dir": "ckpt",
            "recovery": {"max_restarts": MAX_RESTARTS},
            "env": {"ENV_PROBE_DIR": str(probe_dir), "ENV_PROBE_INIT": "1"},
        },
        "<test>",
    ).resolved(tmp_path)
    run_root = str(Path(spec.run_dir) / spec.job_id / "run-1")
    try:
        launch_generation(LaunchRequest(spec=spec, generation=1, run_root=run_root))
        lazarus = wait_for_dumps(probe_dir, 2)
    finally:
        for node in spec.nodes:
            SlurmAgent(node, spec.slurm).stop(run_root, None, grace_s=0.0, kill_wait_s=20.0)
    assert_parity(parent, torchrun, lazarus, spec.job_id, master_addr=HOST)
