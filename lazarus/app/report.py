"""``lazarus report``: one job's run as a picture, and the data behind it.

Operators read a recovery faster from a plot than from a table of timestamps, so a
report draws the training step against wall time, shades each incident by where its
time went, marks the checkpoints, and adds the figures that judge the run (ETTR,
MTTR, steps lost, incidents by class).

Everything comes from two sources Temporal keeps after a job has ended: the job's
status (its final result, or the status query) and its workflow history, read back
across continue-as-new. From the history the report takes what the workflow itself
recorded: each launch (generation, time, resume step), each supervise outcome (step
and time), each checkpoint the housekeeping watch or a recovery saw, and each
durable upload. Nothing reads the nodes, so a report works from any machine that can
reach the server, for a job that is running or long finished.

Three steps, each usable alone (the tests use the first two without a server):

1. :func:`job_history` turns raw :class:`~temporalio.client.WorkflowHistory` runs
   into :class:`JobHistory`, the few decoded facts the report needs;
2. :func:`report_data` joins them with the :class:`JobStatus` into
   :class:`ReportData`: the series, the incident bands, the checkpoint marks and the
   summary. This is the data behind the plot, what ``--json`` prints;
3. :func:`render_png` (matplotlib, the optional ``report`` extra) and
   :func:`render_html` (self-contained: the PNG inline, the tables) draw it.

Recovery phases, per incident (``RECOVERY_PHASES``):

- **detecting**: fault to detection (the supervisor noticed);
- **stopping**: detection to every old rank stopped (includes the decision);
- **relaunching**: stopped to the first step of the new generation (backoff, resume
  point, launch, imports, process group, checkpoint load; waiting for an operator
  when the playbook escalated);
- **catching up**: the first new step until the job is back at the step it had
  reached when it failed: the steps lost, redone. Interpolated on the new
  generation's recorded steps, or estimated from the step time when the job ended
  or failed again first.

Times in :class:`ReportData` are seconds since the job's first start; incident times
are the controller's clock and, for rank phases, the nodes' clocks.
"""

from __future__ import annotations

import base64
import html
from collections import Counter
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from temporalio.api.common.v1 import Payloads
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter

from lazarus.domain.contracts import (
    CheckpointNowResult,
    CheckpointRef,
    CheckpointSearch,
    LaunchRequest,
    LaunchResult,
    SuperviseOutcome,
    UploadResult,
)
from lazarus.domain.job_view import Incident, JobStatus
from lazarus.domain.recovery_timeline import PhaseDuration

RecoveryPhase = Literal["detecting", "stopping", "relaunching", "catching_up"]
RECOVERY_PHASES: tuple[RecoveryPhase, ...] = (
    "detecting",
    "stopping",
    "relaunching",
    "catching_up",
)
"""The four shaded phases of a recovery, in the order a recovery reaches them."""

PHASE_LABELS: dict[RecoveryPhase, str] = {
    "detecting": "detecting",
    "stopping": "stopping",
    "relaunching": "relaunching",
    "catching_up": "catching up",
}
PHASE_COLOURS: dict[RecoveryPhase, str] = {
    "detecting": "tab:red",
    "stopping": "tab:orange",
    "relaunching": "tab:purple",
    "catching_up": "tab:olive",
}

CheckpointTier = Literal["local", "durable"]
PointSource = Literal["launch", "first_step", "progress", "failure", "end"]
CheckpointSource = Literal["watch", "checkpoint_now", "resume", "upload"]

MATPLOTLIB_MISSING = (
    "the report's PNG needs matplotlib, which is not installed: "
    "pip install 'lazarus-train[report]' (or use --json)"
)


class ReportDependencyMissing(RuntimeError):
    """matplotlib is not installed; the message says how to get it."""


# --- what the history holds -----------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class LaunchRecord(_Model):
    """One generation's launch: when its ranks started and from which step."""

    generation: int
    launched_at: float
    resume_step: int | None = None
    """The checkpoint it resumed from; None when it started from scratch."""


