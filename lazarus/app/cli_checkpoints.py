"""How ``lazarus verify`` and ``lazarus checkpoints`` show their findings.

Rich tables for people, JSON for scripts, like :mod:`lazarus.app.cli_render`; kept in
a module of its own so the checkpoint commands stay out of the job views.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any, overload

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from lazarus.domain.checkpoint_views import CheckpointListing, ResumePlan, SetAside
from lazarus.domain.contracts import CheckpointVerification

_DASH = "—"


@overload
def absolute(target: str) -> str: ...
@overload
def absolute(target: None) -> None: ...
def absolute(target: str | None) -> str | None:
    """A path as the user meant it, from this shell's directory: the worker that reads it
    has a working directory of its own. URIs (``s3://...``) are kept as written."""
    if target is None or "://" in target:
        return target
    return os.path.abspath(target)


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


def resume_json(plan: ResumePlan | None) -> dict[str, Any] | None:
    """``start --json``'s ``resume_from``: None when the job starts from step 0."""
    if plan is None or plan.step is None:
        return None
    return {
        "step": plan.step,
        "path": plan.path,
        "location": plan.location,
        "written_by": plan.written_by,
        "written_at": plan.written_at,
        "skipped": [s.model_dump(mode="json") for s in plan.skipped],
    }


def resume_lines(plan: ResumePlan, job: str) -> list[str]:
    """What ``start`` says before starting: the resume point and whose it is, or
    that the job starts fresh; and what it will pass over (another job's, corrupt)."""
    lines: list[str] = []
    if plan.step is None:
        lines.append(f"no checkpoint to resume from in {plan.checkpoint_dir}: starts at step 0")
    else:
        writer = plan.written_by or "an unknown job (no job id in its manifest)"
        if plan.written_by == job:
            writer = f"this job ({job})"
        where = "the durable tier" if plan.location == "durable" else "local"
        lines.append(
            f"will RESUME from step {plan.step}, written by {writer} at "
            f"{_when(plan.written_at)} ({where}: {plan.path}); "
            "use --fresh to start from step 0 (existing checkpoints are kept aside)"
        )
    for skipped in plan.skipped:
        lines.append(f"  passes over step {skipped.step}: {'; '.join(skipped.problems)}")
    if plan.durable_unavailable:
        lines.append(f"  durable tier not checked: {plan.durable_unavailable}")
    return lines


def set_aside_lines(moved: list[SetAside]) -> list[str]:
    if not moved:
        return ["--fresh: no existing checkpoints to move aside"]
    return [
        f"--fresh: moved checkpoints {', '.join(map(str, m.steps)) or '(unfinished saves)'} "
        f"aside to {m.moved_to} (kept, not deleted)"
        for m in moved
    ]
