"""Secrets reach ranks without entering workflow history: ``pass_env`` and ``env_from_file``.

The spec is the workflow input (history, Web UI), so it holds only names and paths;
the values are read on the worker (``pass_env``) or on the node (``env_from_file``) at
launch. A missing name or a file others can read is a launch error that names it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from activities.launcher import LaunchRefused, rank_env_file, rank_environment
from activities.nodes.agent import PreflightRequest
from activities.nodes.local.checks import run_local_preflight
from activities.nodes.rundir import GenerationDir
from activities.nodes.secret_env import (
    SecretEnvError,
    parse_env_lines,
    passed_env,
    read_env_file,
)
from activities.nodes.slurm.commands import client_environment
from lazarus.domain.api import API_KEY_ENV
from lazarus.domain.contracts import LaunchRequest
from lazarus.domain.spec import JobSpec, NodeSpec


def job(tmp_path: Path, **fields: object) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "secrets",
            "command": ["python", "train.py"],
            "workdir": str(tmp_path),
            "checkpoint_dir": str(tmp_path / "ckpt"),
            **fields,
        }
    )


def env_for(spec: JobSpec, tmp_path: Path, node: NodeSpec | None = None) -> dict[str, str]:
    nodes = [node or NodeSpec()]
    gen = GenerationDir.of(tmp_path / "runs", 1)
    return rank_environment(spec, nodes, 0, gen, 0, 29500, None)


def secrets_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "job.env"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_pass_env_reads_the_worker_environment_at_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "from-the-worker")
    spec = job(tmp_path, pass_env=["WANDB_API_KEY"])
    ssh = NodeSpec(name="remote", launcher="ssh", host="10.0.0.2")
    for node in (None, ssh):
        assert env_for(spec, tmp_path, node)["WANDB_API_KEY"] == "from-the-worker"
    # Only the name is in the workflow input.
    request = LaunchRequest(spec=spec, generation=1).model_dump_json()
    assert "from-the-worker" not in request and "WANDB_API_KEY" in request


def test_missing_pass_env_is_a_launch_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HF_TOKEN", "x")
    spec = job(tmp_path, pass_env=["HF_TOKEN", "WANDB_API_KEY"])
    with pytest.raises(LaunchRefused, match="pass_env: WANDB_API_KEY is not set in the worker"):
        env_for(spec, tmp_path)
    with pytest.raises(SecretEnvError, match="A, B are not set"):
        passed_env(["A", "B"], {})


def test_env_from_file_on_a_local_node_is_read_here_under_env_and_lazarus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARED", "worker")
    path = secrets_file(tmp_path, "HF_TOKEN=hf_abc\nSHARED=file\nRANK=7\n# note\n")
    spec = job(tmp_path, env_from_file=str(path), env={"NCCL_DEBUG": "INFO"})
    env = env_for(spec, tmp_path)
    assert env["HF_TOKEN"] == "hf_abc" and env["SHARED"] == "file"
    assert env["RANK"] == "0"  # Lazarus's own variables always win
    assert rank_env_file(spec, NodeSpec()) is None
    overridden = job(tmp_path, env_from_file=str(path), env={"SHARED": "spec"})
    assert env_for(overridden, tmp_path)["SHARED"] == "spec"


def test_env_from_file_on_an_ssh_node_is_left_to_the_node(tmp_path: Path) -> None:
    ssh = NodeSpec(name="remote", launcher="ssh", host="10.0.0.2")
    spec = job(tmp_path, env_from_file="/etc/lazarus/job.env")  # not on this machine
    env = env_for(spec, tmp_path, ssh)
    assert "HF_TOKEN" not in env
    assert rank_env_file(spec, ssh) == "/etc/lazarus/job.env"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o602])
def test_env_from_file_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    path = secrets_file(tmp_path, "HF_TOKEN=hf_abc\n", mode)
    with pytest.raises(LaunchRefused) as caught:
        env_for(job(tmp_path, env_from_file=str(path)), tmp_path)
    message = str(caught.value)
    assert f"env_from_file: {path} is readable or writable by group or others" in message
    assert f"chmod 600 {path}" in message and "hf_abc" not in message


def test_env_from_file_problems_name_the_file_not_the_secret(tmp_path: Path) -> None:
    with pytest.raises(SecretEnvError, match="does not exist"):
        read_env_file(str(tmp_path / "missing.env"))
    with pytest.raises(SecretEnvError, match="is not a regular file"):
        read_env_file(str(tmp_path))
    with pytest.raises(SecretEnvError) as caught:
        parse_env_lines("A=1\nexport B=hunter2\n", "job.env")
    assert "job.env line 2: expected KEY=VALUE" in str(caught.value)
    assert "hunter2" not in str(caught.value)
    assert parse_env_lines("A=x=y\n\n#c\nB=\nC= spaced \n", "f") == {
        "A": "x=y",
        "B": "",
        "C": " spaced ",
    }


def test_the_worker_temporal_api_key_is_not_passed_to_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(API_KEY_ENV, "worker-credential")
    env = env_for(job(tmp_path), tmp_path)
    assert API_KEY_ENV not in env
    assert "worker-credential" not in json.dumps(env)


@pytest.mark.slow  # runs a health command
def test_the_health_command_does_not_get_the_workers_api_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preflight health command follows the ranks' rule: a program from the
    workflow input never gets the worker's Temporal credentials."""
    monkeypatch.setenv(API_KEY_ENV, "worker-credential")
    monkeypatch.setenv("UNRELATED_SETTING", "kept")
    probe = (
        "import os, sys; "
        f"sys.exit(3 if {API_KEY_ENV!r} in os.environ else 0 if "
        "os.environ.get('UNRELATED_SETTING') == 'kept' else 4)"
    )
    request = PreflightRequest(
        interpreter=sys.executable,
        workdir=str(tmp_path),
        disk_path=str(tmp_path),
        health_command=[sys.executable, "-c", probe],
        timeout_s=30,
    )
    result = run_local_preflight("n1", request)
    assert result.problems == []


def test_slurm_commands_do_not_export_the_workers_api_key() -> None:
    """srun and sbatch export their environment to what they run on the nodes (the
    shim, with the health command; the holder)."""
    env = client_environment({"PATH": "/bin", API_KEY_ENV: "worker-credential"})
    assert API_KEY_ENV not in env and env["PATH"] == "/bin"