class RecordedOutcome(_Model):
    """One supervise outcome, as the workflow received it."""

    outcome: SuperviseOutcome
    recorded_at: float
    """When the activity completed (the server's clock)."""


class SeenCheckpoint(_Model):
    """A checkpoint the workflow learnt of, and when."""

    step: int
    seen_at: float
    tier: CheckpointTier
    source: CheckpointSource


class JobHistory(_Model):
    """The facts a report needs from a job's workflow history, decoded, over every run
    of its continue-as-new chain."""

    started_at: float
    """The first run's start (the server's clock)."""
    closed_at: float | None = None
    """The last run's close; None while the job is open."""
    launches: list[LaunchRecord] = Field(default_factory=list)
    outcomes: list[RecordedOutcome] = Field(default_factory=list)
    checkpoints: list[SeenCheckpoint] = Field(default_factory=list)
    final_status: JobStatus | None = None
    """The completed workflow's result: the final status, readable without a worker."""
    runs: int = 1
    events: int = 0
    unreadable: int = 0
    """Payloads of a shape this version cannot decode (an older or newer controller):
    left out of the report, and counted so the report can say so."""


_STARTED = "workflow_execution_started_event_attributes"
_COMPLETED = "workflow_execution_completed_event_attributes"
_CLOSED = frozenset(
    {
        _COMPLETED,
        "workflow_execution_failed_event_attributes",
        "workflow_execution_canceled_event_attributes",
        "workflow_execution_terminated_event_attributes",
        "workflow_execution_timed_out_event_attributes",
    }
)


def _event_time(event: HistoryEvent) -> float:
    return event.event_time.seconds + event.event_time.nanos / 1e9


def _decode(payloads: Payloads, type_hint: Any) -> Any:
    (value,) = pydantic_data_converter.payload_converter.from_payloads(
        list(payloads.payloads[:1]), [type_hint]
    )
    return value


def job_history(runs: Sequence[WorkflowHistory]) -> JobHistory:
    """Decode ``runs`` (one job's continue-as-new chain, oldest first) into the report's
    facts. A payload that does not decode is counted in ``unreadable``, not fatal: a
    report of an old job should still draw what it can."""
    if not runs or not runs[0].events:
        raise ValueError("the job's history is empty")
    launches: list[LaunchRecord] = []
    outcomes: list[RecordedOutcome] = []
    checkpoints: list[SeenCheckpoint] = []
    final_status: JobStatus | None = None
    closed_at: float | None = None
    unreadable = 0
    events = 0
    for run in runs:
        scheduled: dict[int, HistoryEvent] = {}
        for event in run.events:
            events += 1
            which = event.WhichOneof("attributes")
            at = _event_time(event)
            if which == "activity_task_scheduled_event_attributes":
                scheduled[event.event_id] = event
                continue
            if which in _CLOSED:
                closed_at = at
                if which == _COMPLETED:
                    try:
                        result = _decode(
                            event.workflow_execution_completed_event_attributes.result, JobStatus
                        )
                    except Exception:
                        unreadable += 1
                    else:
                        final_status = result if isinstance(result, JobStatus) else None
                continue
            if which != "activity_task_completed_event_attributes":
                continue
            completed = event.activity_task_completed_event_attributes
            origin = scheduled.get(completed.scheduled_event_id)
            if origin is None:
                continue
            attributes = origin.activity_task_scheduled_event_attributes
            try:
                _read_activity(
                    attributes.activity_type.name,
                    attributes.input,
                    completed.result,
                    at,
                    launches,
                    outcomes,
                    checkpoints,
                )
            except Exception:  # an older or newer payload shape
                unreadable += 1
        last = run.events[-1] if run.events else None
        if last is not None and last.HasField(
            "workflow_execution_continued_as_new_event_attributes"
        ):
            closed_at = None  # the chain goes on in the next run
    return JobHistory(
        started_at=_event_time(runs[0].events[0]),
        closed_at=closed_at,
        launches=launches,
        outcomes=outcomes,
        checkpoints=checkpoints,
        final_status=final_status,
        runs=len(runs),
        events=events,
        unreadable=unreadable,
    )


