"""Lazarus sets what torchrun sets, on a local node: one probe rank, run under real
torchrun (``--standalone``, two ranks) and under the launcher (a local node, two ranks,
gloo on CPU), dumps its environment, and every variable torchrun's agent adds is
compared (the tables and the check: :mod:`tests.torchrun_parity`; the same check on ssh
and Slurm nodes: tests/netns/test_ssh_parity.py, tests/slurm/test_slurm_parity.py)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from activities.launcher import launch_generation
from activities.stop import stop_generations
from lazarus.domain import environment as env_names
from lazarus.domain.contracts import LaunchRequest, StopRequest
from lazarus.domain.spec import parse_spec
from tests.torchrun_parity import (
    MAX_RESTARTS,
    PROBE,
    SAME_VALUE,
    TORCHRUN_INTERNAL,
    assert_parity,
    under_torchrun,
    wait_for_dumps,
)


def under_lazarus(tmp_path: Path) -> tuple[str, dict[int, dict[str, Any]]]:
    probe_dir = tmp_path / "lazarus"
    probe_dir.mkdir()
    spec = parse_spec(
        {
            "name": "parity",
            "command": [sys.executable, str(PROBE)],
            "nproc_per_node": 2,
            "checkpoint_dir": "ckpt",
            "recovery": {"max_restarts": MAX_RESTARTS},
            "env": {"ENV_PROBE_DIR": str(probe_dir), "ENV_PROBE_INIT": "1"},
        },
        "<test>",
    ).resolved(tmp_path)
    try:
        launch_generation(LaunchRequest(spec=spec, generation=1))
        return spec.job_id, wait_for_dumps(probe_dir, 2)
    finally:
        run_root = str(Path(spec.run_dir) / spec.job_id)
        asyncio.run(stop_generations(StopRequest(job_id=spec.job_id, run_root=run_root)))


@pytest.mark.timeout(240)
def test_lazarus_sets_every_variable_torchrun_sets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's own environment reaches local ranks: keep it as torchrun's parent's.
    for name in (env_names.OMP_NUM_THREADS, env_names.NCCL_ASYNC_ERROR_HANDLING):
        monkeypatch.delenv(name, raising=False)
    parent, torchrun = under_torchrun(tmp_path)
    job_id, lazarus = under_lazarus(tmp_path)
    # Two ranks on one node: torchrun sets every variable of the tables (OMP_NUM_THREADS
    # too), so none may have gone missing from a newer torch.
    added = {k for k in torchrun[0]["env"] if k not in parent}
    assert set(SAME_VALUE) - set(TORCHRUN_INTERNAL) <= added, "a variable torchrun no longer sets"
    assert_parity(parent, torchrun, lazarus, job_id, master_addr="127.0.0.1")
