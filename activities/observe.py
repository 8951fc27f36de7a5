"""What activities measure as they work (a poll round, a checkpoint verified or
uploaded), handed to whoever collects it: the one way an activity reports a metric.

Activities know nothing of Prometheus. A worker started with ``--metrics-port``
installs a sink (``lazarus.app.metrics.LazarusMetrics.observe``); without one,
:func:`observe` costs a global read and does nothing. Only activities call it, never
workflow code: an activity runs once per attempt, for real, so what it observes
happened; a workflow replays, and a metric emitted from replayed code would count
twice (which is why the job's own facts come from the status query instead, see
``workers.metrics_collector``).

A metric must never fail the work it measures: a sink that raises is logged once
and otherwise ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from temporalio import activity

from lazarus.domain.api import job_name_from
from lazarus.domain.observation import Observation as Observation
from lazarus.domain.observation import ObservationKind as ObservationKind

log = logging.getLogger("lazarus.app.metrics")

Sink = Callable[[Observation], None]

_sink: Sink | None = None
_sink_failed = False


def install_sink(sink: Sink | None) -> None:
    """Route observations to ``sink`` (None: drop them again). Process-wide: one worker
    process serves one metrics endpoint."""
    global _sink, _sink_failed
    _sink, _sink_failed = sink, False


def observe(
    kind: ObservationKind,
    seconds: float,
    *,
    size_bytes: int | None = None,
    job: str | None = None,
) -> None:
    """Record one observation for ``job`` (default: the job of the running activity,
    from its workflow id). Outside an activity and without ``job``, nothing is
    recorded."""
    global _sink_failed
    sink = _sink
    if sink is None:
        return
    job = job if job is not None else _current_job()
    if job is None:
        return
    try:
        sink(Observation(kind=kind, job=job, seconds=max(0.0, seconds), size_bytes=size_bytes))
    except Exception:  # a metric must never fail the activity it measures
        if not _sink_failed:
            _sink_failed = True
            log.exception("recording a %s observation failed; further failures are silent", kind)


def _current_job() -> str | None:
    try:
        return job_name_from(activity.info().workflow_id or "") or None
    except RuntimeError:  # not inside an activity
        return None
