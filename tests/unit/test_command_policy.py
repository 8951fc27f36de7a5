"""The worker's ``allowed_commands``: the worker, not the client, decides what runs.

A job's ``command``, ``on_escalation`` and ``preflight.health_command`` come from the
workflow input, which anyone who reaches the Temporal frontend can write. With an
allow-list in the worker's settings, each activity refuses a program not on it, with
a non-retryable error naming the program and the setting, before running anything.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from activities.command_policy import ERROR_TYPE, CommandNotAllowed, enforce
from activities.escalation import run_escalation_hook
from activities.launcher import launch
from activities.preflight import preflight
from activities.worker_settings import (
    ALLOWED_COMMANDS_ENV,
    ALLOWED_COMMANDS_FILE_ENV,
    WorkerSettings,
    WorkerSettingsError,
)
from lazarus.domain.contracts import (
    EscalationHookRequest,
    LaunchRequest,
    NodeAccess,
    PreflightActivityRequest,
)
from lazarus.domain.spec import JobSpec, NodeSpec, PreflightSpec

TOUCH = shutil.which("touch") or "/usr/bin/touch"
TRUE = shutil.which("true") or "/usr/bin/true"


@pytest.fixture(autouse=True)
def _no_inherited_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOWED_COMMANDS_ENV, raising=False)
    monkeypatch.delenv(ALLOWED_COMMANDS_FILE_ENV, raising=False)


def allow(monkeypatch: pytest.MonkeyPatch, *patterns: str) -> None:
    monkeypatch.setenv(ALLOWED_COMMANDS_ENV, os.pathsep.join(patterns))


# --- settings ---------------------------------------------------------------------------------


def test_settings_read_the_variable_and_the_file(tmp_path: Path) -> None:
    assert WorkerSettings.from_env({}).allowed_commands is None
    listed = tmp_path / "allowed"
    listed.write_text("# training entry points\n/opt/train/bin/*\n\n  /usr/bin/python3  \n")
    settings = WorkerSettings.from_env(
        {ALLOWED_COMMANDS_ENV: "/usr/bin/true", ALLOWED_COMMANDS_FILE_ENV: str(listed)}
    )
    assert settings.allowed_commands == ("/usr/bin/true", "/opt/train/bin/*", "/usr/bin/python3")
    assert ALLOWED_COMMANDS_ENV in settings.allowed_commands_source
    assert str(listed) in settings.allowed_commands_source
    comments_only = tmp_path / "empty"
    comments_only.write_text("# nothing yet\n")
    empty = WorkerSettings.from_env({ALLOWED_COMMANDS_FILE_ENV: str(comments_only)})
    assert empty.allowed_commands == ()  # set but empty: nothing may run


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {ALLOWED_COMMANDS_ENV: "python"},
            "'python' in LAZARUS_ALLOWED_COMMANDS is not an absolute",
        ),
        ({ALLOWED_COMMANDS_ENV: "/bin/true::/bin/false"}, "has an empty entry"),
        ({ALLOWED_COMMANDS_FILE_ENV: "/nonexistent/allowed"}, "cannot read /nonexistent/allowed"),
    ],
)
def test_bad_settings_are_named(env: dict[str, str], expected: str) -> None:
    with pytest.raises(WorkerSettingsError, match=expected):
        WorkerSettings.from_env(env)


def test_bad_file_lines_name_the_line(tmp_path: Path) -> None:
    listed = tmp_path / "allowed"
    listed.write_text("/usr/bin/true\ntorchrun\n")
    with pytest.raises(WorkerSettingsError, match=f"'torchrun' in {listed} line 2"):
        WorkerSettings.from_env({ALLOWED_COMMANDS_FILE_ENV: str(listed)})


# --- the check ------------------------------------------------------------------------------


def test_programs_are_resolved_then_matched(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "train"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (tmp_path / "link").symlink_to(tool)
    settings = WorkerSettings(allowed_commands=(f"{bin_dir}/*",), allowed_commands_source="test")

    def check(command: list[str], remote: bool = False) -> None:
        enforce(
            "command",
            command,
            workdir=str(tmp_path),
            search_path=str(bin_dir),
            remote=remote,
            settings=settings,
        )

    check(["train", "--steps", "3"])  # a bare name, found on the ranks' PATH
    check(["./bin/train"])  # relative to the workdir
    check([str(tool)])
    check(["./link"])  # a symlink to an allowed program runs that program
    check([str(tool)], remote=True)
    with pytest.raises(CommandNotAllowed) as caught:
        check(["/bin/sh", "-c", "id"])
    assert "command: program /bin/sh is not in allowed_commands" in str(caught.value)
    assert "(from test)" in str(caught.value)
    with pytest.raises(CommandNotAllowed, match=r"'\./x/\.\./\.\./sh' \(/"):
        check(["./x/../../sh"])
    with pytest.raises(CommandNotAllowed, match="bare name on an ssh node"):
        check(["train"], remote=True)
    with pytest.raises(CommandNotAllowed, match="not on PATH"):
        check(["no-such-program"])


def test_without_an_allow_list_everything_runs(tmp_path: Path) -> None:
    enforce("command", ["/anything"], workdir=str(tmp_path), search_path=None)


def test_an_unreadable_allow_list_refuses_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ALLOWED_COMMANDS_FILE_ENV, str(tmp_path / "gone"))
    with pytest.raises(CommandNotAllowed, match="allow-list is unusable"):
        enforce("on_escalation", [TRUE], workdir=str(tmp_path), search_path=None)


# --- each activity refuses, non-retryably, before running anything -------------------------


def assert_refused(
    caught: pytest.ExceptionInfo[ApplicationError], field: str, program: str
) -> None:
    error = caught.value
    assert error.type == ERROR_TYPE and error.non_retryable
    assert f"{field}: program {program} is not in allowed_commands" in str(error)
    assert ALLOWED_COMMANDS_ENV in str(error)


@pytest.mark.slow  # runs a command
async def test_escalation_hook_not_allowed_is_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allow(monkeypatch, TRUE)
    touched = tmp_path / "hook-ran"
    request = EscalationHookRequest(
        command=[TOUCH, str(touched)],
        workdir=str(tmp_path),
        payload="{}",
        marker=str(tmp_path / "escalations" / "00001.done"),
    )
    with pytest.raises(ApplicationError) as caught:
        await run_escalation_hook(request)
    assert_refused(caught, "on_escalation", TOUCH)
    assert not touched.exists() and not Path(request.marker).exists()
    allow(monkeypatch, TRUE, TOUCH)
    assert (await run_escalation_hook(request)).ran and touched.exists()


@pytest.mark.slow  # runs a command
async def test_health_command_not_allowed_is_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allow(monkeypatch, TRUE)
    touched = tmp_path / "health-ran"
    request = PreflightActivityRequest(
        access=NodeAccess(nodes=[NodeSpec(name="a"), NodeSpec(name="b")]),
        checks=PreflightSpec(health_command=[TOUCH, str(touched)]),
        interpreter=sys.executable,
        workdir=str(tmp_path),
        disk_path=str(tmp_path),
    )
    with pytest.raises(ApplicationError) as caught:
        await preflight(request)
    assert_refused(caught, "preflight.health_command", TOUCH)
    assert not touched.exists()
    allow(monkeypatch, TRUE, TOUCH)
    report = await preflight(request)
    assert not report.failed and touched.exists()


async def test_launch_of_a_command_not_allowed_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allow(monkeypatch, TRUE)
    spec = JobSpec.model_validate(
        {
            "name": "refused",
            "command": [TOUCH, str(tmp_path / "rank-ran")],
            "workdir": str(tmp_path),
            "checkpoint_dir": str(tmp_path / "ckpt"),
            "run_dir": str(tmp_path / "runs"),
        }
    )
    with pytest.raises(ApplicationError) as caught:
        await launch(LaunchRequest(spec=spec, generation=1))
    assert_refused(caught, "command", TOUCH)
    assert not (tmp_path / "rank-ran").exists() and not (tmp_path / "runs").exists()
