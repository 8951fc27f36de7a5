"""What the node side of ssh and Slurm runs (issue 39): the node's own interpreter
with ``lazarus-rank``, ``~/.ssh/config`` routes, Slurm containers, the ranks' PATH
and PYTHONPATH per launcher."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from activities.nodes.slurm.container import (
    ContainerRefused,
    pyxis_problem,
    srun_options,
    task_argv,
    wrapped,
)
from activities.nodes.ssh.config import SSHConfigError, route
from activities.program import rank_paths, rendezvous_host
from lazarus.domain.spec import (
    ENV_NAME_PATTERN,
    JobSpec,
    NodeSpec,
    SlurmSpec,
    SpecError,
    SSHSpec,
    parse_spec,
)
from lazarus.rank.env_file import ENV_NAME

CONFIG = """\
Host gpu1
  HostName 10.0.0.5
  User alice
  Port 2222
  IdentityFile /keys/id_gpu
  ProxyJump bastion,carol@10.0.0.9:2200
Host bastion
  HostName bastion.example.org
  User bob
Host direct
  HostName 10.0.0.7
  ProxyJump none
"""


def ssh_spec(tmp_path: Path) -> SSHSpec:
    path = tmp_path / "config"
    path.write_text(CONFIG)
    return SSHSpec(config=str(path))


def test_an_alias_resolves_with_its_jump_chain(tmp_path: Path) -> None:
    found = route(NodeSpec(name="n", launcher="ssh", host="gpu1"), ssh_spec(tmp_path))
    target = found.target
    assert (target.host, target.port, target.user, target.identity_file) == (
        "10.0.0.5",
        2222,
        "alice",
        "/keys/id_gpu",
    )
    assert [(j.host, j.port, j.user) for j in found.jumps] == [
        ("bastion.example.org", 22, "bob"),
        ("10.0.0.9", 2200, "carol"),
    ]


def test_the_nodes_own_fields_win_over_the_config(tmp_path: Path) -> None:
    node = NodeSpec(
        name="n", launcher="ssh", host="gpu1", user="me", port=2022, identity_file="/k/mine"
    )
    target = route(node, ssh_spec(tmp_path)).target
    assert (target.user, target.port, target.identity_file) == ("me", 2022, "/k/mine")


def test_no_config_and_proxyjump_none_mean_a_direct_login(tmp_path: Path) -> None:
    assert route(NodeSpec(launcher="ssh", host="direct"), ssh_spec(tmp_path)).jumps == []
    plain = route(NodeSpec(launcher="ssh", host="h"), SSHSpec(config=str(tmp_path / "none")))
    assert (plain.target.host, plain.target.port, plain.jumps) == ("h", 22, [])


def test_a_bad_port_in_the_config_is_named(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text("Host x\n  Port twenty\n")
    with pytest.raises(SSHConfigError, match="port 'twenty'"):
        route(NodeSpec(launcher="ssh", host="x"), SSHSpec(config=str(path)))


def test_master_addr_is_the_aliases_hostname(tmp_path: Path) -> None:
    ssh = ssh_spec(tmp_path)
    assert rendezvous_host(NodeSpec(launcher="ssh", host="gpu1"), ssh) == "10.0.0.5"
    assert rendezvous_host(NodeSpec(launcher="slurm", host="gpu1"), ssh) == "gpu1"


def test_pyxis_is_refused_where_srun_lacks_it() -> None:
    slurm = SlurmSpec.model_validate(
        {"job_id": 1, "container": {"image": "nvcr.io/x:1", "mounts": ["/a:/a"]}}
    )
    assert pyxis_problem("usage: srun [OPTIONS]\n --jobid") is not None
    with pytest.raises(ContainerRefused, match="srun --help' has no --container-image"):
        srun_options(slurm, srun_help="usage: srun\n")
    assert srun_options(slurm, srun_help="--container-image=[USER@][REGISTRY#]IMAGE") == [
        "--container-image=nvcr.io/x:1",
        "--container-mounts=/a:/a",
    ]
    assert wrapped(slurm, ["python3"]) == ["python3"]


def test_apptainer_wraps_the_task_in_its_image() -> None:
    container = {
        "runtime": "apptainer",
        "image": "/img/train.sif",
        "mounts": ["/shared"],
        "options": ["--nv"],
    }
    slurm = SlurmSpec.model_validate({"job_id": 1, "container": container})
    argv = task_argv("/opt/py/bin/python", ["--gen-dir", "/g"])
    assert wrapped(slurm, argv) == [
        "apptainer",
        "exec",
        "--nv",
        "--bind",
        "/shared",
        "/img/train.sif",
        "/opt/py/bin/python",
        "-m",
        "lazarus.rank.slurm_task",
        "task",
        "--gen-dir",
        "/g",
    ]
    assert srun_options(slurm) == []


def test_pyxis_passes_only_its_own_options() -> None:
    with pytest.raises(ValueError, match="only srun's --container-\\* options"):
        SlurmSpec.model_validate(
            {"job_id": 1, "container": {"image": "x", "options": ["--export=ALL"]}}
        )


def spec_with(launcher: str, **node: object) -> tuple[NodeSpec, JobSpec]:
    nodes = [{"name": "a", "launcher": launcher, "host": "a", **node}]
    extra = {"slurm": {"job_id": 5}} if launcher == "slurm" else {}
    spec = parse_spec({"name": "j", "command": ["x"], "nodes": nodes, **extra}, "<t>")
    return spec.nodes[0], spec


def test_ranks_paths_per_launcher() -> None:
    root = Path("/checkout")
    source = {"PYTHONPATH": "/worker/extra"}
    for launcher, want_path in (
        ("local", os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])),
        ("ssh", ""),  # the node's own, filled in by the shim there
        ("slurm", os.environ["PATH"]),  # as srun exports it, no interpreter put first
    ):
        node, spec = spec_with(launcher)
        paths = rank_paths(spec, node, source, root)
        assert paths["PATH"] == want_path, launcher
        local = launcher == "local"
        assert paths["PYTHONPATH"] == ("/checkout:/worker/extra" if local else ""), launcher
    node, spec = spec_with("ssh", env={"PATH": "/node/bin", "PYTHONPATH": "/node/lib"})
    assert rank_paths(spec, node, source, root) == {
        "PATH": "/node/bin",
        "PYTHONPATH": "/node/lib",
    }


def test_a_nodes_env_is_checked_like_the_jobs() -> None:
    with pytest.raises(SpecError, match="node a: env: MASTER_ADDR is set by Lazarus"):
        spec_with("ssh", env={"MASTER_ADDR": "x"})
    with pytest.raises(SpecError, match="HF_TOKEN looks like a secret"):
        spec_with("ssh", env={"HF_TOKEN": "x"})
    with pytest.raises(SpecError, match="is not a program"):
        spec_with("ssh", python="my python")


def test_the_rank_helpers_env_file_names_are_the_specs() -> None:
    assert ENV_NAME.pattern == ENV_NAME_PATTERN.pattern
