"""The torchrun-compatible part of a rank's environment (issue 29): what
:func:`lazarus.domain.environment.torchrun_environment` sets, what the job's own
environment overrides, and that every variable which differs per rank or per
generation is in the sets that keep it out of a zygote and carry it to a rejoining
rank. The comparison with a real torchrun is tests/integration/test_torchrun_parity.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from activities.launcher import rank_environment
from activities.nodes.rundir import GenerationDir
from activities.nodes.slurm.agent import PER_RANK_VARIABLES
from activities.nodes.warm_starts import PER_RANK_ENV
from lazarus.domain import environment as env_names
from lazarus.domain.spec import JobSpec, NodeSpec, parse_spec
from lazarus.rank.rejoin_requests import _INTEGER_REJOIN_VARIABLES

NODES = [NodeSpec(name="a", host="10.0.0.1"), NodeSpec(name="b", host="10.0.0.2")]


def spec_for(tmp_path: Path, nproc: int = 2, **env: str) -> JobSpec:
    return parse_spec(
        {
            "name": "tr",
            "command": ["python", "t.py"],
            "nproc_per_node": nproc,
            "checkpoint_dir": "c",
            "recovery": {"max_restarts": 7},
            "env": env,
        },
        "<test>",
    ).resolved(tmp_path)


def environments(
    spec: JobSpec, tmp_path: Path, nodes: list[NodeSpec], generation: int = 1
) -> list[dict[str, str]]:
    gen = GenerationDir.of(tmp_path / "runs", generation)
    per_node = spec.nproc_per_node
    return [
        rank_environment(spec, nodes, rank // per_node, gen, rank, 29500, None, worker_env={})
        for rank in range(len(nodes) * per_node)
    ]


def test_every_rank_gets_torchruns_variables_with_torchruns_meaning(tmp_path: Path) -> None:
    envs = environments(spec_for(tmp_path), tmp_path, NODES, generation=3)
    for rank, env in enumerate(envs):
        assert env[env_names.RANK] == env[env_names.ROLE_RANK] == str(rank)
        assert env[env_names.LOCAL_RANK] == str(rank % 2)
        assert env[env_names.GROUP_RANK] == str(rank // 2)
        assert env[env_names.WORLD_SIZE] == env[env_names.ROLE_WORLD_SIZE] == "4"
        assert env[env_names.LOCAL_WORLD_SIZE] == env[env_names.GROUP_WORLD_SIZE] == "2"
        assert env[env_names.ROLE_NAME] == "default"
        assert env[env_names.MASTER_ADDR] == "10.0.0.1"
        assert env[env_names.RESTART_COUNT] == "2"
        assert env[env_names.MAX_RESTARTS] == "7"
        assert env[env_names.RUN_ID] == "tr"
        assert env[env_names.USE_AGENT_STORE] == "False"
        assert env[env_names.NCCL_ASYNC_ERROR_HANDLING] == "1"
        assert env[env_names.OMP_NUM_THREADS] == "1"


def test_the_jobs_own_values_win_where_torchrun_lets_the_users(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, OMP_NUM_THREADS="8", TORCH_NCCL_ASYNC_ERROR_HANDLING="3")
    env = environments(spec, tmp_path, NODES)[0]
    assert env[env_names.OMP_NUM_THREADS] == "8"
    assert env[env_names.NCCL_ASYNC_ERROR_HANDLING] == "3"
    gen = GenerationDir.of(tmp_path / "runs", 1)
    worker = {"OMP_NUM_THREADS": "4", "PATH": "/usr/bin"}  # a local node's worker
    local = rank_environment(spec_for(tmp_path), [NodeSpec()], 0, gen, 0, 1, None, worker)
    assert local[env_names.OMP_NUM_THREADS] == "4"


def test_one_rank_per_node_leaves_omp_num_threads_alone(tmp_path: Path) -> None:
    env = environments(spec_for(tmp_path, nproc=1), tmp_path, NODES)[0]
    assert env_names.OMP_NUM_THREADS not in env


@pytest.mark.parametrize("shrunk", [False, True])
def test_what_varies_is_per_rank_and_carried_to_a_rejoining_rank(
    tmp_path: Path, shrunk: bool
) -> None:
    spec = spec_for(tmp_path)
    first = environments(spec, tmp_path, NODES, generation=1)
    # The next generation: a new port and generation; with a shrink, one node fewer.
    gen = GenerationDir.of(tmp_path / "runs2", 2)
    nodes = NODES[1:] if shrunk else NODES
    second = rank_environment(spec, nodes, 0, gen, 0, 29600, None, worker_env={})
    torchrun = set(
        env_names.torchrun_environment(
            rank=0,
            nproc_per_node=2,
            node_index=0,
            nodes=1,
            master_addr="h",
            master_port=1,
            generation=1,
            max_restarts=0,
            job_id="j",
            job_env={},
        )
    )
    per_rank = {n for n in torchrun if len({env.get(n) for env in first}) > 1}
    per_generation = {n for n in torchrun if first[0].get(n) != second.get(n)}
    assert per_rank >= {env_names.ROLE_RANK, env_names.RANK}
    if shrunk:
        assert {env_names.GROUP_WORLD_SIZE, env_names.ROLE_WORLD_SIZE} <= per_generation
    assert per_rank | per_generation <= PER_RANK_ENV, "a zygote must not hold them"
    assert per_rank | per_generation <= set(env_names.REJOIN_VARIABLES)
    assert set(env_names.rank_identity(0, 2, 0)) <= PER_RANK_VARIABLES, "Slurm sets them"
    integers = {n for n in env_names.REJOIN_VARIABLES if n in torchrun and n != "MASTER_ADDR"}
    assert integers <= _INTEGER_REJOIN_VARIABLES


@pytest.mark.slow  # runs the Slurm task (no srun: its environment stands in for one)
def test_a_slurm_task_sets_its_ranks_own_variables(tmp_path: Path) -> None:
    """A Slurm step carries the shared variables; each task sets its rank's own, the
    same :func:`~lazarus.domain.environment.rank_identity` the launcher uses."""
    dump = tmp_path / "env.json"
    probe = f"import json, os; json.dump(dict(os.environ), open({str(dump)!r}, 'w'))"
    step_env = {**os.environ, "SLURMD_NODENAME": "n2", "SLURM_LOCALID": "1"}
    # What Slurm sets in n2's own one-node step: task 1 of 2, node 0 of 1.
    step_env.update(SLURM_PROCID="1", SLURM_NODEID="0", SLURM_NTASKS="2", SLURM_NNODES="1")
    step_env[env_names.ROLE_RANK] = "0"  # the template's, as the step would carry it
    argv = [sys.executable, "-m", "activities.nodes.slurm_task", "task", "--gen-dir"]
    argv += [str(tmp_path), "--nodes", "n1,n2", "--nproc", "2", "--workdir", str(tmp_path)]
    done = subprocess.run(
        [*argv, "--", sys.executable, "-c", probe], env=step_env, timeout=60, check=False
    )
    assert done.returncode == 0
    env = json.loads(dump.read_text())
    assert env[env_names.RANK] == env[env_names.ROLE_RANK] == "3"
    assert env[env_names.LOCAL_RANK] == "1" and env[env_names.GROUP_RANK] == "1"
    # Slurm's task variables say the same rank, not the step's own numbering.
    assert env["SLURM_PROCID"] == "3" and env["SLURM_LOCALID"] == "1"
    assert env["SLURM_NODEID"] == "1" and env["SLURM_NTASKS"] == "4" and env["SLURM_NNODES"] == "2"
