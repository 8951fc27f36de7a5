"""Bad input is the spec's fault, said before anything starts (issue 29; the newcomer
review of 2026-12-03): a program that does not exist on a local job's machine, and a
job name with a typo. The program is checked by the worker, before the job exists
(``activities/start_checks.py``, issue 40): here the worker's functions answer in this
process (``worker_here``), through a real worker in tests/workflow/test_cli_client.py.
The workflow's side (every node lacks the program) is tests/workflow/test_missing_program.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest
from typer.testing import CliRunner

from activities.start_checks import missing_local_program
from lazarus.app import cli
from lazarus.app.client import ClientError, JobClient, JobNotFound, JobRow

pytestmark = pytest.mark.timeout(60)

SPEC = """\
name: ux-missing
command: [{program}, --steps, "300"]
checkpoint_dir: ckpt
"""


@pytest.fixture(autouse=True)
def _settings_not_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TEMPORAL_ADDRESS", "LAZARUS_TASK_QUEUE"):
        monkeypatch.delenv(name, raising=False)


def _spec(tmp_path: Path, program: str, extra: str = "") -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(SPEC.format(program=program) + extra)
    return path


@pytest.mark.parametrize("program", ["./no_such_train.sh", "pyhton-lazarus-typo"])
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_missing_program_on_a_local_job_is_refused_naming_command(
    tmp_path: Path, worker_here: list[Any], program: str, dry_run: bool
) -> None:
    spec = _spec(tmp_path, program)
    args = ["start", str(spec)] + (["--dry-run"] if dry_run else [])
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert line.startswith(f"{spec}: command: program {program!r} not found"), line
    assert "fix `command`" in line and "nothing was started" in line
    assert [r.kind for r in worker_here] == ["start_checks"], "checked on the worker"


def test_an_existing_script_passes_and_a_non_executable_one_is_named(
    tmp_path: Path, worker_here: list[Any]
) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n")
    result = CliRunner().invoke(cli.app, ["start", str(_spec(tmp_path, "./train.sh")), "--dry-run"])
    assert "chmod +x" in result.stderr and result.exit_code == 2, result.output
    script.chmod(0o755)
    result = CliRunner().invoke(cli.app, ["start", str(_spec(tmp_path, "./train.sh")), "--dry-run"])
    assert result.exit_code == 0, result.output


def test_no_check_nodes_skips_the_local_program_check(tmp_path: Path, no_server: list[Any]) -> None:
    """The escape hatch for a program the launch finds another way: it goes on to
    the server (refused here by the fixture)."""
    spec = _spec(tmp_path, "pyhton-lazarus-typo")
    CliRunner().invoke(cli.app, ["start", str(spec), "--no-check-nodes"])
    assert len(no_server) == 1


def test_an_ssh_job_is_not_checked_for_a_local_program(tmp_path: Path) -> None:
    """Its program lives on the nodes (checked there by ``unusable_nodes``)."""
    from lazarus.domain.spec import load_spec

    spec = load_spec(
        _spec(tmp_path, "/opt/venv/bin/python", "nodes: [{name: h1, launcher: ssh, host: h1}]\n")
    )
    assert missing_local_program(spec) is None


def _row(job: str) -> JobRow:
    return JobRow(
        job=job,
        workflow_id=f"lazarus-{job}",
        phase=None,
        step=None,
        execution_status="COMPLETED",
        start_time=None,
        close_time=None,
    )


class _Jobs:
    def __init__(self, names: list[str] | None) -> None:
        self.names = names

    async def list(self) -> list[JobRow]:
        if self.names is None:
            raise ClientError("the server went away")
        return [_row(n) for n in self.names]


def test_an_unknown_job_name_suggests_the_closest_one() -> None:
    found = asyncio.run(
        JobNotFound("ux-evl").with_suggestion(
            cast(JobClient, _Jobs(["ux-eval", "ux-missing", "other"]))
        )
    )
    assert str(found) == "no job named 'ux-evl'; did you mean 'ux-eval'?"
    far = asyncio.run(JobNotFound("nope").with_suggestion(cast(JobClient, _Jobs(["ux-eval"]))))
    assert str(far) == "no job named 'nope'; see 'lazarus list'"
    failed = asyncio.run(JobNotFound("ux-evl").with_suggestion(cast(JobClient, _Jobs(None))))
    assert str(failed) == "no job named 'ux-evl'; see 'lazarus list'"


def test_the_local_preflight_marks_a_missing_program(tmp_path: Path) -> None:
    """What the workflow decides on: ``program_missing``, beside the problem line."""
    from activities.preflight import check_nodes
    from lazarus.domain.contracts import NodeAccess, PreflightActivityRequest
    from lazarus.domain.spec import NodeSpec, PreflightSpec, SSHSpec

    def report(program: str) -> Any:
        return check_nodes(
            PreflightActivityRequest(
                access=NodeAccess(nodes=[NodeSpec()], ssh=SSHSpec()),
                checks=PreflightSpec(min_free_disk_gb=0),
                interpreter=program,
                workdir=str(tmp_path),
                disk_path=str(tmp_path),
            )
        ).nodes[0]

    missing = report("./no_such_train.sh")
    assert missing.program_missing and not missing.ok
    assert "'./no_such_train.sh' not found on node local" in missing.problems[0]
    assert not report("python").program_missing
