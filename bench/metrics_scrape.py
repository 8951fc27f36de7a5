"""``python -m bench.metrics_scrape``: what the worker's metrics endpoint costs as jobs add up.

For each job count it fills one :class:`~lazarus.app.metrics.LazarusMetrics` as the
collector does (each job's status answer with ``--incidents`` recovered incidents and a
quarantined node, plus the activities' observations), serves it on loopback as
``lazarus worker --metrics-port`` does, and reports a scrape's wall time and size, the
series, and the collector's CPU per status answer. No Temporal server: the query side
is measured by ``tests/e2e/test_metrics_e2e.py``. Figures:
docs/results/2026-12-metrics-scrape.md. Example::

    python -m bench.metrics_scrape --jobs 1,10,100,500 --incidents 5
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.request
from pathlib import Path
from typing import Any

from activities.observe import Observation
from bench.costs import node_counts, results_path, write_results
from lazarus.app.metrics import LazarusMetrics, MetricsSettings, serve
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.ports import free_port
from workflows.playbook import Action
from workflows.state import Incident, JobStatus, NodePool, Phase, QuarantinedNode

CLASSES = (FailureClass.UNKNOWN, FailureClass.HANG, FailureClass.NODE_LOST)


def job_status(job: str, incidents: int) -> JobStatus:
    """A running job that has had ``incidents`` recovered failures."""
    recorded = []
    for number in range(1, incidents + 1):
        fault = 1_000.0 * number
        incident = Incident.opened(
            id=number,
            generation=number,
            kind="crash",
            failure_class=CLASSES[number % len(CLASSES)],
            fault_at=fault,
            detected_at=fault + 0.5,
            rank=number % 8,
        )
        incident.action = Action.RESTART
        incident.steps_lost = 3
        incident.stopped_at, incident.relaunched_at = fault + 1.0, fault + 1.5
        incident.first_step_at, incident.recovery_s = fault + 4.0, 4.0
        recorded.append(incident)
    return JobStatus(
        job_id=job,
        phase=Phase.RUNNING,
        generation=incidents + 1,
        step=10_000,
        world_size=16,
        ranks=[],
        restarts=incidents,
        max_restarts=100,
        incidents=recorded,
        ettr=0.95,
        elapsed_s=86_400.0,
        nodes=NodePool(
            active=[f"{job}-n{i}" for i in range(2)],
            spares=[f"{job}-s0"],
            quarantined=[QuarantinedNode(node=f"{job}-q0", reason="ecc", at=1.0)],
        ),
        mttr_s=4.0,
        durable_steps=[9_000],
    )


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as answer:
        body: bytes = answer.read()
        return body


def measure(jobs: int, incidents: int, scrapes: int) -> dict[str, Any]:
    metrics = LazarusMetrics(process_metrics=True)
    statuses = [job_status(f"job-{n:04d}", incidents) for n in range(jobs)]
    cpu_started = time.process_time()
    for answer in statuses:
        metrics.record_status(answer)
    record_cpu_s = time.process_time() - cpu_started
    for answer in statuses:
        for kind in ("supervision_poll", "checkpoint_verify", "checkpoint_upload"):
            metrics.observe(Observation(kind=kind, job=answer.job_id, seconds=0.2, size_bytes=1))
        metrics.observe(Observation(kind="checkpoint_save", job=answer.job_id, seconds=1.0))
    settings = MetricsSettings(port=free_port(), addr="127.0.0.1")
    server = serve(metrics, settings)
    try:
        url = f"http://127.0.0.1:{settings.port}/metrics"
        fetch(url)  # warm
        timings, sizes = [], []
        for _ in range(scrapes):
            started = time.perf_counter()
            body = fetch(url)
            timings.append(time.perf_counter() - started)
            sizes.append(len(body))
    finally:
        server.shutdown()
        server.server_close()
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    return {
        "jobs": jobs,
        "incidents_per_job": incidents,
        "scrape_median_ms": round(statistics.median(timings) * 1000, 2),
        "scrape_max_ms": round(max(timings) * 1000, 2),
        "bytes": int(statistics.median(sizes)),
        "series": series,
        "record_status_cpu_ms_per_job": round(record_cpu_s / max(1, jobs) * 1000, 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.metrics_scrape", description=__doc__)
    parser.add_argument(
        "--jobs", type=node_counts, default=(1, 10, 100, 500), help="job counts, comma-separated"
    )
    parser.add_argument("--incidents", type=int, default=5, help="recovered incidents per job")
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = [measure(n, args.incidents, args.scrapes) for n in args.jobs]
    table = [
        "| jobs | incidents/job | series | bytes | scrape median ms | max ms "
        "| record_status ms/job |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    table += [
        f"| {r['jobs']} | {r['incidents_per_job']} | {r['series']} | {r['bytes']} | "
        f"{r['scrape_median_ms']} | {r['scrape_max_ms']} | {r['record_status_cpu_ms_per_job']} |"
        for r in rows
    ]
    payload = {"benchmark": "metrics-scrape", "rows": rows}
    write_results(results_path("metrics-scrape", args.json_out), payload, "\n".join(table))


if __name__ == "__main__":
    main()