def _read_activity(
    name: str,
    request: Payloads,
    result: Payloads,
    at: float,
    launches: list[LaunchRecord],
    outcomes: list[RecordedOutcome],
    checkpoints: list[SeenCheckpoint],
) -> None:
    """Add what one completed activity tells the report (most tell it nothing)."""
    if name == "launch":
        launch_request = _decode(request, LaunchRequest)
        launched = _decode(result, LaunchResult)
        resume = launch_request.resume
        launches.append(
            LaunchRecord(
                generation=launched.generation,
                launched_at=launched.launched_at,
                resume_step=resume.step if resume is not None else None,
            )
        )
    elif name == "supervise":
        outcomes.append(RecordedOutcome(outcome=_decode(result, SuperviseOutcome), recorded_at=at))
    elif name == "watch_checkpoints":
        found = _decode(result, CheckpointRef | None) if result.payloads else None
        if isinstance(found, CheckpointRef):
            checkpoints.append(
                SeenCheckpoint(step=found.step, seen_at=at, tier="local", source="watch")
            )
    elif name == "checkpoint_now":
        saved = _decode(result, CheckpointNowResult).checkpoint
        if saved is not None:
            checkpoints.append(
                SeenCheckpoint(step=saved.step, seen_at=at, tier="local", source="checkpoint_now")
            )
    elif name == "find_verified_checkpoint":
        search = _decode(result, CheckpointSearch)
        if search.chosen is not None:
            tier: CheckpointTier = "durable" if search.location == "durable" else "local"
            checkpoints.append(
                SeenCheckpoint(step=search.chosen.step, seen_at=at, tier=tier, source="resume")
            )
    elif name == "upload_checkpoint":
        uploaded = _decode(result, UploadResult)
        if uploaded.verified:
            checkpoints.append(
                SeenCheckpoint(step=uploaded.step, seen_at=at, tier="durable", source="upload")
            )


# --- the data behind the plot ---------------------------------------------------------------


class StepPoint(_Model):
    """The job was at ``step`` at ``t_s`` (seconds since its start), in ``generation``."""

    t_s: float
    step: int
    generation: int
    source: PointSource


class PhaseBand(_Model):
    """One shaded stretch of an incident."""

    phase: RecoveryPhase
    start_s: float
    end_s: float
    complete: bool = True
    """False when the phase had not ended when the report was made (or the job ended,
    or failed again, first): ``end_s`` is then where it was cut off."""
    estimated: bool = False
    """True for a catch-up whose end comes from the step time, not recorded steps."""

    @property
    def seconds(self) -> float:
        return max(0.0, self.end_s - self.start_s)


class IncidentReport(_Model):
    """One incident: its shaded phases and its finer timeline."""

    id: int
    generation: int
    kind: str
    failure_class: str
    action: str
    reason: str
    fault_s: float
    steps_lost: int | None
    recovery_s: float | None
    bands: list[PhaseBand]
    """The shaded phases, in order; phases never reached are left out."""
    timeline: list[PhaseDuration] = Field(default_factory=list)
    """The controller's and ranks' finer phases (:class:`RecoveryTimeline`), if kept."""

    def phase_seconds(self) -> dict[str, float]:
        return {band.phase: round(band.seconds, 3) for band in self.bands}


class CheckpointMark(_Model):
    step: int
    t_s: float
    """When the workflow learnt of it: committed at or before this time."""
    tier: CheckpointTier
    source: CheckpointSource


class ReportSummary(_Model):
    phase: str
    generation: int
    step: int | None
    elapsed_s: float
    ettr: float | None
    mttr_s: float | None
    steps_lost: int
    restarts: int
    incidents: int
    """All incidents, including the older ones the status keeps only as counts."""
    incidents_by_class: dict[str, int]
    incidents_by_action: dict[str, int]
    phase_totals_s: dict[str, float]
    """Seconds spent in each recovery phase, over the incidents shown."""
    local_checkpoints: int
    durable_checkpoints: int


