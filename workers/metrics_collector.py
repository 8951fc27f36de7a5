"""The query side of the worker's metrics: ask every job its status, turn it into metrics.

A workflow never emits metrics (it replays; anything it emitted would count again),
so the job's facts (phase, step, ETTR, pool, incidents) reach Prometheus the way they
reach ``lazarus status``: through the status query. Every ``interval_s`` this
collector lists the jobs of its task queue that run, or ended within
``retention_s``, and asks each (at most :data:`CONCURRENT_QUERIES` at once) through
:meth:`lazarus.app.client.JobClient.status`; :meth:`LazarusMetrics.record_status` makes
the answer idempotent, so asking every few seconds counts each incident once.

A job that ended is asked once more for its final status (an incident that closed
between two passes still counts), kept on the endpoint for ``retention_s``, then
forgotten. What a pass costs: one visibility list, and per job a describe and a
query (a workflow task on some worker: cheap while the job is in that worker's
cache, a replay of its history otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus

from activities.observe import install_sink
from lazarus.app.client import ClientError, JobClient
from lazarus.app.metrics import LazarusMetrics, MetricsSettings, serve
from lazarus.app.settings import ConnectionProblem
from lazarus.domain.api import WORKFLOW_TYPE, job_name_from

log = logging.getLogger("lazarus.app.metrics")

CONCURRENT_QUERIES = 16
"""Status queries in flight at once: bounds the load one pass puts on the workers."""


class MetricsCollector:
    """Keeps ``metrics`` in step with the jobs on ``task_queue`` (see the module docstring)."""

    def __init__(
        self,
        client: Client,
        metrics: LazarusMetrics,
        task_queue: str,
        *,
        interval_s: float = 5.0,
        retention_s: float = 900.0,
    ) -> None:
        self.jobs = JobClient(client, task_queue=task_queue)
        self.metrics = metrics
        self.task_queue = task_queue
        self.interval_s = interval_s
        self.retention_s = retention_s
        self._final: set[tuple[str, str]] = set()
        """(workflow id, run id) of ended runs whose final status is already recorded."""

    def visibility_query(self, now: datetime) -> str:
        since = (now - timedelta(seconds=self.retention_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return (
            f"WorkflowType = '{WORKFLOW_TYPE}' AND TaskQueue = '{self.task_queue}' "
            f"AND (ExecutionStatus = 'Running' OR CloseTime > '{since}')"
        )

    async def newest_runs(self) -> list[WorkflowExecution]:
        """The newest run of each job of this queue that runs or ended lately
        (continue-as-new leaves a closed run behind every open one)."""
        newest: dict[str, WorkflowExecution] = {}
        async for execution in self.jobs.temporal.list_workflows(
            self.visibility_query(datetime.now(UTC))
        ):
            current = newest.get(execution.id)
            if current is None or execution.start_time > current.start_time:
                newest[execution.id] = execution
        return list(newest.values())

    async def collect_once(self) -> None:
        """One pass: every listed job asked once; jobs no longer listed forgotten."""
        started = time.monotonic()
        runs = await self.newest_runs()
        limit = asyncio.Semaphore(CONCURRENT_QUERIES)

        async def ask(execution: WorkflowExecution) -> None:
            async with limit:
                await self._record(execution)

        await asyncio.gather(*(ask(e) for e in runs))
        listed = {job_name_from(e.id) for e in runs}
        for job in self.metrics.tracked_jobs():
            if job not in listed:
                self.metrics.forget(job)
        self._final = {key for key in self._final if job_name_from(key[0]) in listed}
        self.metrics.collect_seconds.observe(time.monotonic() - started)

    async def _record(self, execution: WorkflowExecution) -> None:
        key = (execution.id, execution.run_id)
        ended = execution.status not in (None, WorkflowExecutionStatus.RUNNING)
        if ended and key in self._final:
            return
        name = job_name_from(execution.id)
        try:
            view = await self.jobs.status(name)
        except (ClientError, ConnectionProblem) as exc:
            self.metrics.query_failures.inc()
            log.debug("no status for %s: %s", name, exc)
            return
        if view.status is None:
            self.metrics.query_failures.inc()
            return
        self.metrics.record_status(view.status, job=name, step=view.step)
        if ended:
            self._final.add(key)

    async def run(self) -> None:
        """Collect every ``interval_s`` until cancelled; a failed pass is logged and
        the next one tries again (a server restart must not end metrics)."""
        while True:
            started = time.monotonic()
            try:
                await self.collect_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "metrics collection failed (next try in %.0f s): %s", self.interval_s, exc
                )
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))


@contextlib.asynccontextmanager
async def serving_metrics(
    client: Client, settings: MetricsSettings, task_queue: str
) -> AsyncIterator[LazarusMetrics | None]:
    """While inside: ``/metrics`` served on ``settings.port``, activities' observations
    routed to it, and the collector running. Without a port, nothing (yields None)."""
    if settings.port is None:
        yield None
        return
    metrics = LazarusMetrics(process_metrics=True)
    server = serve(metrics, settings)
    install_sink(metrics.observe)
    collector = MetricsCollector(
        client,
        metrics,
        task_queue,
        interval_s=settings.interval_s,
        retention_s=settings.retention_s,
    )
    task = asyncio.create_task(collector.run(), name="lazarus-metrics-collector")
    log.info(
        "metrics on http://%s:%d/metrics (Temporal SDK metrics: %s), collecting every %.1f s",
        settings.addr,
        settings.port,
        f"port {settings.sdk_port}" if settings.sdk_enabled else "off",
        settings.interval_s,
    )
    try:
        yield metrics
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        install_sink(None)
        await asyncio.to_thread(server.shutdown)
        server.server_close()
