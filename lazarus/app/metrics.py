"""Lazarus's Prometheus metrics: their definitions, and the two ways they are fed.

Every metric lives in one :class:`LazarusMetrics` (its own registry, so tests make
as many as they like and a worker serves exactly these). They are fed two ways, and
never by workflow code (a workflow replays; a metric it emitted would count twice):

- **from activities**, which observe what they do as they do it: a supervision
  round, a checkpoint verified or uploaded, the save time the ranks report
  (:meth:`LazarusMetrics.observe`, installed as the sink of
  :mod:`activities.observe`);
- **from the status query**, which a collector in the worker asks every few seconds
  (``workers.metrics_collector``): phase, step, ETTR, the pool and every
  incident. :meth:`LazarusMetrics.record_status` turns one answer into metrics, and
  is idempotent: each incident is counted once, keyed by its id and fault time,
  however often it is seen, so asking again (or a replay answering the query)
  never counts twice.

Counters are per job and cumulative over the job's life, so a worker that restarts
and sees a job again starts from the same totals (Prometheus sees no reset). Several
workers each serving metrics report the same job facts: aggregate them with
``max by (lazarus_job, ...)``, not ``sum`` (or turn the collector on in one worker).

The job's label is ``lazarus_job``, never ``job``: Prometheus sets ``job`` (the scrape
config's name) on every series it scrapes, and under its default ``honor_labels: false``
a target's own ``job`` is renamed ``exported_job``, so a dashboard or alert written
against ``job`` would group by the scrape job instead of the Lazarus job.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast, overload
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    Summary,
    start_http_server,
)
from prometheus_client.metrics import MetricWrapperBase
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic import Field as PydanticField
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from lazarus.domain.job_view import Incident, JobStatus, Phase
from lazarus.domain.observation import Observation
from lazarus.domain.recovery_timeline import RecoveryTimeline

DETECTION_BUCKETS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
RECOVERY_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 900.0)
POLL_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
"""Few buckets on purpose: every bucket is a series per job (and class). Where only a
mean is wanted (recovery phases, checkpoint operations) a summary (sum and count) is
used instead: what series cost a scrape is in docs/results/2026-12-metrics-scrape.md."""

UNRECORDED_DECISION = "unrecorded"
"""The decision label of incidents the job had already dropped from its bounded list
(``MAX_INCIDENTS``) before this worker first saw it: counted by class, decision unknown."""

NODE_STATES = ("active", "spare", "quarantined")

JOB_LABEL = "lazarus_job"
"""The label naming the Lazarus job on every per-job series (not ``job``: see the module
docstring)."""

_Metric = TypeVar("_Metric", bound=MetricWrapperBase)


def phase_label(label: str) -> str:
    """A recovery timeline phase (``"survivors stopped"``) as a label value."""
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")


def incident_timeline(incident: Incident) -> RecoveryTimeline:
    """The incident's recovery timeline; for an incident recorded without one, the
    controller's own phase times (detected, stopped, relaunched, first step) in it."""
    if incident.timeline is not None:
        return incident.timeline
    return RecoveryTimeline(
        fault_at=incident.fault_at,
        detected_at=incident.detected_at,
        survivors_stopped_at=incident.stopped_at,
        launch_requested_at=incident.relaunched_at,
        first_step_at=incident.first_step_at,
    )


def _decision(incident: Incident) -> str | None:
    """The playbook's decision as a label; None until it is made (a query never sees
    that in practice: the decision is made in the workflow task that opens it)."""
    return str(incident.action) if incident.action else None


@dataclass
class _JobRecord:
    """What the collector remembers of one job between two status answers."""

    counted: dict[tuple[int, float], set[str]] = field(default_factory=dict)
    """(incident id, fault time) -> the facets already counted (incident, detection,
    steps_lost, recovery): the idempotence key. The fault time tells a re-started
    job's incident 1 from the previous start's."""
    baseline_done: bool = False
    phase: str | None = None
    labels: set[tuple[MetricWrapperBase, tuple[str, ...]]] = field(default_factory=set)
    """Every labelled series this job owns, so :meth:`LazarusMetrics.forget` removes them."""


