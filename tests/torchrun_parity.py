"""What torchrun sets, and the check that Lazarus sets the same: shared by the parity
tests on local nodes (tests/integration/test_torchrun_parity.py), ssh nodes
(tests/netns/test_ssh_parity.py) and Slurm nodes (tests/slurm/test_slurm_parity.py).

One probe rank (``tests/fixtures/env_probe.py``) runs under real torchrun and under
Lazarus, dumps its environment, joins a gloo group through ``env://`` and all-reduces
once, so the environment is proven to work, not only to be present.

Each variable torchrun adds is in exactly one of three tables: the same value under
both, the same meaning with a value each launcher picks (the reason given), or
torchrun-internal (the reason given). A variable a new torch adds is in none, and the
tests fail until someone decides which it is.

torchrun runs with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: its agent then shares no
store and rank 0 hosts the TCPStore, Lazarus's arrangement, so even
``TORCHELASTIC_USE_AGENT_STORE`` must be equal. (By default torchrun's agent shares its
store and sets ``"True"``, which under Lazarus would leave every rank waiting for a
store no one hosts.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lazarus.domain import environment as env_names
from lazarus.domain.ports import free_port

PROBE = Path(__file__).resolve().parent / "fixtures" / "env_probe.py"
MAX_RESTARTS = 3
"""Given to both: torchrun's ``--max-restarts`` and the spec's ``recovery.max_restarts``."""
WAIT_S = 120.0
"""For every rank's dump: torch imports and a gloo rendezvous on a busy machine."""

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
    env_names.MASTER_ADDR: "the first node's host: each launcher names it its own way "
    "(torchrun's standalone says localhost)",
    env_names.MASTER_PORT: "a free port, each launcher picks its own",
    env_names.RUN_ID: "torchrun: its --rdzv-id (a fresh uuid with --standalone); "
    "Lazarus: the job id",
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
    """The parent's environment, less what either launcher sets: torchrun's child
    environment is compared against it to find what torchrun added."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "ROLE_"))}
    for name in (env_names.OMP_NUM_THREADS, env_names.NCCL_ASYNC_ERROR_HANDLING):
        env.pop(name, None)
    env.update({"ENV_PROBE_DIR": str(probe_dir), "ENV_PROBE_INIT": "1"})
    return env


def under_torchrun(
    tmp_path: Path, nnodes: int = 1, nproc_per_node: int = 2
) -> tuple[dict[str, str], dict[int, dict[str, Any]]]:
    """The probe under real torchrun: ``--standalone`` on one node, or one agent per
    node (all on this machine) with c10d rendezvous, as a multi-node job starts.
    Returns the parent environment and each rank's dump."""
    probe_dir = tmp_path / "torchrun"
    probe_dir.mkdir()
    env = base_environment(probe_dir) | {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc_per_node)]
    argv += ["--max-restarts", str(MAX_RESTARTS)]
    if nnodes == 1:
        agents = [[*argv, "--standalone", str(PROBE)]]
    else:
        endpoint = f"127.0.0.1:{free_port()}"
        multi = ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
        agents = [[*argv, *multi, "--rdzv-id", "parity", str(PROBE)] for _ in range(nnodes)]
    running = [
        subprocess.Popen(a, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for a in agents
    ]
    try:
        outputs = [p.communicate(timeout=WAIT_S)[0] for p in running]
    finally:
        for process in running:
            process.kill()
            process.wait()
    for process, output in zip(running, outputs, strict=True):
        assert process.returncode == 0, output
    return env, wait_for_dumps(probe_dir, nnodes * nproc_per_node)


def assert_parity(
    parent: dict[str, str],
    torchrun: dict[int, dict[str, Any]],
    lazarus: dict[int, dict[str, Any]],
    job_id: str,
    master_addr: str,
) -> None:
    """Every variable torchrun added is known to the tables, and Lazarus sets each as
    the tables say, on every rank; both groups all-reduced across the whole world."""
    world = len(torchrun)
    assert len(lazarus) == world
    added = {k for k in torchrun[0]["env"] if k not in parent}
    tables = set(SAME_VALUE) | set(SAME_MEANING) | set(TORCHRUN_INTERNAL)
    assert added - tables == set(), "torchrun sets variables this test does not know"
    for rank in range(world):
        theirs, ours = torchrun[rank]["env"], lazarus[rank]["env"]
        assert torchrun[rank]["all_reduce"] == lazarus[rank]["all_reduce"] == world
        for (
            name
        ) in SAME_VALUE:  # set by neither (OMP_NUM_THREADS with one rank a node) is equal too
            assert ours.get(name) == theirs.get(name), f"rank {rank}: {name}"
        for name in SAME_MEANING:
            assert name in ours, f"rank {rank}: {name} unset"
        for name in TORCHRUN_INTERNAL:
            assert name not in ours, f"rank {rank}: {name} is torchrun's own"
        assert ours[env_names.RUN_ID] == job_id
        assert ours[env_names.MASTER_ADDR] == master_addr