class ReportData(_Model):
    """Everything a report draws; ``lazarus report --json`` prints it."""

    job: str
    started_at: float
    """The job's first start, Unix time: ``t_s`` counts from here."""
    duration_s: float
    points: list[StepPoint]
    incidents: list[IncidentReport]
    checkpoints: list[CheckpointMark]
    summary: ReportSummary
    notes: list[str] = Field(default_factory=list)
    """What the report could not show, and why."""

    def generations(self) -> dict[int, list[StepPoint]]:
        """The step series, one line per generation (a restart drops back to its resume)."""
        lines: dict[int, list[StepPoint]] = {}
        for point in self.points:
            lines.setdefault(point.generation, []).append(point)
        return lines


def report_data(status: JobStatus, history: JobHistory) -> ReportData:
    """Join the job's status and its history into the report's data (pure)."""
    origin = history.started_at
    end = (
        history.closed_at if history.closed_at is not None else origin + max(0.0, status.elapsed_s)
    )
    points = _step_points(history, origin)
    incidents = status.incidents
    reports = []
    for index, incident in enumerate(incidents):
        cut_at = end
        if index + 1 < len(incidents):
            cut_at = min(cut_at, incidents[index + 1].fault_at)
        reports.append(_incident_report(incident, origin, cut_at, points, history))
    checkpoints = sorted(
        (
            CheckpointMark(
                step=seen.step, t_s=seen.seen_at - origin, tier=seen.tier, source=seen.source
            )
            for seen in history.checkpoints
        ),
        key=lambda mark: (mark.t_s, mark.step),
    )
    notes = []
    if status.incidents_dropped:
        notes.append(
            f"{status.incidents_dropped} older incidents are counted in the summary but not "
            "drawn (the status keeps the newest in full)"
        )
    if history.unreadable:
        notes.append(
            f"{history.unreadable} history records could not be read by this version and "
            "are left out"
        )
    if not points:
        notes.append("the history records no steps yet")
    return ReportData(
        job=status.job_id,
        started_at=origin,
        duration_s=max(0.0, end - origin),
        points=points,
        incidents=reports,
        checkpoints=checkpoints,
        summary=_summary(status, reports, checkpoints),
        notes=notes,
    )


def _step_points(history: JobHistory, origin: float) -> list[StepPoint]:
    """Where the job's step was, when: each launch at its resume step, then every step
    a supervise outcome recorded (a failure at its fault time)."""
    points = [
        StepPoint(
            t_s=launch.launched_at - origin,
            step=launch.resume_step or 0,
            generation=launch.generation,
            source="launch",
        )
        for launch in history.launches
    ]
    for recorded in history.outcomes:
        outcome = recorded.outcome
        if outcome.step is None:
            continue
        at, source = outcome.observed_at, _source_of(outcome)
        if outcome.kind == "first_step" and outcome.first_step_at is not None:
            at = outcome.first_step_at
        elif outcome.failure is not None:
            at = outcome.failure.fault_at
        points.append(
            StepPoint(
                t_s=at - origin, step=outcome.step, generation=outcome.generation, source=source
            )
        )
    return sorted(points, key=lambda p: (p.generation, p.t_s, p.step))


def _source_of(outcome: SuperviseOutcome) -> PointSource:
    if outcome.kind == "first_step":
        return "first_step"
    if outcome.kind == "succeeded":
        return "end"
    if outcome.failure is not None:
        return "failure"
    return "progress"


