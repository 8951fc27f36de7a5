"""Every command's ``--help`` names its parameters in words, and ``lazarus completion``
prints a script that completes from the same parser.

The help of every command and group is rendered as a user sees it (``CliRunner`` and
``--help``, so through the app's own classes); none may show ``{JOB}`` (Typer's mark of a
required argument, which reads as a set of choices) or a ``<bool>``/``<str>`` type tag.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from lazarus.app import cli, cli_tools

pytestmark = pytest.mark.timeout(60)

BRACED = re.compile(r"\{[^}\s]*\}")
TYPE_TAG = re.compile(r"<(bool|str|int|float|path|file|dir|text|list\[[^\]]*\])>", re.I)


def _command_paths() -> Iterator[list[str]]:
    def walk(command: object, path: list[str]) -> Iterator[list[str]]:
        yield path
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            if not sub.hidden:
                yield from walk(sub, [*path, name])

    yield from walk(get_command(cli.app), [])


COMMANDS = list(_command_paths())


def _help(path: list[str]) -> str:
    result = CliRunner().invoke(cli.app, [*path, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    return result.output


def test_every_verb_is_rendered() -> None:
    names = {" ".join(path) for path in COMMANDS}
    assert {"", "start", "pause", "fleet start", "spec schema", "completion"} <= names
    assert len(names) >= 25


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "lazarus")
def test_help_has_no_braced_arguments_or_type_tags(path: list[str]) -> None:
    text = _help(path)
    assert not BRACED.search(text), f"a {{...}} in 'lazarus {' '.join(path)} --help':\n{text}"
    assert not TYPE_TAG.search(text), f"a <type> in 'lazarus {' '.join(path)} --help':\n{text}"
    usage = text.splitlines()[0]
    assert usage.startswith("Usage: lazarus"), usage


def test_arguments_and_options_read_as_words() -> None:
    start = _help(["start"])
    assert "Usage: lazarus start [OPTIONS] JOB.yaml" in start
    assert "--name NAME" in start
    assert re.search(r"^\s+--dry-run\s+Show the plan", start, re.M), "a flag takes no value"
    assert "Usage: lazarus status [OPTIONS] [JOB]" in _help(["status"])
    drain = _help(["drain"])
    assert "Usage: lazarus drain [OPTIONS] JOB NODE" in drain
    assert re.search(r"^\s+JOB\s+The job's name\.\s+\[required\]", drain, re.M), drain
    server = _help(["server"])
    assert "--state-dir DIR" in server and "--port PORT" in server


def test_an_undescribed_argument_keeps_a_given_help() -> None:
    # The default help for "job" never overrides a verb's own words.
    assert "The job whose lease to free." in _help(["fleet", "release"])


# --- completion ---------------------------------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_the_shells_script(shell: str) -> None:
    result = CliRunner().invoke(cli.app, ["completion", shell])
    assert result.exit_code == 0, result.output
    assert cli_tools.COMPLETE_VAR in result.output
    assert "lazarus" in result.output


def test_completion_refuses_an_unknown_shell() -> None:
    result = CliRunner().invoke(cli.app, ["completion", "tcsh"])
    assert result.exit_code == 2
    assert "bash" in result.output and "fish" in result.output


def _complete(env: dict[str, str]) -> list[str]:
    """What the app answers a completion request with (the script's call, in-process)."""
    result = CliRunner().invoke(cli.app, [], env=env, prog_name="lazarus")
    assert result.exit_code == 0, result.output
    return result.output.split()


def test_the_app_answers_bash_completion() -> None:
    words = _complete(
        {"_LAZARUS_COMPLETE": "complete_bash", "COMP_WORDS": "lazarus fl", "COMP_CWORD": "1"}
    )
    assert words == ["fleet"]


def test_the_app_answers_zsh_completion_with_options() -> None:
    answer = " ".join(
        _complete(
            {"_LAZARUS_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "lazarus start --dr"}
        )
    )
    assert "--dry-run" in answer


# The console entry point, run as `lazarus` (the name the completion variable is made of).
ENTRY = "import sys; sys.argv[0] = 'lazarus'; from lazarus.app.cli import run; run()"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_bash_script_completes_in_bash(tmp_path: Path) -> None:
    """The printed script, sourced by a real bash, fills COMPREPLY from the app."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "lazarus"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "{ENTRY}"\n')
    shim.chmod(0o755)
    script = CliRunner().invoke(cli.app, ["completion", "bash"]).output
    (tmp_path / "completion.bash").write_text(script)
    done = subprocess.run(
        [
            "bash",
            "-c",
            f"source {tmp_path / 'completion.bash'}; COMP_WORDS=(lazarus fleet dr); "
            'COMP_CWORD=2; _lazarus_completion lazarus; printf "%s\\n" "${COMPREPLY[@]}"',
        ],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["drain"]