@dataclass(frozen=True)
class MetricDef(Generic[_Metric]):
    """One row of :class:`LazarusMetrics`'s table: a metric's kind, name, help and
    labels (every per-job metric's first label is :data:`JOB_LABEL`). As a class
    attribute it reads as the instance's own metric of that kind."""

    kind: type[_Metric]
    name: str
    help: str
    labels: tuple[str, ...] = (JOB_LABEL,)
    buckets: tuple[float, ...] | None = None

    def build(self, registry: CollectorRegistry) -> _Metric:
        extra: dict[str, Any] = {} if self.buckets is None else {"buckets": self.buckets}
        return self.kind(self.name, self.help, list(self.labels), registry=registry, **extra)

    @overload
    def __get__(self, instance: None, owner: type) -> MetricDef[_Metric]: ...
    @overload
    def __get__(self, instance: LazarusMetrics, owner: type) -> _Metric: ...
    def __get__(self, instance: LazarusMetrics | None, owner: type) -> MetricDef[_Metric] | _Metric:
        if instance is None:
            return self
        return cast(_Metric, instance._built[self.name])


_J = JOB_LABEL


class LazarusMetrics:
    """The metrics one worker serves (see the module docstring for where they come from).

    They are defined once, in the table below (:data:`METRICS` lists it); each row is
    also the attribute through which the code feeds that metric."""

    # fmt: off
    # --- from the status query ---------------------------------------------------------
    jobs = MetricDef(Gauge, "lazarus_jobs",
        "Jobs by phase (the jobs this worker's collector tracks).", ("phase",))
    job_phase = MetricDef(Gauge, "lazarus_job_phase",
        "1, labelled with the job's current phase (one series per job).", (_J, "phase"))
    step = MetricDef(Gauge, "lazarus_job_step",
        "Newest training step (the supervisor's live view when fresher).")
    generation = MetricDef(Gauge, "lazarus_job_generation", "Newest generation launched.")
    ettr = MetricDef(Gauge, "lazarus_job_ettr",
        "Effective training time ratio so far: productive over wall time.")
    goodput = MetricDef(Gauge, "lazarus_job_goodput_seconds",
        "Productive training seconds so far (ETTR x elapsed); "
        "rate() is the goodput fraction over a window.")
    elapsed = MetricDef(Gauge, "lazarus_job_elapsed_seconds", "Wall time since the job started.")
    mttr = MetricDef(Gauge, "lazarus_job_mttr_seconds",
        "Mean time to recover over the recovered incidents.")
    restarts_left = MetricDef(Gauge, "lazarus_job_restarts_remaining",
        "Automatic restarts left in the budget (max_restarts - restarts).")
    nodes = MetricDef(Gauge, "lazarus_job_nodes",
        "The job's nodes by state (active, spare, quarantined).", (_J, "state"))
    quarantined = MetricDef(Gauge, "lazarus_quarantined_node",
        "1 for each quarantined node; fenced says its stale ranks were confirmed stopped.",
        (_J, "node", "fenced"))
    durable_step = MetricDef(Gauge, "lazarus_job_durable_checkpoint_step",
        "Newest checkpoint step whose durable copy is uploaded and verified.")
    incidents = MetricDef(Counter, "lazarus_incidents_total",
        "Incidents by class and decision.", (_J, "class", "decision"))
    steps_lost = MetricDef(Counter, "lazarus_steps_lost_total",
        "Training steps redone after incidents.", (_J, "class"))
    detection = MetricDef(Histogram, "lazarus_detection_seconds",
        "Fault to detection, per incident.", (_J, "class"), DETECTION_BUCKETS)
    recovery = MetricDef(Histogram, "lazarus_recovery_seconds",
        "Fault to the first step of the new generation, per recovered incident.",
        (_J, "class"), RECOVERY_BUCKETS)
    recovery_phase = MetricDef(Summary, "lazarus_recovery_phase_seconds",
        "Each recovery phase's time since the previous one (the recovery timeline).",
        (_J, "phase"))
    # --- from activities ---------------------------------------------------------------
    poll = MetricDef(Histogram, "lazarus_supervision_poll_seconds",
        "One supervision round: every node of the generation polled.", (_J,), POLL_BUCKETS)
    save = MetricDef(Gauge, "lazarus_checkpoint_save_seconds",
        "Blocking part of a checkpoint save, as the ranks report it "
        "(median of recent saves, slowest rank).")
    checkpoint = MetricDef(Summary, "lazarus_checkpoint_duration_seconds",
        "One checkpoint verified in full or uploaded to the durable tier.", (_J, "operation"))
    checkpoint_bytes = MetricDef(Counter, "lazarus_checkpoint_bytes_total",
        "Checkpoint bytes verified (hashed) or sent to the durable tier.", (_J, "operation"))
    # --- the collector itself ----------------------------------------------------------
    collect_seconds = MetricDef(Histogram, "lazarus_collector_pass_seconds",
        "One collector pass: list the jobs and query each.", (), POLL_BUCKETS)
    query_failures = MetricDef(Counter, "lazarus_collector_query_failures_total",
        "Status queries that got no answer (the job is counted as last seen).", ())
    # fmt: on

    def __init__(self, *, process_metrics: bool = False) -> None:
        """``process_metrics`` adds the worker process's CPU, memory and open files
        (``process_*``), for a worker that serves these."""
        self.registry = CollectorRegistry(auto_describe=True)
        if process_metrics:
            ProcessCollector(registry=self.registry)
        self._lock = threading.Lock()
        self._jobs: dict[str, _JobRecord] = {}
        self._built: dict[str, MetricWrapperBase] = {
            definition.name: definition.build(self.registry) for definition in METRICS
        }

    # --- plumbing ----------------------------------------------------------------------

    def _series(self, job: str, metric: _Metric, *values: str) -> _Metric:
        """``metric.labels(job, *values)``, remembered as this job's (caller holds the lock)."""
        labels = (job, *values)
        self._jobs.setdefault(job, _JobRecord()).labels.add((metric, labels))
        return metric.labels(*labels)

    @staticmethod
    def _drop(record: _JobRecord, metric: MetricWrapperBase, labels: tuple[str, ...]) -> None:
        """Remove one series of the job (a phase it left, a node back in service)."""
        with contextlib.suppress(KeyError):
            metric.remove(*labels)
        record.labels.discard((metric, labels))

    def tracked_jobs(self) -> list[str]:
        with self._lock:
            return sorted(self._jobs)

    def forget(self, job: str) -> None:
        """Drop every series of ``job`` (a job closed long enough ago): Prometheus keeps
        its history; the endpoint stops growing with every job ever run."""
        with self._lock:
            record = self._jobs.pop(job, None)
            if record is None:
                return
            for metric, labels in record.labels:
                with contextlib.suppress(KeyError):  # already gone
                    metric.remove(*labels)
            self._publish_phase_counts()

    # --- from activities -----------------------------------------------------------------

    def observe(self, observation: Observation) -> None:
        """The sink for :func:`activities.observe.observe`."""
        job = observation.job
        with self._lock:
            match observation.kind:
                case "supervision_poll":
                    self._series(job, self.poll).observe(observation.seconds)
                case "checkpoint_save":
                    self._series(job, self.save).set(observation.seconds)
                case "checkpoint_verify" | "checkpoint_upload":
                    operation = observation.kind.removeprefix("checkpoint_")
                    self._series(job, self.checkpoint, operation).observe(observation.seconds)
                    if observation.size_bytes:
                        self._series(job, self.checkpoint_bytes, operation).inc(
                            observation.size_bytes
                        )

    # --- from the status query -----------------------------------------------------------

    def record_status(
        self, status: JobStatus, *, job: str | None = None, step: int | None = None
    ) -> None:
        """Turn one status answer into metrics. Gauges take its values; each incident is
        counted once (see :class:`_JobRecord`), so calling this again with the same or a
        later answer only adds what is new. ``step`` is a fresher step (the supervisor's
        heartbeat) when the caller has one."""
        name = job or status.job_id
        with self._lock:
            record = self._jobs.setdefault(name, _JobRecord())
            self._record_gauges(name, record, status, step)
            if not record.baseline_done:
                record.baseline_done = True
                for failure_class, count in sorted(status.dropped_by_class.items()):
                    self._series(name, self.incidents, failure_class, UNRECORDED_DECISION).inc(
                        count
                    )
            for incident in status.incidents:
                self._record_incident(name, record, incident)
            # Incidents dropped from the job's bounded list never come back: their keys
            # can go (ids only grow, so a dropped id is never seen again).
            record.counted = {
                key: facets
                for key, facets in record.counted.items()
                if key[0] > status.incidents_dropped
            }
            self._publish_phase_counts()

    def _record_gauges(
        self, job: str, record: _JobRecord, status: JobStatus, step: int | None
    ) -> None:
        if record.phase is not None and record.phase != status.phase.value:
            self._drop(record, self.job_phase, (job, record.phase))
        record.phase = status.phase.value
        self._series(job, self.job_phase, record.phase).set(1)
        newest = max((s for s in (status.step, step) if s is not None), default=None)
        if newest is not None:
            self._series(job, self.step).set(newest)
        self._series(job, self.generation).set(status.generation)
        if status.ettr is not None:
            self._series(job, self.ettr).set(status.ettr)
            self._series(job, self.goodput).set(status.ettr * status.elapsed_s)
        self._series(job, self.elapsed).set(status.elapsed_s)
        if status.mttr_s is not None:
            self._series(job, self.mttr).set(status.mttr_s)
        self._series(job, self.restarts_left).set(max(0, status.max_restarts - status.restarts))
        pool = status.nodes
        counts = {
            "active": len(pool.active),
            "spare": len(pool.spares),
            "quarantined": len(pool.quarantined),
        }
        for state in NODE_STATES:
            self._series(job, self.nodes, state).set(counts[state])
        self._set_quarantined(
            job, record, [(q.node, "true" if q.fenced else "false") for q in pool.quarantined]
        )
        if status.durable_steps:
            self._series(job, self.durable_step).set(status.durable_steps[-1])

    def _set_quarantined(
        self, job: str, record: _JobRecord, nodes: Iterable[tuple[str, str]]
    ) -> None:
        """One series per quarantined node; a node returned to service loses its series."""
        wanted = {(job, node, fenced) for node, fenced in nodes}
        for metric, labels in list(record.labels):
            if metric is self.quarantined and labels not in wanted:
                self._drop(record, metric, labels)
        for labels in sorted(wanted):
            self._series(job, self.quarantined, *labels[1:]).set(1)

    def _record_incident(self, job: str, record: _JobRecord, incident: Incident) -> None:
        facets = record.counted.setdefault((incident.id, incident.fault_at), set())
        failure_class = incident.failure_class.value
        decision = _decision(incident)
        if "incident" not in facets and decision is not None:
            facets.add("incident")
            self._series(job, self.incidents, failure_class, decision).inc()
        if "detection" not in facets:
            facets.add("detection")
            self._series(job, self.detection, failure_class).observe(incident.detection_s)
        if "steps_lost" not in facets and incident.steps_lost is not None:
            facets.add("steps_lost")
            self._series(job, self.steps_lost, failure_class).inc(incident.steps_lost)
        if "recovery" not in facets and incident.recovery_s is not None:
            facets.add("recovery")
            self._series(job, self.recovery, failure_class).observe(incident.recovery_s)
            for duration in incident_timeline(incident).durations():
                self._series(job, self.recovery_phase, phase_label(duration.phase)).observe(
                    duration.seconds
                )

    def _publish_phase_counts(self) -> None:
        counts = {phase.value: 0 for phase in Phase}
        for record in self._jobs.values():
            if record.phase is not None:
                counts[record.phase] += 1
        for phase, count in counts.items():
            self.jobs.labels(phase).set(count)


