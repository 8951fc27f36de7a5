"""Lazarus sets what torchrun sets: one probe rank, run under real torchrun and under
the launcher (local node, two ranks, gloo on CPU), dumps its environment, and every
variable torchrun's agent adds is compared.

Each variable torchrun adds is in exactly one of three tables below: the same value
under both, the same meaning with a value each launcher picks (the reason given), or
torchrun-internal (the reason given). A variable a new torch adds is in none, and the
test fails until someone decides which it is. Both runs also join a gloo process group
through ``env://`` and all-reduce, so the environment is proven to work, not only to
be present (``TORCHELASTIC_USE_AGENT_STORE`` is the one that decides it).

torchrun runs with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: its agent then shares no
store and rank 0 hosts the TCPStore, Lazarus's arrangement, so even
``TORCHELASTIC_USE_AGENT_STORE`` must be equal. (By default torchrun's agent shares its
store and sets ``"True"``, which under Lazarus would leave every rank waiting for a
store no one hosts.)
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from activities.launcher import launch_generation
from activities.stop import stop_generations
from lazarus.domain import environment as env_names
from lazarus.domain.contracts import LaunchRequest, StopRequest
from lazarus.domain.spec import parse_spec

PROBE = Path(__file__).resolve().parents[1] / "fixtures" / "env_probe.py"
MAX_RESTARTS = 3
"""Given to both: torchrun's ``--max-restarts`` and the spec's ``recovery.max_restarts``."""
WAIT_S = 90.0
"""For both ranks' dumps: two torch imports and a gloo rendezvous on a busy machine."""

SAME_VALUE = (
    env_names.RANK,
    env_names.LOCAL_RANK,
    env_names.WORLD_SIZE,
    env_names.LOCAL_WORLD_SIZE,
    env_names.GROUP_RANK,
    env_names.GROUP_WORLD_SIZE,
    env_names.ROLE_NAME,
    env_names.ROLE_RANK,
    env_names.ROLE_WORLD_SIZE,
    env_names.RESTART_COUNT,
    env_names.MAX_RESTARTS,
    env_names.USE_AGENT_STORE,
    env_names.NCCL_ASYNC_ERROR_HANDLING,
    env_names.OMP_NUM_THREADS,
)
SAME_MEANING = {
    env_names.MASTER_ADDR: "the first node's host: torchrun's standalone says localhost, "
    "Lazarus the node's address (127.0.0.1 here)",
    env_names.MASTER_PORT: "a free port, each launcher picks its own",
    env_names.RUN_ID: "torchrun --standalone: a fresh uuid; Lazarus: the job id",
}
TORCHRUN_INTERNAL = {
    "TORCHELASTIC_ERROR_FILE": "a per-attempt file in the agent's temporary directory "
    "that @record writes for the agent to read; Lazarus reads the rank's log and exit "
    "file instead",
    "TORCHELASTIC_SIGNALS_TO_HANDLE": "the agent's own setting (which signals it "
    "forwards), put in its environment and inherited; no rank reads it",
}


def wait_for_dumps(directory: Path, world: int) -> dict[int, dict[str, Any]]:
    deadline = time.monotonic() + WAIT_S
    paths = [directory / f"rank-{rank}.json" for rank in range(world)]
    while time.monotonic() < deadline and not all(p.exists() for p in paths):
        time.sleep(0.1)
    missing = [p.name for p in paths if not p.exists()]
    assert not missing, f"no dump from {missing} within {WAIT_S}s"
    return {rank: json.loads(p.read_text()) for rank, p in enumerate(paths)}


def base_environment(probe_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "ROLE_"))}
    for name in (env_names.OMP_NUM_THREADS, env_names.NCCL_ASYNC_ERROR_HANDLING):
        env.pop(name, None)
    env.update({"ENV_PROBE_DIR": str(probe_dir), "ENV_PROBE_INIT": "1"})
    return env


def under_torchrun(tmp_path: Path) -> tuple[dict[str, str], dict[int, dict[str, Any]]]:
    probe_dir = tmp_path / "torchrun"
    probe_dir.mkdir()
    env = base_environment(probe_dir) | {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    argv += ["--standalone", "--max-restarts", str(MAX_RESTARTS), str(PROBE)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return env, wait_for_dumps(probe_dir, 2)


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

    added = {k for k in torchrun[0]["env"] if k not in parent}
    tables = set(SAME_VALUE) | set(SAME_MEANING) | set(TORCHRUN_INTERNAL)
    assert added - tables == set(), "torchrun sets variables this test does not know"
    assert tables - set(TORCHRUN_INTERNAL) <= added, "a variable torchrun no longer sets"

    for rank in (0, 1):
        theirs, ours = torchrun[rank]["env"], lazarus[rank]["env"]
        assert torchrun[rank]["all_reduce"] == lazarus[rank]["all_reduce"] == 2
        for name in SAME_VALUE:
            assert ours.get(name) == theirs[name], f"rank {rank}: {name}"
        for name in SAME_MEANING:
            assert name in ours, f"rank {rank}: {name} unset"
        for name in TORCHRUN_INTERNAL:
            assert name not in ours, f"rank {rank}: {name} is torchrun's own"
        assert ours[env_names.RUN_ID] == job_id
        assert ours[env_names.MASTER_ADDR] == "127.0.0.1"
