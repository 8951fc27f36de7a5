"""How ``lazarus verify`` and ``lazarus checkpoints`` show their findings.

Rich tables for people, JSON for scripts, like :mod:`lazarus.cli_render`; kept in
a module of its own so the checkpoint commands stay out of the job views.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from activities.checkpoints.listing import CheckpointListing
from activities.contracts import CheckpointVerification

_DASH = "—"


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{size} B"


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return _DASH
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def verification_json(results: list[CheckpointVerification]) -> list[dict[str, Any]]:
    return [r.model_dump(mode="json") for r in results]


def render_verification(results: list[CheckpointVerification]) -> RenderableType:
    parts: list[RenderableType] = []
    for result in results:
        line = Text()
        line.append(f"step {result.step if result.step is not None else '?'}  ", style="bold")
        if result.ok:
            line.append("ok", style="bold green")
            checked = "sha256" if result.hashed else "sizes"
            line.append(
                f"  {result.files} files, {human_size(result.size_bytes)}, {checked} checked"
            )
        else:
            line.append("CORRUPT", style="bold red")
        line.append(f"  {result.path}", style="dim")
        parts.append(line)
        for problem in result.problems:
            parts.append(Text(f"  x {problem}", style="red"))
    return Group(*parts)


def _tier(state: str | None) -> bool | None:
    return None if state is None else state == "verified"


def checkpoints_json(rows: list[CheckpointListing]) -> list[dict[str, Any]]:
    return [
        {
            "step": row.step,
            "time": row.time,
            "size_bytes": row.size_bytes,
            "verified": _tier(row.local),
            "durable": _tier(row.durable),
            "local_state": row.local,
            "durable_state": row.durable,
            "verification": row.verification,
            "local_path": row.local_path,
            "durable_path": row.durable_path,
            "problems": [*row.local_problems, *row.durable_problems],
        }
        for row in rows
    ]


_STATE_STYLE = {"verified": "green", "corrupt": "bold red", "uncommitted": "yellow"}


def _state_text(state: str | None, present: str) -> Text:
    if state is None:
        return Text(_DASH, style="dim")
    label = present if state == "verified" else state
    return Text(label, style=_STATE_STYLE.get(state, ""))


def checkpoints_table(rows: list[CheckpointListing]) -> RenderableType:
    verification = rows[0].verification if rows else "sizes"
    table = Table(title=f"checkpoints (verified by {verification})", title_justify="left")
    for column in ("step", "time", "size", "verified", "durable", "problem"):
        table.add_column(column, justify="right" if column in ("step", "size") else "left")
    for row in rows:
        problems = [*row.local_problems, *row.durable_problems]
        table.add_row(
            str(row.step),
            _when(row.time),
            human_size(row.size_bytes),
            _state_text(row.local, "yes"),
            _state_text(row.durable, "yes"),
            Text(problems[0] + (f" (+{len(problems) - 1})" if len(problems) > 1 else ""))
            if problems
            else Text(""),
        )
    return table