METRICS: tuple[MetricDef[Any], ...] = tuple(
    value for value in vars(LazarusMetrics).values() if isinstance(value, MetricDef)
)
"""Every metric a worker serves (but ``process_*``), in the table's order."""

# --- serving -------------------------------------------------------------------------------

METRICS_PORT_ENV = "LAZARUS_METRICS_PORT"
SDK_METRICS_PORT_ENV = "LAZARUS_SDK_METRICS_PORT"
METRICS_ADDR_ENV = "LAZARUS_METRICS_ADDR"
METRICS_INTERVAL_ENV = "LAZARUS_METRICS_INTERVAL_S"


_SETTING_NAMES = {
    "port": f"--metrics-port / {METRICS_PORT_ENV}",
    "sdk_port": f"--sdk-metrics-port / {SDK_METRICS_PORT_ENV}",
    "addr": f"--metrics-addr / {METRICS_ADDR_ENV}",
    "interval_s": METRICS_INTERVAL_ENV,
}
"""How a person set each field: what a refusal names."""


class MetricsProblem(Exception):
    """Metrics cannot be served as configured; the message is one line for a person."""


class MetricsSettings(BaseModel):
    """Where a worker serves its metrics, and how often it asks its jobs for status."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    port: int | None = PydanticField(default=None, ge=1, le=65535)
    """Lazarus's metrics (``/metrics``); None serves none and runs no collector."""
    sdk_port: int | None = PydanticField(default=None, ge=0, le=65535)
    """The Temporal SDK's own metrics (workflow task latency, poller counts...), served
    by its runtime on a second port: default ``port + 1``; 0 turns them off."""
    addr: str = "127.0.0.1"
    """Bind address of both endpoints: loopback unless set. The endpoints are plain
    HTTP with no authentication and name jobs, nodes and quarantines, so publishing
    them on other interfaces (``0.0.0.0`` for a Prometheus elsewhere, or one
    interface's address) is a choice made explicitly (``--metrics-addr``,
    ``LAZARUS_METRICS_ADDR``), as the dev server refuses non-loopback addresses."""
    interval_s: float = PydanticField(default=5.0, gt=0, le=3600)
    """How often the collector queries every job's status."""
    retention_s: float = PydanticField(default=900.0, ge=0)
    """How long a closed job's series stay on the endpoint after it ends."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> MetricsSettings:
        """Settings from ``LAZARUS_METRICS_*``; ``None`` overrides (unset CLI options) fall
        through to the environment. Raises :class:`MetricsProblem` naming the bad value."""
        source = os.environ if env is None else env
        values: dict[str, Any] = {}
        for key, name in (
            ("port", METRICS_PORT_ENV),
            ("sdk_port", SDK_METRICS_PORT_ENV),
            ("addr", METRICS_ADDR_ENV),
            ("interval_s", METRICS_INTERVAL_ENV),
        ):
            if source.get(name, "").strip():
                values[key] = source[name].strip()
        values.update({key: value for key, value in overrides.items() if value is not None})
        try:
            settings = cls(**values)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = ".".join(str(part) for part in error["loc"])
            where = _SETTING_NAMES.get(field, field)
            raise MetricsProblem(f"{where}: {error['msg']} (got {error['input']!r})") from None
        if settings.port is not None and settings.sdk_port is None:
            settings = settings.model_copy(update={"sdk_port": settings.port + 1})
        if settings.port is not None and settings.port == settings.sdk_port:
            raise MetricsProblem(
                f"--metrics-port and --sdk-metrics-port are both {settings.port}: "
                "the Temporal SDK serves its metrics on a port of its own"
            )
        return settings

    @property
    def sdk_enabled(self) -> bool:
        return bool(self.sdk_port)


def prepare_metrics(settings: MetricsSettings) -> None:
    """Before the worker connects: refuse a busy metrics port (one line, nothing
    started), and make the Temporal SDK serve its runtime metrics on
    ``settings.sdk_port`` (the client's runtime is the default one, made now)."""
    if settings.port is not None:
        _require_free(settings.addr, settings.port, "--metrics-port")
    if not settings.sdk_enabled:
        return
    where = f"{settings.addr}:{settings.sdk_port}"
    _require_free(settings.addr, settings.sdk_port or 0, "--sdk-metrics-port")
    try:
        runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=where)))
    except Exception as exc:  # the core reports a bind failure as a plain exception
        raise MetricsProblem(f"cannot serve the Temporal SDK's metrics on {where}: {exc}") from None
    Runtime.set_default(runtime, error_if_already_set=False)


def serve(metrics: LazarusMetrics, settings: MetricsSettings) -> WSGIServer:
    """Serve ``metrics`` over HTTP on ``settings.port`` (a daemon thread); stop it with
    ``shutdown()``. A port in use is one clear line, not a traceback."""
    if settings.port is None:
        raise MetricsProblem("no metrics port set (--metrics-port or LAZARUS_METRICS_PORT)")
    _require_free(settings.addr, settings.port, "--metrics-port")
    try:
        server, _ = start_http_server(settings.port, settings.addr, registry=metrics.registry)
    except OSError as exc:
        raise MetricsProblem(
            f"cannot serve metrics on {settings.addr}:{settings.port}: {exc.strerror or exc}"
        ) from None
    return server


def _require_free(addr: str, port: int, option: str) -> None:
    """Bind-probe first, so both endpoints fail the same way: naming the option."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((addr, port))
        except OSError as exc:
            raise MetricsProblem(
                f"{option} {port}: cannot listen on {addr}:{port}: {exc.strerror or exc}"
            ) from None
