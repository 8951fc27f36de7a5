"""How ``lazarus report`` gathers a job's report and shows it.

The command itself is wired in :mod:`lazarus.app.cli` (one function, like every other
command); the gathering (status plus history, through :class:`JobClient`), the files
it writes and the rich tables live here, so they can be tested without the CLI and
without a server. The data and the drawing are :mod:`lazarus.app.report`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from lazarus.app.cli_output import plain
from lazarus.app.client import ClientError, JobClient
from lazarus.app.report import (
    INCIDENT_COLUMNS,
    MATPLOTLIB_MISSING,
    ReportData,
    incident_rows,
    job_history,
    render_html,
    render_png,
    report_data,
    summary_rows,
)

DEFAULT_PNG = Path("report.png")
"""Where the figure goes when neither ``--out`` nor ``--json`` says otherwise."""


class ReportUnavailable(ClientError):
    """The job's report cannot be made (no status to be had, an empty history)."""


def output_problems(png: Path | None, page: Path | None) -> list[str]:
    """What is wrong with the requested output files, before anything is contacted."""
    problems = []
    for option, path in (("--out", png), ("--html", page)):
        if path is not None and path.is_dir():
            problems.append(f"{option} {path}: is a directory; give a file name")
    if (png is not None or page is not None) and importlib.util.find_spec("matplotlib") is None:
        problems.append(MATPLOTLIB_MISSING)
    return problems


async def gather_report(jobs: JobClient, job: str) -> ReportData:
    """The job's report data: its status (the query, or its final result) joined with
    its history. Works for finished jobs: a completed job's result needs no worker."""
    view = await jobs.status(job)
    runs = await jobs.history(job)
    try:
        history = job_history(runs)
    except ValueError as exc:
        raise ReportUnavailable(f"job '{job}': {exc}") from None
    status = view.status or history.final_status
    if status is None:
        why = view.note or "the job did not answer the status query"
        raise ReportUnavailable(f"job '{job}': no status to report ({why})")
    return report_data(status, history)


def write_report(data: ReportData, png: Path | None, page: Path | None) -> list[str]:
    """Write the figure and the page as asked; one line per file written. An OSError
    names the file (the caller turns it into one line)."""
    written: list[str] = []
    if png is None and page is None:
        return written
    image = render_png(data)
    for path, content in ((png, image), (page, None)):
        if path is None:
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if content is not None:
                path.write_bytes(content)
            else:
                path.write_text(render_html(data, image), encoding="utf-8")
        except OSError as exc:
            raise ReportUnavailable(f"{path}: cannot write: {exc.strerror or exc}") from None
        written.append(f"wrote {path} ({path.stat().st_size} bytes)")
    return written


def report_json(data: ReportData, png: Path | None, page: Path | None) -> dict[str, Any]:
    """The ``report --json`` document: the data behind the plot, and the files written."""
    body = data.model_dump(mode="json")
    body["files"] = {
        "png": str(png) if png is not None else None,
        "html": str(page) if page is not None else None,
    }
    return body


def render_report(data: ReportData) -> RenderableType:
    """The report's tables for a terminal: the summary, then each incident's phases."""
    summary = Table(title=plain(f"report: {data.job}"), show_header=False, title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    for label, value in summary_rows(data):
        summary.add_row(label, plain(value))
    parts: list[RenderableType] = [summary]
    if data.incidents:
        incidents = Table(title="incidents, time per recovery phase", title_justify="left")
        for column in INCIDENT_COLUMNS:
            incidents.add_column(column)
        for row in incident_rows(data):
            incidents.add_row(*map(plain, row))
        parts.append(incidents)
        bands = [band for incident in data.incidents for band in incident.bands]
        if any(band.estimated or not band.complete for band in bands):
            parts.append(
                Text("~ estimated from the step time; + still under way or cut short", style="dim")
            )
    parts.extend(Text(note, style="yellow") for note in data.notes)
    return Group(*parts)
