"""The benchmark framework without a server: the one scenario registry, the metric
dictionary, the report, and reading the results files already in bench/results/."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from bench import catalog, report
from bench.harness import BenchConfig, BenchRun, Metric, Plan, RunRecord
from bench.jobs import JobShape
from bench.metrics import METRICS, lookup
from bench.registry import SUITES, scenario
from bench.systems import Measured, System

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCENARIO_MODULES = [BENCH / "scenarios.py", BENCH / "scenarios_multinode.py", BENCH / "harness.py"]


def test_every_suite_names_registered_scenarios_lazarus_runs() -> None:
    scenarios = catalog.load()
    for suite, names in SUITES.items():
        assert len(set(names)) == len(names), suite
        for name in names:
            assert name in scenarios, (suite, name)
            assert scenarios[name].run is not None, (suite, name)
    assert {"torchrun", "torchrun_default"} <= set(scenarios["crash"].others)
    assert "torchrun" in scenarios["pause_resume"].not_possible


def test_every_scenario_has_a_summary_and_a_step_by_step_doc() -> None:
    for name, sc in catalog.load().items():
        assert sc.summary and sc.summary in sc.doc, name
        assert "1. " in sc.doc, f"{name}: its docstring should walk through the fault sequence"


def test_registering_a_name_twice_is_refused() -> None:
    catalog.load()
    with pytest.raises(ValueError, match=r"crash.*registered twice"):
        scenario("crash", "again")


def test_crash_hang_pause_and_controller_crash_are_scripted_once_for_lazarus() -> None:
    scenarios = catalog.load()
    assert scenarios["worker_kill"].run is scenarios["controller_crash"].run
    # pause and pause_resume differ only in the hold: one script, two entries.
    source = (BENCH / "scenarios.py").read_text()
    assert source.count("await job.control.pause()") == 1
    assert source.count("chaos.signal_rank(run.job.run_root") == 1


def _reported_names(path: Path) -> set[str]:
    """String keys of every metrics dict a scenario module builds: ``metrics |= {...}``,
    ``metrics[...] = ``, ``Measured(metrics={...})`` and the dicts returned by helpers
    annotated ``-> dict[str, Metric]``."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()

    def keys(node: ast.AST | None) -> None:
        if isinstance(node, ast.Dict):
            names.update(str(k.value) for k in node.keys if isinstance(k, ast.Constant))

    def is_metrics(target: ast.AST) -> bool:
        text = ast.unparse(target)
        return text == "metrics" or text.endswith(".metrics")

    for node in ast.walk(tree):
        if isinstance(node, ast.AugAssign | ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if is_metrics(target):
                    keys(node.value)
                if (
                    isinstance(target, ast.Subscript)
                    and is_metrics(target.value)
                    and isinstance(target.slice, ast.Constant)
                ):
                    names.add(str(target.slice.value))
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("Measured", "Outcome"):
            for kw in node.keywords:
                if kw.arg == "metrics":
                    keys(kw.value)
            if node.args:
                keys(node.args[0])
        elif (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.returns
            and "Metric" in ast.unparse(node.returns)
        ):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Return):
                    keys(inner.value)
    return names


def test_every_metric_a_scenario_reports_is_in_the_dictionary() -> None:
    names = set().union(*(_reported_names(p) for p in SCENARIO_MODULES))
    # The scan finds the metrics of each kind of scenario (a sanity check on the scan).
    assert {"detection_s", "detection_from_injection_s", "recovery_outside_s"} <= names
    assert {"completed", "weights_ok", "spare_used", "pause_to_paused_s", "swapped"} <= names
    for name in sorted(names):
        lookup(name)  # raises KeyError naming it


def test_templated_metrics_resolve_and_unknown_ones_are_named() -> None:
    # <node>: the retired ssh_poll's, in saved results files; <job>: slurm_cpu's.
    for node in ("h1", "h4"):
        assert lookup(f"{node}_median_ms").unit == lookup(f"{node}_p95_ms").unit == "ms"
    for job in ("local1", "ssh4", "slurm2"):
        for suffix in ("completed", "weights_ok", "window_s", "cpu_ms_per_s", "cpu_s_per_hour"):
            assert lookup(f"{job}_{suffix}").unit
    with pytest.raises(KeyError, match="no_such_metric"):
        lookup("no_such_metric")


def test_each_metric_has_one_unit_and_meaning() -> None:
    for name, definition in METRICS.items():
        assert definition.unit and len(definition.meaning) > 10, name
    # The name the two frameworks shared for two things now means one of them.
    assert "controller" in METRICS["detection_s"].meaning
    assert "injected" in METRICS["detection_from_injection_s"].meaning
    for metrics in report.HEADLINE.values():
        for name in metrics:
            lookup(name)


