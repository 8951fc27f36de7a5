"""``infra/grafana/lazarus.json`` is a dashboard Grafana can import, and it asks only
for metrics the worker serves, in PromQL that Prometheus's own ``promtool`` accepts."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from activities.observe import Observation
from lazarus.app.metrics import LazarusMetrics
from tests.unit.test_metrics import incident, status
from workflows.state import NodePool, QuarantinedNode

pytestmark = pytest.mark.timeout(60)

DASHBOARD = Path(__file__).resolve().parents[2] / "infra" / "grafana" / "lazarus.json"
REQUIRED_PANELS = (
    "Goodput over time",
    "Incidents by class",
    "MTTR",
    "Recovery phase breakdown (mean seconds per incident)",
)
GRAFANA_VARIABLES = {"$job": ".*", "$__rate_interval": "1m", "$__range": "1h"}
"""What Grafana substitutes before the query reaches Prometheus (values for the check)."""


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def queries() -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in dashboard()["panels"]
        for target in panel.get("targets", [])
    ]


def served_metric_names() -> set[str]:
    """Every sample name a worker's endpoint has once each metric has a value."""
    metrics = LazarusMetrics()
    metrics.record_status(
        status(
            incident(recovered=True, steps_lost=2),
            nodes=NodePool(active=["a"], quarantined=[QuarantinedNode(node="b", reason="x", at=1)]),
            durable_steps=[10],
            mttr_s=1.0,
        )
    )
    for kind in ("supervision_poll", "checkpoint_save", "checkpoint_verify", "checkpoint_upload"):
        metrics.observe(Observation(kind=kind, job="job-a", seconds=0.1, size_bytes=10))  # type: ignore[arg-type]
    return {s.name for family in metrics.registry.collect() for s in family.samples}


def test_it_is_a_grafana_dashboard() -> None:
    board = dashboard()
    assert board["uid"] and board["title"] and isinstance(board["schemaVersion"], int)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["job"]["multi"] and variables["job"]["includeAll"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]
            assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
    titles = {p["title"] for p in board["panels"]}
    assert set(REQUIRED_PANELS) <= titles


def test_it_asks_only_for_metrics_the_worker_serves() -> None:
    served = served_metric_names()
    asked = {
        (title, name)
        for title, expr in queries()
        for name in re.findall(r"\blazarus_[a-z_]+\b", expr)
    }
    assert asked
    unknown = sorted(f"{title}: {name}" for title, name in asked if name not in served)
    assert not unknown, "the dashboard asks for metrics nobody serves:\n" + "\n".join(unknown)


def _promtool() -> str | None:
    found = shutil.which("promtool")
    if found is None and os.environ.get("CI"):
        pytest.fail("promtool is missing: infra/install-test-prereqs.sh installs it (prometheus)")
    return found


@pytest.mark.slow  # runs promtool
def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """``promtool check rules`` parses each expression, as Grafana would send it."""
    promtool = _promtool()
    if promtool is None:
        pytest.skip("promtool not installed (Debian's prometheus package)")
    rules = []
    for number, (title, expr) in enumerate(queries()):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        rules.append(
            {"record": f"dashboard:query_{number}", "expr": expr, "labels": {"panel": title}}
        )
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.slow  # runs promtool
def test_the_exposition_passes_promtool_lint() -> None:
    promtool = _promtool()
    if promtool is None:
        pytest.skip("promtool not installed (Debian's prometheus package)")
    metrics = LazarusMetrics(process_metrics=True)
    metrics.record_status(status(incident(recovered=True, steps_lost=1)))
    checked = subprocess.run(
        [promtool, "check", "metrics"],
        input=generate_latest(metrics.registry),
        capture_output=True,
        timeout=30,
    )
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()
