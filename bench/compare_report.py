"""Summarising a comparison: medians per scenario and system, Lazarus/torchrun ratios,
the markdown table and the JSON file.

Wall times are also given relative to the same system's fault-free median
(``wall_vs_clean``), so "how much did the fault cost" is comparable even where the
two systems' fault-free runs differ.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench.compare import SCENARIOS, CompareConfig, CompareRun, Metric, RunResult, System
from bench.report import RESULTS_DIR, machine_info, summarize

HEADLINE: dict[str, list[str]] = {
    "clean": ["wall_s", "steps_per_s", "launch_to_first_step_s", "weights_ok"],
    "crash": [
        "recovered",
        "detection_s",
        "recovery_s",
        "relaunch_to_first_step_s",
        "steps_lost",
        "wall_vs_clean",
        "weights_ok",
    ],
    "hang": [
        "detected",
        "detection_s",
        "recovery_s",
        "relaunch_to_first_step_s",
        "steps_lost",
        "wall_vs_clean",
        "weights_ok",
    ],
    "controller_crash": [
        "training_survived",
        "steps_lost",
        "duplicate_ranks",
        "supervised_after",
        "wall_vs_clean",
        "weights_ok",
    ],
    "straggler": [
        "before_steps_per_s",
        "stretch_steps_per_s",
        "stretch_s",
        "straggler_detected",
        "swapped",
        "wall_s",
        "weights_ok",
    ],
    "node_loss": ["detection_s", "recovery_s", "steps_lost", "spare_used", "weights_ok"],
    "pause_resume": [
        "pause_to_ranks_stopped_s",
        "resume_to_first_step_s",
        "steps_lost",
        "weights_ok",
    ],
}
"""The metrics the printed table shows, per scenario (the JSON has every metric)."""


class MetricStats(BaseModel):
    median: float | None
    min: float | None
    max: float | None
    n: int
    kind: str
    true_count: int | None = None


class Cell(BaseModel):
    """One system's figure for one scenario and metric."""

    stats: MetricStats | None = None
    note: str | None = None
    """Why there is no number: not possible, skipped, not detected in time..."""


def _add_wall_vs_clean(results: list[RunResult]) -> None:
    """Each run's wall time over its system's fault-free median (torchrun's default
    setup is compared with torchrun's fault-free runs: a clean run cannot tell them apart)."""
    clean: dict[str, list[float]] = {}
    for r in results:
        wall = r.metrics.get("wall_s")
        if r.scenario == "clean" and isinstance(wall, float) and r.status == "ok":
            clean.setdefault(r.system, []).append(wall)
    for r in results:
        base = clean.get(r.system)
        if not base and r.system == "torchrun_default":
            base = clean.get("torchrun")
        wall = r.metrics.get("wall_s")
        if r.scenario != "clean" and base and isinstance(wall, float):
            r.metrics["wall_vs_clean"] = wall / _median(base)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def summary(run: CompareRun) -> dict[str, dict[str, dict[str, Cell]]]:
    """``{scenario: {system: {metric: Cell}}}``."""
    _add_wall_vs_clean(run.results)
    out: dict[str, dict[str, dict[str, Cell]]] = {}
    for name in run.plan.scenarios:
        per_system: dict[str, dict[str, Cell]] = {}
        for system in run.plan.systems:
            results = [r for r in run.results if r.scenario == name and r.system == system]
            if not results:
                continue
            cells: dict[str, Cell] = {}
            notes = sorted({r.note for r in results if r.note})
            if all(r.status in ("not_possible", "skipped") for r in results):
                per_system[system] = {"*": Cell(note=notes[0] if notes else results[0].status)}
                continue
            values: dict[str, list[Metric]] = {}
            for r in results:
                for key, value in r.metrics.items():
                    values.setdefault(key, []).append(value)
            for key, vals in values.items():
                s = summarize(vals)
                cells[key] = Cell(
                    stats=MetricStats(
                        median=s.median,
                        min=s.min,
                        max=s.max,
                        n=s.n,
                        kind=s.kind,
                        true_count=s.true_count,
                    )
                )
            errors = sum(1 for r in results if r.status == "error")
            cells["failed_runs"] = Cell(
                stats=MetricStats(
                    median=float(errors), min=None, max=None, n=len(results), kind="count"
                ),
                note="; ".join(notes) or None,
            )
            per_system[system] = cells
        out[name] = per_system
    return out


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.2f}"


def render_cell(cell: Cell | None) -> str:
    if cell is None:
        return ""
    s = cell.stats
    if s is None:
        return cell.note or "-"
    if s.kind == "bool":
        return f"{s.true_count}/{s.n}"
    if s.median is None:
        return cell.note or "-"
    if s.n > 1 and s.min is not None and s.max is not None and s.min != s.max:
        return f"{_fmt(s.median)} ({_fmt(s.min)}\u2013{_fmt(s.max)})"
    return _fmt(s.median)


