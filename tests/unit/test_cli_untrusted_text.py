"""Text the CLI did not write is printed as it is (issue 37, item 5).

Log lines, paths, node names and recorded reasons may hold anything, including what
rich would read as markup: ``[/INST]`` (a closing tag with no opening one) crashed
``lazarus classify`` with a ``MarkupError``, and ``[rank3]:`` vanished as an unknown
style. These tests feed such text to the commands and renderers that show it.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path
from typing import Any

import pytest
import typer
from click.testing import CliRunner as ClickRunner
from rich.console import Console
from typer.testing import CliRunner

from lazarus.app import cli, cli_render
from lazarus.app.client import StatusView
from workflows.state import Incident, JobStatus, NodePool, Phase, QuarantinedNode

APP_DIR = Path(cli.__file__).resolve().parent

MARKUP_LIKE = [
    "ValueError: bad token [/INST] in prompt",
    "[rank3]:[E1207 10:11:12.131415 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600020 "
    "milliseconds before timing out.",
    "[/]",
    "[bold]not bold[/bold] [/italic] [link=http://x]y[/link]",
    "[[[[]]]] [/ [/[/ ]]]",
    "\\[escaped] \\",
    "[red on nonsense]x[/] :smile: :thumbs_up:",
    "[@click=app.bell]click[/]",
    "\x1b[31mansi red\x1b[0m and \x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\",
    "tabs\tand\rcarriage\r\nreturns\x00nul\x07bell\x08",
    "CUDA out of memory. [rank0]: Tried to allocate 2.00 GiB [/INST][INST] again",
    "\ufeffbom \u202eright-to-left\u202c \U0001f600",
]


COMMAND: Any = typer.main.get_command(cli.app)
"""Built once (the fuzz test invokes it often); typer's own click command, which click's
runner drives as it drives any command (hence ``Any`` for the type checker)."""


def _classify(path: Path, *args: str) -> str:
    result = ClickRunner().invoke(COMMAND, ["classify", str(path), *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 0, result.output
    return result.stdout


def test_classify_prints_closing_tags_and_rank_prefixes_as_they_are(tmp_path: Path) -> None:
    log = tmp_path / "rank-3.log"
    log.write_text(MARKUP_LIKE[1] + "\n" + MARKUP_LIKE[0] + "\n")
    out = _classify(log)
    assert out.startswith("nccl_timeout")
    assert "[rank3]:[E1207 10:11:12.131415 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog" in out
    # one evidence line per log line: not wrapped into the terminal's width
    assert any(line.rstrip().endswith("before timing out.") for line in out.splitlines())


def test_classify_survives_markup_like_text_and_random_bytes(tmp_path: Path) -> None:
    """A fixed corpus of markup-like lines, then random bytes (seeded, so a failure
    reproduces), alone and mixed with lines the classifier recognises: every run
    exits 0 in text and in JSON form."""
    rng = random.Random(37)
    blobs: list[bytes] = ["\n".join(MARKUP_LIKE).encode()]
    blobs += [line.encode("utf-8", "surrogatepass") for line in MARKUP_LIKE]
    for _ in range(16):
        noise = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))
        brackets = "".join(rng.choice("[]/\\ :@=abrk0123\n") for _ in range(rng.randrange(60)))
        blobs.append(noise + brackets.encode() + rng.choice(MARKUP_LIKE).encode())
    log = tmp_path / "noise.log"
    for index, blob in enumerate(blobs):
        log.write_bytes(blob)
        _classify(log, *(("--json", "--exit-code", "-9") if index % 2 else ()))


def test_classify_reads_invalid_utf8_from_stdin() -> None:
    result = CliRunner().invoke(cli.app, ["classify", "-"], input=b"\xff\xfe[/INST]\x80\n")
    assert result.exit_code == 0, result.output


def test_help_texts_keep_their_brackets() -> None:
    result = CliRunner().invoke(cli.app, ["logs", "--help"])
    assert result.exit_code == 0
    assert "starts with [rank N]" in " ".join(result.stdout.split())


def _render(renderable: object) -> str:
    console = Console(width=200, record=True, color_system=None)  # markup on: the default
    console.print(renderable)
    return console.export_text()


def test_status_tables_show_reasons_and_node_names_literally() -> None:
    reason = "rank 1 printed [/INST] then [bold]died[/]"
    status = JobStatus(
        job_id="tiny",
        phase=Phase.RUNNING,
        generation=2,
        step=120,
        world_size=2,
        ranks=[],
        restarts=1,
        max_restarts=5,
        nodes=NodePool(
            active=["[gpu-01]", "gpu-02"],
            quarantined=[QuarantinedNode(node="[red]bad[/]", reason=reason, at=0.0)],
        ),
        incidents=[
            Incident(
                id=1,
                generation=1,
                kind="crash",
                failure_class="user_code",
                rank=1,
                node="[gpu-01]",
                fault_at=990.0,
                detected_at=990.4,
                detection_s=0.4,
                action="restart",
                reason=reason,
            )
        ],
        ettr=0.875,
        elapsed_s=3723.0,
    )
    view = StatusView(workflow_id="lazarus-tiny", execution_status="RUNNING", status=status)
    text = _render(cli_render.render_status(view))
    assert "[gpu-01]" in text
    assert "[red]bad[/]" in text
    assert "[/INST] then [bold]died[/]" in text


def _calls(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            names.append(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


@pytest.mark.parametrize(
    "module", sorted(p.name for p in APP_DIR.glob("cli*.py") if p.name != "cli_output.py")
)
def test_cli_modules_print_through_the_plain_console(module: str) -> None:
    """No CLI module makes its own console or reads markup: they print through
    ``cli_output``, so no command can be the one that forgot."""
    source = (APP_DIR / module).read_text()
    calls = _calls(ast.parse(source))
    assert "Console" not in calls, f"{module}: use cli_output.console()/say()"
    assert "from_markup" not in calls and "escape" not in calls, module
    assert "markup=True" not in source, module
