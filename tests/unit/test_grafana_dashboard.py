"""``deploy/grafana/lazarus.json`` is a dashboard Grafana can import, and it asks only
for metrics the worker serves, in PromQL that Prometheus's own ``promtool`` accepts."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from activities.observe import Observation
from lazarus.app.metrics import JOB_LABEL, LazarusMetrics, MetricsSettings, serve
from lazarus.domain.ports import free_port
from tests.unit.test_metrics import incident, status
from workflows.state import NodePool, QuarantinedNode

pytestmark = pytest.mark.timeout(60)

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "lazarus.json"
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
        if name != JOB_LABEL  # the label, not a metric
    }
    assert asked
    unknown = sorted(f"{title}: {name}" for title, name in asked if name not in served)
    assert not unknown, "the dashboard asks for metrics nobody serves:\n" + "\n".join(unknown)


def test_it_groups_and_filters_by_lazarus_job_never_by_prometheus_job() -> None:
    """Prometheus sets ``job`` itself (the scrape job): a query on it would see that,
    never the Lazarus job (ours is renamed ``exported_job`` under ``honor_labels: false``)."""
    board = json.dumps(dashboard())
    for expr_or_label in [expr for _, expr in queries()] + [
        target.get("legendFormat", "")
        for panel in dashboard()["panels"]
        for target in panel.get("targets", [])
    ]:
        assert not re.search(r"(?<![a-z_])job(?![a-z_])\s*(=|!=|=~|!~|[,)}])", expr_or_label), (
            expr_or_label
        )
        assert "{{job}}" not in expr_or_label, expr_or_label
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["job"]["query"]["query"] == f"label_values(lazarus_job_phase, {JOB_LABEL})"
    assert f"{JOB_LABEL}=~" in board


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


def _query(port: int, expr: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.loads(answer.read())
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


@pytest.mark.slow  # runs a real Prometheus server
@pytest.mark.timeout(120)
def test_a_default_scrape_config_keeps_the_lazarus_job(tmp_path: Path) -> None:
    """Scraped by a real Prometheus with a default scrape config (``honor_labels:
    false``), the Lazarus job arrives as ``lazarus_job`` (nothing renamed to
    ``exported_job``), ``job`` is the scrape job, and the dashboard's own queries
    find the Lazarus job by it."""
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is missing: infra/install-test-prereqs.sh installs it")
        pytest.skip("prometheus not installed (Debian's prometheus package)")
    metrics = LazarusMetrics()
    metrics.record_status(status(incident(recovered=True, steps_lost=2), job="train-1"))
    target = serve(metrics, MetricsSettings(port=free_port(), addr="127.0.0.1"))
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "lazarus",
                        "static_configs": [{"targets": [f"127.0.0.1:{target.server_port}"]}],
                    }
                ],
            }
        )
    )
    log = (tmp_path / "prometheus.log").open("wb")
    server = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        found: list[dict[str, Any]] = []
        while time.monotonic() < deadline and server.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                found = _query(port, "lazarus_job_step")
            if found:
                break
            time.sleep(0.5)
        assert found, (tmp_path / "prometheus.log").read_text()[-2000:]
        labels = found[0]["metric"]
        assert labels[JOB_LABEL] == "train-1" and labels["job"] == "lazarus", labels
        assert "exported_job" not in labels, labels
        # The dashboard's job variable and a panel's query, as Grafana sends them.
        values = _query(port, f"count by ({JOB_LABEL}) (lazarus_job_phase)")
        assert [v["metric"][JOB_LABEL] for v in values] == ["train-1"]
        step = _query(port, 'max by (lazarus_job) (lazarus_job_step{lazarus_job=~"train-1"})')
        assert step and step[0]["metric"] == {JOB_LABEL: "train-1"}
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)
        log.close()
        target.shutdown()
        target.server_close()
