"""Following a job from the command line: ``lazarus wait``, ``start --wait`` and
``status --watch``.

``wait`` exits with the job's outcome (the table is :data:`~lazarus.app.outcome.EXIT_CODES`);
while it waits it says each phase or generation change on stderr, so stdout holds
only the answer. ``status --watch`` redraws a table on a terminal; into a pipe or a
file (CI logs, ``sbatch`` output) a redrawn table shows nothing until the end, so
there it prints one line per change instead, or with ``--json`` one JSON document per
change (JSON lines).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live

from lazarus.app import cli_render as render
from lazarus.app.cli_output import say
from lazarus.app.client import JobClient, JobNotFound, StatusView, WaitResult
from lazarus.app.outcome import EXIT_CODES, Outcome

WATCH_INTERVAL_S = 1.0

WAIT_HELP = (
    "Block until the job ends, or needs an operator, and exit with its outcome: "
    + ", ".join(f"{code} {outcome.value}" for outcome, code in EXIT_CODES.items())
    + " (1: the request failed, such as no server; 2: bad input)."
)

TimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        metavar="S",
        min=0.0,
        help=f"Stop waiting after S seconds (exit {Outcome.TIMEOUT.exit_code}); the job goes on.",
    ),
]
ThroughOperatorOption = Annotated[
    bool,
    typer.Option(
        "--through-operator",
        help="Keep waiting while the job needs an operator (default: stop there, exit "
        f"{Outcome.NEEDS_OPERATOR.exit_code}).",
    ),
]


def waiting(
    job: str, timeout: float | None, through_operator: bool, as_json: bool
) -> Callable[[JobClient], Awaitable[WaitResult | None]]:
    """The wait, as a client action: None when no job has the name (an outcome of its
    own, :attr:`Outcome.NO_SUCH_JOB`, not an error like any other)."""

    def changed(view: StatusView) -> None:
        if not as_json:
            say(render.status_line(view), stderr=True)

    async def action(jobs: JobClient) -> WaitResult | None:
        try:
            return await jobs.wait(
                job, timeout_s=timeout, stop_at_operator=not through_operator, on_change=changed
            )
        except JobNotFound:
            return None

    return action


def say_outcome(result: WaitResult, as_json: bool, started: dict[str, Any] | None) -> None:
    """The answer on stdout: a line, or with ``--json`` an object (after a start, the
    start's document with the wait's under ``wait``: one document, never two)."""
    if not as_json:
        typer.echo(render.wait_line(result))
        return
    waited = render.wait_json(result)
    body = waited if started is None else {**started, "wait": waited}
    typer.echo(json.dumps(body, indent=2))


async def watch_live(jobs: JobClient, job: str, console: Console) -> None:
    """``status --watch`` on a terminal: the status table, redrawn every second."""
    view = await jobs.status(job)
    try:
        with Live(render.render_status(view), console=console, auto_refresh=False) as live:
            while not view.is_terminal:
                await asyncio.sleep(WATCH_INTERVAL_S)
                view = await jobs.status(job)
                live.update(render.render_status(view), refresh=True)
    except (KeyboardInterrupt, asyncio.CancelledError):
        return


async def watch_lines(jobs: JobClient, job: str, as_json: bool) -> None:
    """``status --watch`` into a pipe or a file (or with ``--json``): one line per
    change (:func:`~lazarus.app.cli_render.watch_key`), as it happens."""
    said: tuple[object, ...] | None = None
    try:
        while True:
            view = await jobs.status(job)
            key = render.watch_key(view)
            if key != said:
                said = key
                if as_json:
                    typer.echo(json.dumps(render.status_json(view), separators=(",", ":")))
                else:
                    typer.echo(render.status_line(view))
            if view.is_terminal:
                return
            await asyncio.sleep(WATCH_INTERVAL_S)
    except (KeyboardInterrupt, asyncio.CancelledError):
        return