def ratio(lazarus: Cell | None, torchrun: Cell | None) -> str:
    a = lazarus.stats if lazarus else None
    b = torchrun.stats if torchrun else None
    if (
        a is None
        or b is None
        or a.kind != "number"
        or b.kind != "number"
        or a.median is None
        or not b.median
    ):
        return ""
    return f"{a.median / b.median:.2f}"


def markdown_table(stats: dict[str, dict[str, dict[str, Cell]]]) -> str:
    """Headline metrics side by side: median (min to max); booleans as true/runs."""
    lines = [
        "| scenario | metric | Lazarus | torchrun | Lazarus/torchrun | torchrun (default setup) |",
        "|---|---|---|---|---|---|",
    ]
    for name, per_system in stats.items():
        laz = per_system.get("lazarus", {})
        tr = per_system.get("torchrun", {})
        trd = per_system.get("torchrun_default", {})
        notes = {s: cells["*"].note for s, cells in per_system.items() if "*" in cells}
        for metric in [*HEADLINE.get(name, []), "failed_runs"]:
            cells = [laz.get(metric), tr.get(metric), trd.get(metric)]
            if all(c is None for c in cells) and not notes:
                continue
            shown = [
                render_cell(c)
                if c is not None
                else (notes.get(s, "") if metric == "failed_runs" else "")
                for s, c in zip(("lazarus", "torchrun", "torchrun_default"), cells, strict=True)
            ]
            if metric == "failed_runs":
                shown = [
                    (f"{_fmt(c.stats.median)}/{c.stats.n}" if c and c.stats else txt)
                    for c, txt in zip(cells, shown, strict=True)
                ]
            if not any(shown):
                continue
            lines.append(
                f"| {name} | {metric} | {shown[0]} | {shown[1]} | "
                f"{ratio(cells[0], cells[1])} | {shown[2]} |"
            )
    notes_seen: dict[str, str] = {}
    for name, per_system in stats.items():
        for system, system_cells in per_system.items():
            for cell in system_cells.values():
                if cell.note:
                    notes_seen.setdefault(f"{name} / {system}", cell.note)
    if notes_seen:
        lines.append("")
        lines += [f"- {key}: {note}" for key, note in notes_seen.items()]
    return "\n".join(lines)


def payload(run: CompareRun, stats: dict[str, dict[str, dict[str, Cell]]]) -> dict[str, Any]:
    return {
        "benchmark": "compare",
        "machine": machine_info(),
        "config": {
            **run.config.as_dict(),
            "plan": run.plan.model_dump(),
            "scenarios": {n: SCENARIOS[n].summary for n in run.plan.scenarios},
        },
        "started_at": run.started_at,
        "finished_at": time.time(),
        "summary": {
            sc: {sys_: {m: c.model_dump() for m, c in cells.items()} for sys_, cells in per.items()}
            for sc, per in stats.items()
        },
        "runs": [r.model_dump() for r in run.results],
        **run.extras,
    }


def default_json_path() -> Path:
    return RESULTS_DIR / f"compare-{time.strftime('%Y%m%d-%H%M%S')}.json"


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def systems_of(run: CompareRun) -> list[System]:
    return list(run.plan.systems)


def load(path: Path) -> tuple[CompareRun, dict[str, Any]]:
    """A saved comparison, back as a :class:`CompareRun` (for re-rendering its tables)."""
    from bench.compare import ScenarioPlan

    data = json.loads(path.read_text())
    plan = ScenarioPlan.model_validate(data["config"]["plan"])
    run = CompareRun(config=CompareConfig(), plan=plan, started_at=data["started_at"])
    run.results = [RunResult.model_validate(r) for r in data["runs"]]
    for result in run.results:
        _backfill_phases(result)
    for name in ("overhead", "soak"):
        if name in data:
            extra = data[name]
            # Files written before the extras were flattened nest them once more.
            run.extras[name] = extra.get(name, extra) if isinstance(extra, dict) else extra
    return run, data


def _backfill_phases(result: RunResult) -> None:
    """Files written before ``relaunch_to_first_step_s`` existed: take it from the
    controller's own incident phase times (its first-step time may lag the ranks'
    by up to one poll interval)."""
    if result.system != "lazarus" or "relaunch_to_first_step_s" in result.metrics:
        return
    incidents = result.details.get("incidents") or []
    if result.scenario not in ("crash", "hang") or not incidents:
        return
    first = incidents[0]
    if first.get("relaunched_at") and first.get("first_step_at"):
        result.metrics["relaunch_to_first_step_s"] = first["first_step_at"] - first["relaunched_at"]
