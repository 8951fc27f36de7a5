"""``start --dry-run`` shows what the launcher really sets (issue 11, part 2).

The dry run used to build the rank environment by hand and drifted: RUN_DIR as
``{run_dir}/<generation>`` instead of ``{run_dir}/{job_id}/run-<run id>/gen-NNNNN``,
and no CONTROL_FILE, NODE or PATH. It now calls the launcher's ``rank_environment``;
these tests compare the two for the same spec, so they cannot drift apart again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from activities.launcher import rank_environment
from activities.nodes.rundir import GenerationDir, job_root
from activities.start_checks import (
    GENERATION_DIR_PLACEHOLDER,
    PLACEHOLDERS,
    RUN_KEY_PLACEHOLDER,
    rank_environment_plan,
)
from lazarus.app import cli
from lazarus.app.client import plan_start
from lazarus.domain import environment as env_names
from lazarus.domain.contracts import CheckpointRef
from lazarus.domain.spec import JobSpec, parse_spec
from tests.checkpoint_helpers import write_checkpoint

RUN_ID = "0f1e2d3c"
GENERATION = 3
PORT = 29555


def _spec(tmp_path: Path, **overrides: Any) -> JobSpec:
    data: dict[str, Any] = {
        "name": "tiny",
        "command": ["python", "train.py"],
        "nproc_per_node": 2,
        "checkpoint_dir": "ckpt",
        "env": {"FOO": "bar"},
    }
    data.update(overrides)
    return parse_spec(data, "<test>").resolved(tmp_path)


def _launcher_env(spec: JobSpec, resume: CheckpointRef | None = None) -> list[dict[str, str]]:
    """What the launcher sets for generation 3 of run ``run-RUN_ID``, over an empty
    worker environment (the dry run cannot know the worker's)."""
    gen = GenerationDir.of(job_root(spec.run_dir, spec.job_id) / f"run-{RUN_ID}", GENERATION)
    return [
        rank_environment(
            spec, spec.nodes, rank // spec.nproc_per_node, gen, rank, PORT, resume, worker_env={}
        )
        for rank in range(spec.world_size)
    ]


def _filled_in(shown: str) -> str:
    """A dry-run value with its path placeholders replaced by this run's values."""
    return shown.replace(RUN_KEY_PLACEHOLDER, f"run-{RUN_ID}").replace(
        GENERATION_DIR_PLACEHOLDER, f"gen-{GENERATION:05d}"
    )


def _assert_same(dry: list[dict[str, str]], real: list[dict[str, str]]) -> None:
    assert len(dry) == len(real)
    for shown, launched in zip(dry, real, strict=True):
        assert shown.keys() == launched.keys()
        for name, value in launched.items():
            if name in PLACEHOLDERS:
                assert shown[name] == PLACEHOLDERS[name]
                assert shown[name].startswith("<") and shown[name].endswith(">")
            else:
                assert _filled_in(shown[name]) == value, name


def test_dry_run_sets_what_the_launcher_sets(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    dry = rank_environment_plan(spec)
    _assert_same(dry, _launcher_env(spec))
    # The variables the hand-built plan got wrong or left out.
    run_root = f"{spec.run_dir}/{spec.job_id}/{RUN_KEY_PLACEHOLDER}/{GENERATION_DIR_PLACEHOLDER}"
    assert dry[0][env_names.RUN_DIR] == run_root
    assert dry[0][env_names.CONTROL_FILE] == f"{run_root}/control.json"
    assert dry[1][env_names.HEARTBEAT_FILE] == f"{run_root}/rank-1.heartbeat.json"
    assert dry[0][env_names.NODE] == spec.nodes[0].name
    assert "PATH" in dry[0] and "PYTHONPATH" in dry[0]


def test_dry_run_matches_the_launcher_across_nodes_and_a_resume(tmp_path: Path) -> None:
    spec = _spec(
        tmp_path,
        nproc_per_node=1,
        nodes=[{"name": "a", "host": "127.0.0.1"}, {"name": "b", "host": "127.0.0.1"}],
    )
    resume = CheckpointRef(step=40, path=str(tmp_path / "ckpt" / "step-00000040"))
    dry = rank_environment_plan(spec, resume)
    _assert_same(dry, _launcher_env(spec, resume))
    assert [env[env_names.NODE] for env in dry] == ["a", "b"]
    assert dry[1][env_names.RESUME_STEP] == "40"


def test_dry_run_never_shows_a_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pass_env`` values come from the worker at launch: a placeholder, never the
    value in the dry run's own environment; ``env_from_file`` is not read."""
    monkeypatch.setenv("HF_TOKEN", "s3cret-value")
    secrets = tmp_path / "secrets.env"
    secrets.write_text("WANDB_API_KEY=also-secret\n")
    secrets.chmod(0o600)
    spec = _spec(tmp_path, pass_env=["HF_TOKEN"], env_from_file=str(secrets))
    (rank0, _) = rank_environment_plan(spec)
    assert rank0["HF_TOKEN"] == "<HF_TOKEN from the worker's environment>"
    assert "WANDB_API_KEY" not in rank0
    shown = json.dumps([plan_start(spec).model_dump(mode="json"), rank_environment_plan(spec)])
    assert "s3cret-value" not in shown and "also-secret" not in shown


def test_cli_dry_run_prints_the_plan_and_the_resume_point(
    tmp_path: Path, worker_here: list[object]
) -> None:
    """The plan is the worker's (``activities/start_checks.py``): the CLI shows it."""
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(
        "name: tiny\ncommand: [python, train.py]\nnproc_per_node: 1\ncheckpoint_dir: ckpt\n"
    )
    write_checkpoint(tmp_path / "ckpt", 10)  # by a world of one rank, as the spec's
    result = CliRunner().invoke(cli.app, ["start", str(spec_file), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    spec = _spec(tmp_path, env={}, nproc_per_node=1)
    expected = rank_environment_plan(
        spec, CheckpointRef(step=10, path=str(tmp_path / "ckpt" / "step-00000010"))
    )
    assert shown["ranks"] == expected
    assert shown["ranks"][0][env_names.RESUME_STEP] == "10"
    assert shown["resume_from"]["step"] == 10

    table = CliRunner().invoke(
        cli.app, ["start", str(spec_file), "--dry-run"], env={"COLUMNS": "200"}
    )
    assert table.exit_code == 0, table.output
    assert f"{RUN_KEY_PLACEHOLDER}/{GENERATION_DIR_PLACEHOLDER}/control.json" in table.stdout
    assert "LAZARUS_NODE" in table.stdout