def _incident_report(
    incident: Incident,
    origin: float,
    cut_at: float,
    points: list[StepPoint],
    history: JobHistory,
) -> IncidentReport:
    timeline = incident.timeline
    detected = timeline.detected_at if timeline and timeline.detected_at else incident.detected_at
    stopped = (
        timeline.survivors_stopped_at
        if timeline and timeline.survivors_stopped_at
        else incident.stopped_at
    )
    first_step = (
        timeline.first_step_at if timeline and timeline.first_step_at else incident.first_step_at
    )
    bands: list[PhaseBand] = []
    start = incident.fault_at
    reached: tuple[tuple[RecoveryPhase, float | None], ...] = (
        ("detecting", detected),
        ("stopping", stopped),
        ("relaunching", first_step),
    )
    for phase, end in reached:
        if end is None or end > cut_at:
            bands.append(_band(phase, start, max(start, cut_at), origin, complete=False))
            break
        bands.append(_band(phase, start, max(start, end), origin))
        start = max(start, end)
    else:
        catch_up = _catch_up_end(incident, start, points, history, origin)
        if catch_up is not None:
            caught_up_at, estimated = catch_up
            complete = caught_up_at <= cut_at
            bands.append(
                _band(
                    "catching_up",
                    start,
                    min(caught_up_at, max(start, cut_at)),
                    origin,
                    complete=complete,
                    estimated=estimated,
                )
            )
    return IncidentReport(
        id=incident.id,
        generation=incident.generation,
        kind=str(incident.kind),
        failure_class=incident.failure_class.value,
        action=str(incident.action) or "undecided",
        reason=incident.reason,
        fault_s=incident.fault_at - origin,
        steps_lost=incident.steps_lost,
        recovery_s=incident.recovery_s,
        bands=bands,
        timeline=timeline.durations() if timeline is not None else [],
    )


def _band(
    phase: RecoveryPhase,
    start: float,
    end: float,
    origin: float,
    *,
    complete: bool = True,
    estimated: bool = False,
) -> PhaseBand:
    return PhaseBand(
        phase=phase,
        start_s=start - origin,
        end_s=end - origin,
        complete=complete,
        estimated=estimated,
    )


def _catch_up_end(
    incident: Incident,
    first_step_at: float,
    points: list[StepPoint],
    history: JobHistory,
    origin: float,
) -> tuple[float, bool] | None:
    """When the job was back at the step it had reached when it failed, and whether
    that is an estimate; None when nothing was lost (no catching up to do)."""
    target = incident.step_at_failure
    if target is None or not incident.steps_lost:
        return None
    after = [
        p
        for p in points
        if p.generation > incident.generation and p.t_s + origin >= first_step_at - 1e-6
    ]
    if after:
        generation = after[0].generation
        line = [p for p in after if p.generation == generation]
        for previous, point in pairwise(line):
            if point.step >= target > previous.step:
                fraction = (target - previous.step) / (point.step - previous.step)
                return origin + previous.t_s + fraction * (point.t_s - previous.t_s), False
        if line[0].step >= target:
            return first_step_at, False
    seconds_per_step = next(
        (
            r.outcome.seconds_per_step
            for r in reversed(history.outcomes)
            if r.outcome.seconds_per_step is not None
        ),
        None,
    )
    if seconds_per_step is None:
        return None
    resumed = incident.resumed_from_step or 0
    return first_step_at + max(0, target - resumed) * seconds_per_step, True


def _summary(
    status: JobStatus, incidents: list[IncidentReport], checkpoints: list[CheckpointMark]
) -> ReportSummary:
    by_class = Counter(i.failure_class for i in incidents)
    by_class.update(status.dropped_by_class)
    totals: dict[str, float] = dict.fromkeys(RECOVERY_PHASES, 0.0)
    for incident in incidents:
        for band in incident.bands:
            totals[band.phase] += band.seconds
    return ReportSummary(
        phase=status.phase.value,
        generation=status.generation,
        step=status.step,
        elapsed_s=status.elapsed_s,
        ettr=status.ettr,
        mttr_s=status.mttr_s,
        steps_lost=status.steps_lost,
        restarts=status.restarts,
        incidents=len(incidents) + status.incidents_dropped,
        incidents_by_class=dict(sorted(by_class.items())),
        incidents_by_action=dict(sorted(Counter(i.action for i in incidents).items())),
        phase_totals_s={phase: round(seconds, 3) for phase, seconds in totals.items()},
        local_checkpoints=len({c.step for c in checkpoints if c.tier == "local"}),
        durable_checkpoints=len({c.step for c in checkpoints if c.tier == "durable"}),
    )