def _run(records: list[RunRecord], scenarios: list[str], systems: list[System]) -> BenchRun:
    plan = Plan(scenarios=scenarios, systems=systems, repeats=1)
    run = BenchRun(config=BenchConfig.recovery(JobShape.quick()), plan=plan, started_at=0.0)
    run.records = records
    return run


SIDE_BY_SIDE: list[tuple[System, float]] = [("lazarus", 4.0), ("torchrun", 8.0)]


def test_side_by_side_table_reports_not_possible_and_ratios() -> None:
    records = [
        RunRecord("crash", 0, 0.0, 1.0, {"recovery_outside_s": r, "weights_ok": True}, {}, system=s)
        for s, r in SIDE_BY_SIDE
    ]
    records.append(
        RunRecord("pause_resume", 0, 0.0, 0.0, {}, {}, system="torchrun", not_possible="no pause")
    )
    run = _run(records, ["crash", "pause_resume"], ["lazarus", "torchrun"])
    table = report.compare_table(report.summary(run))
    assert "| crash | recovery_outside_s | 4 | 8 | 0.50 |" in table
    assert "no pause" in table
    data = report.payload(run, report.summary(run), "compare")
    assert data["schema"] == report.SCHEMA
    assert data["runs"][-1]["status"] == "not_possible"


def test_detection_p95_is_reported_beside_the_median_from_ten_runs() -> None:
    """Issue 26: the median hid the runs that waited 1.5 s; the p95 shows them."""
    detections: list[Metric] = [*([0.05] * 9), 1.5]
    records = [
        RunRecord("crash", i, 0.0, 1.0, {"detection_from_injection_s": d}, {}, system="lazarus")
        for i, d in enumerate(detections)
    ]
    stats = report.summary(_run(records, ["crash"], ["lazarus"]))
    cell = stats["crash"]["lazarus"]["detection_from_injection_s"].stats
    assert cell is not None and cell.median == 0.05 and cell.n == 10
    assert cell.p95 is not None and 0.05 < cell.p95 <= 1.5
    assert f"p95 {cell.p95:.2f}" in report.compare_table(stats)
    assert report.recovery_table(stats, {}).splitlines()[0].endswith("| n | p95 |")
    fewer = report.summarize(detections[:9])
    assert fewer.p95 is None  # nine runs: no p95 (it would be the maximum)
    assert report.summarize([True for _ in range(10)]).p95 is None


def test_results_files_round_trip(tmp_path: Path) -> None:
    records = [
        RunRecord("crash", 0, 0.0, 1.0, {"steps_lost": 11, "weights_ok": True}, {}),
        RunRecord("node_loss", 0, 0.0, 0.0, {}, {}, skipped="needs root"),
    ]
    run = _run(records, ["crash", "node_loss"], ["lazarus"])
    path = tmp_path / "recovery.json"
    report.write_json(path, report.payload(run, report.summary(run), "recovery"))
    again, data = report.load(path)
    assert [r.status for r in again.records] == ["ok", "skipped"]
    assert report.recovery_table(report.summary(again), report.skipped(again)) == (
        report.recovery_table(report.summary(run), report.skipped(run))
    )
    assert data["skipped"] == {"node_loss": "needs root"}


RESULTS = sorted(
    p for p in (BENCH / "results").glob("*.json") if p.name.startswith(("recovery-", "compare-"))
)


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_saved_schema_1_results_still_render(path: Path) -> None:
    run, data = report.load(path)
    stats = report.summary(run)
    if data["benchmark"] == "recovery":
        table = report.recovery_table(stats, report.skipped(run))
        assert table.startswith("| scenario | metric | median | min | max | n |")
    else:
        table = report.compare_table(stats)
        assert table.startswith("| scenario | metric | Lazarus | torchrun |")
        # Schema 1's "detection_s" of the comparison is today's detection_from_injection_s.
        if "crash" in stats:  # a file may hold other scenarios only (clean, overhead, soak)
            assert "| crash | detection_from_injection_s |" in table
        assert "| crash | detection_s |" not in table
    for record in run.records:
        for name in record.metrics:
            lookup(name)


def test_chaos_files_are_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "chaos.json"
    path.write_text(json.dumps({"benchmark": "chaos", "runs": []}))
    with pytest.raises(ValueError, match="chaos results file"):
        report.load(path)


def test_measured_defaults_are_independent() -> None:
    a, b = Measured(), Measured()
    a.metrics["completed"] = True
    assert b.metrics == {}
