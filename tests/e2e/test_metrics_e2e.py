"""The worker's metrics endpoint during a real job with one crash: the incident
counters move by exactly one incident, however often the collector asks.

A worker is started here with ``--metrics-port`` (and the Temporal SDK's metrics on
``--sdk-metrics-port``), the example DDP job runs on its task queue, rank 1 is
SIGKILLed at step 25, and the endpoint is scraped before, during and after. The
scrape's cost (time and bytes) is printed, not asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client
from temporalio.service import RPCError

from activities.stop import stop_generations
from infra import chaos
from lazarus.app.devserver import DevServer
from lazarus.app.settings import ConnectionSettings, connect
from lazarus.domain.api import WORKFLOW_TYPE, workflow_id_for
from lazarus.domain.contracts import StopRequest
from lazarus.domain.ports import free_port
from tests.e2e.conftest import Job, ddp_spec
from workflows.state import JobInput, JobStatus, Phase

pytestmark = pytest.mark.e2e

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class MetricsWorker:
    """``lazarus worker --metrics-port P --sdk-metrics-port S`` on its own task queue."""

    def __init__(self, server: DevServer, state_dir: Path) -> None:
        self.task_queue = f"tq-metrics-{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        self.sdk_port = free_port()
        self.address = server.address
        self.log_path = state_dir / "worker.log"
        state_dir.mkdir(parents=True, exist_ok=True)
        env = dict(
            os.environ,
            TEMPORAL_ADDRESS=server.address,
            TEMPORAL_NAMESPACE="default",
            LAZARUS_TASK_QUEUE=self.task_queue,
            LAZARUS_METRICS_ADDR="127.0.0.1",
            LAZARUS_METRICS_INTERVAL_S="0.5",
        )
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "lazarus.app.cli",
                    "worker",
                    "--task-queue",
                    self.task_queue,
                    "--metrics-port",
                    str(self.port),
                    "--sdk-metrics-port",
                    str(self.sdk_port),
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def url(self, sdk: bool = False) -> str:
        return f"http://127.0.0.1:{self.sdk_port if sdk else self.port}/metrics"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as answer:
        body: bytes = answer.read()
        return body


def parse(body: bytes) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


async def scrape_until(
    worker: MetricsWorker, what: str, ready: object, timeout_s: float = 60.0
) -> Samples:
    """Scrape until ``ready(samples)`` holds; the worker log is in the failure."""
    deadline = time.monotonic() + timeout_s
    samples: Samples = {}
    while time.monotonic() < deadline:
        if worker.process.poll() is not None:
            break
        try:
            samples = parse(await asyncio.to_thread(fetch, worker.url()))
        except (urllib.error.URLError, ConnectionError):
            samples = {}
        if samples and ready(samples):  # type: ignore[operator]
            return samples
        await asyncio.sleep(0.25)
    raise AssertionError(
        f"metrics never showed {what} (worker exit {worker.process.poll()}); log:\n"
        + worker.log_path.read_text()[-3000:]
    )


@pytest.fixture
def metrics_worker(dev_server: DevServer, tmp_path: Path) -> Iterator[MetricsWorker]:
    worker = MetricsWorker(dev_server, tmp_path / "worker")
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture
async def started(metrics_worker: MetricsWorker) -> AsyncIterator[list[Job]]:
    jobs: list[Job] = []
    yield jobs
    for job in jobs:
        with contextlib.suppress(RPCError):
            await job.handle.terminate("test teardown")
        await stop_generations(
            StopRequest(
                job_id=job.spec.job_id, run_root=str(job.run_root), grace_s=0, end_of_run=True
            )
        )


@pytest.mark.timeout(300)
async def test_one_crash_moves_the_incident_counters_by_exactly_one(
    metrics_worker: MetricsWorker, started: list[Job], tmp_path: Path
) -> None:
    client: Client = await connect(
        ConnectionSettings(address=metrics_worker.address, task_queue=metrics_worker.task_queue)
    )
    spec = ddp_spec(tmp_path, steps=60)
    handle = await client.start_workflow(
        WORKFLOW_TYPE,
        JobInput(spec=spec),
        id=workflow_id_for(spec.name),
        task_queue=metrics_worker.task_queue,
        result_type=JobStatus,
    )
    job = Job(spec, handle)  # type: ignore[arg-type]
    started.append(job)
    name = spec.name

    def running(samples: Samples) -> bool:
        return total(samples, "lazarus_job_phase", lazarus_job=name, phase="RUNNING") == 1

    before = await scrape_until(metrics_worker, "the job RUNNING", running, timeout_s=120)
    assert total(before, "lazarus_incidents_total", lazarus_job=name) == 0
    assert total(before, "lazarus_jobs", phase="RUNNING") >= 1

    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 25)
    chaos.signal_rank(job.run_root, rank=1, sig=signal.SIGKILL)
    final = await job.result()
    assert final.phase == Phase.SUCCEEDED
    [incident] = final.incidents
    assert incident.recovery_s is not None

    def recovered(samples: Samples) -> bool:
        return (
            total(samples, "lazarus_recovery_seconds_count", lazarus_job=name) >= 1
            and total(samples, "lazarus_job_phase", lazarus_job=name, phase="SUCCEEDED") == 1
        )

    after = await scrape_until(metrics_worker, "the recovery and the end", recovered)
    # Let the collector ask several more times: nothing may count twice.
    await asyncio.sleep(2.0)
    later = parse(await asyncio.to_thread(fetch, metrics_worker.url()))
    for samples in (after, later):
        assert total(samples, "lazarus_incidents_total", lazarus_job=name) == 1
        assert (
            total(
                samples,
                "lazarus_incidents_total",
                lazarus_job=name,
                **{"class": incident.failure_class.value},
                decision=str(incident.action),
            )
            == 1
        )
        assert total(samples, "lazarus_detection_seconds_count", lazarus_job=name) == 1
        assert total(samples, "lazarus_recovery_seconds_count", lazarus_job=name) == 1
        assert total(samples, "lazarus_recovery_seconds_sum", lazarus_job=name) == pytest.approx(
            incident.recovery_s
        )
        assert total(samples, "lazarus_steps_lost_total", lazarus_job=name) == (
            incident.steps_lost or 0
        )
    assert total(later, "lazarus_job_step", lazarus_job=name) == 60
    assert total(later, "lazarus_job_restarts_remaining", lazarus_job=name) == (
        final.max_restarts - final.restarts
    )
    assert total(later, "lazarus_supervision_poll_seconds_count", lazarus_job=name) > 0
    phases = {dict(ls).get("phase") for (n, ls) in later if n.startswith("lazarus_recovery_phase")}
    assert {"detected", "first_new_step"} <= phases, phases

    sdk = (await asyncio.to_thread(fetch, metrics_worker.url(sdk=True))).decode()
    assert "temporal_" in sdk, "the Temporal SDK's runtime metrics are not served"
    promtool = shutil.which("promtool")
    if promtool is not None:  # the real endpoint's output passes Prometheus's own lint
        body = await asyncio.to_thread(fetch, metrics_worker.url())
        linted = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True)
        assert linted.returncode == 0, (linted.stdout + linted.stderr).decode()

    # What a scrape costs (reported, not asserted).
    timings, sizes = [], []
    for _ in range(20):
        t0 = time.perf_counter()
        body = await asyncio.to_thread(fetch, metrics_worker.url())
        timings.append(time.perf_counter() - t0)
        sizes.append(len(body))
    cost = {
        "scrapes": len(timings),
        "median_ms": round(statistics.median(timings) * 1000, 2),
        "max_ms": round(max(timings) * 1000, 2),
        "bytes": statistics.median(sizes),
        "series": len(later),
        "sdk_bytes": len(sdk.encode()),
    }
    print(f"\nmetrics scrape cost (1 job, 1 incident): {json.dumps(cost)}")
    out = os.environ.get("LAZARUS_METRICS_SCRAPE_OUT")
    if out:
        Path(out).write_text(json.dumps(cost, indent=2) + "\n")