# --- drawing --------------------------------------------------------------------------------


def render_png(data: ReportData, path: Path | None = None) -> bytes:
    """The report's figure as PNG bytes (written to ``path`` too, when given): the step
    against wall time with incidents shaded by phase and checkpoints marked, over a
    bar per incident of its phase breakdown. Raises :class:`ReportDependencyMissing`
    without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        raise ReportDependencyMissing(MATPLOTLIB_MISSING) from None
    matplotlib.use("Agg")
    import io

    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    bar_rows = max(1, len(data.incidents))
    fig, (series_ax, bars_ax) = plt.subplots(
        2,
        1,
        figsize=(11, 5.5 + 0.35 * bar_rows),
        gridspec_kw={"height_ratios": [3.2, 0.8 + 0.3 * bar_rows]},
    )
    try:
        _draw_series(series_ax, data)
        _draw_breakdown(bars_ax, data)
        handles = [
            Patch(color=PHASE_COLOURS[p], alpha=0.35, label=PHASE_LABELS[p])
            for p in RECOVERY_PHASES
        ]
        series_ax.legend(
            handles=[*series_ax.get_legend_handles_labels()[0], *handles],
            loc="upper left",
            fontsize=8,
        )
        fig.suptitle(_title(data), fontsize=11)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110)
    finally:
        plt.close(fig)
    png = buffer.getvalue()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
    return png


def _title(data: ReportData) -> str:
    s = data.summary
    return (
        f"{data.job}: {s.phase}, step {_opt(s.step)}, ETTR {_percent(s.ettr)}, "
        f"MTTR {_seconds(s.mttr_s)}, incidents {s.incidents}, steps lost {s.steps_lost}"
    )


def _draw_series(ax: Any, data: ReportData) -> None:
    for generation, line in sorted(data.generations().items()):
        ax.plot(
            [p.t_s for p in line],
            [p.step for p in line],
            marker=".",
            lw=1.3,
            color="tab:blue",
            label="step (each generation)" if generation == min(data.generations()) else None,
        )
        ax.annotate(
            f"gen {generation}",
            (line[0].t_s, line[0].step),
            fontsize=7,
            color="tab:blue",
            xytext=(2, 4),
            textcoords="offset points",
        )
    for incident in data.incidents:
        for band in incident.bands:
            ax.axvspan(
                band.start_s,
                max(band.end_s, band.start_s + 1e-3),
                color=PHASE_COLOURS[band.phase],
                alpha=0.35 if band.complete else 0.18,
                lw=0,
            )
        ax.axvline(incident.fault_s, color="tab:red", ls="--", lw=0.8)
        ax.annotate(
            f"#{incident.id} {incident.failure_class}",
            (incident.fault_s, 1.0),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            rotation=90,
            va="top",
            ha="right",
        )
    for tier, marker, colour in (("local", "o", "tab:green"), ("durable", "D", "tab:brown")):
        marks = [c for c in data.checkpoints if c.tier == tier]
        if marks:
            ax.scatter(
                [c.t_s for c in marks],
                [c.step for c in marks],
                marker=marker,
                s=28,
                facecolors="none" if tier == "local" else colour,
                edgecolors=colour,
                zorder=3,
                label=f"{tier} checkpoint",
            )
    ax.set_xlim(0, max(data.duration_s, 1.0))
    ax.set_ylabel("step")
    ax.set_xlabel("wall time since start (s)")
    ax.grid(alpha=0.3)


def _draw_breakdown(ax: Any, data: ReportData) -> None:
    if not data.incidents:
        ax.text(0.5, 0.5, "no incidents", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    labels = [f"#{i.id} {i.failure_class}" for i in data.incidents]
    rows = range(len(data.incidents))
    left = [0.0] * len(data.incidents)
    for phase in RECOVERY_PHASES:
        widths = [i.phase_seconds().get(phase, 0.0) for i in data.incidents]
        ax.barh(rows, widths, left=left, color=PHASE_COLOURS[phase], alpha=0.8, height=0.6)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_yticks(list(rows), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per phase, fault to caught up")
    ax.grid(axis="x", alpha=0.3)


def render_html(data: ReportData, png: bytes | None) -> str:
    """A self-contained page: the figure inline (base64) and the tables; no network."""
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Lazarus report: {html.escape(data.job)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:70em}"
        "table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}"
        "th{background:#f3f3f3}img{max-width:100%}</style>",
        "</head><body>",
        f"<h1>Lazarus report: {html.escape(data.job)}</h1>",
    ]
    if png is not None:
        encoded = base64.b64encode(png).decode("ascii")
        parts.append(f'<img alt="step against wall time" src="data:image/png;base64,{encoded}">')
    parts.append("<h2>Summary</h2>")
    parts.append(_html_table(["", ""], summary_rows(data)))
    parts.append("<h2>Incidents</h2>")
    if data.incidents:
        parts.append(_html_table(INCIDENT_COLUMNS, incident_rows(data)))
    else:
        parts.append("<p>No incidents.</p>")
    if data.checkpoints:
        parts.append("<h2>Checkpoints</h2>")
        parts.append(
            _html_table(
                ["step", "tier", "seen at (s)", "how"],
                [[str(c.step), c.tier, f"{c.t_s:.1f}", c.source] for c in data.checkpoints],
            )
        )
    for note in data.notes:
        parts.append(f"<p><em>{html.escape(note)}</em></p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


# --- the tables, shared by the HTML page and the CLI ----------------------------------------

INCIDENT_COLUMNS = [
    "#",
    "class",
    "action",
    "at (s)",
    *(PHASE_LABELS[p] for p in RECOVERY_PHASES),
    "recovery",
    "steps lost",
]


def summary_rows(data: ReportData) -> list[list[str]]:
    s = data.summary
    by_class = ", ".join(f"{k} {v}" for k, v in s.incidents_by_class.items()) or "none"
    by_action = ", ".join(f"{k} {v}" for k, v in s.incidents_by_action.items()) or "none"
    return [
        ["phase", s.phase],
        ["step", _opt(s.step)],
        ["generation", str(s.generation)],
        ["elapsed", _seconds(s.elapsed_s)],
        ["ETTR", _percent(s.ettr)],
        ["MTTR", _seconds(s.mttr_s)],
        ["steps lost", str(s.steps_lost)],
        ["restarts", str(s.restarts)],
        ["incidents", str(s.incidents)],
        ["incidents by class", by_class],
        ["incidents by action", by_action],
        *(
            [f"time {PHASE_LABELS[p]}", _seconds(s.phase_totals_s.get(p, 0.0))]
            for p in RECOVERY_PHASES
        ),
        ["checkpoints seen", f"{s.local_checkpoints} local, {s.durable_checkpoints} durable"],
    ]


def incident_rows(data: ReportData) -> list[list[str]]:
    rows = []
    for incident in data.incidents:
        bands = {band.phase: band for band in incident.bands}
        rows.append(
            [
                str(incident.id),
                incident.failure_class,
                incident.action,
                f"{incident.fault_s:.1f}",
                *(_band_cell(bands.get(p)) for p in RECOVERY_PHASES),
                _seconds(incident.recovery_s),
                _opt(incident.steps_lost),
            ]
        )
    return rows


def _band_cell(band: PhaseBand | None) -> str:
    if band is None:
        return "-"
    text = _seconds(band.seconds)
    if band.estimated:
        text = f"~{text}"
    return text if band.complete else f"{text}+"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f} s" if abs(value) < 10 else f"{value:.1f} s"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _opt(value: object) -> str:
    return "-" if value is None else str(value)
