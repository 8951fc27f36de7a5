"""How the CLI shows jobs: rich tables for people, JSON for scripts.

Kept apart from the command wiring so that the shapes scripts depend on (the
``--json`` outputs) can be tested without a server, and so that ``cli.py`` reads
as what each command does rather than how it is drawn.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from lazarus.app.cli_output import plain
from lazarus.app.client import JobRow as JobRow
from lazarus.app.client import StartPlan, WaitResult
from lazarus.app.client import StatusView as StatusView
from lazarus.app.outcome import Outcome
from lazarus.domain import environment as env_names
from lazarus.domain.api import job_name_from
from lazarus.domain.checkpoint_interval import CheckpointIntervalView, short_duration
from lazarus.domain.contracts import RankStatus
from lazarus.domain.job_view import (
    IgnoredMessage,
    Incident,
    JobStatus,
    NodePool,
    Phase,
    StragglerRecord,
)
from lazarus.domain.spec import JobSpec
from lazarus.domain.transports import transport

PHASE_STYLES: dict[str, str] = {
    Phase.PENDING: "cyan",
    Phase.LAUNCHING: "cyan",
    Phase.RUNNING: "bold green",
    Phase.RECOVERING: "bold yellow",
    Phase.PAUSED: "blue",
    Phase.NEEDS_OPERATOR: "bold white on red",
    Phase.SUCCEEDED: "bold green",
    Phase.FAILED: "bold red",
    Phase.CANCELLED: "dim",
}
_DASH = "—"

NO_PROGRESS_SIGNAL_NOTE = (
    "hang detection needs lazarus.rank heartbeats or health.progress_regex; "
    "without either only crashes are detected"
)
HANG_DETECTION_OFF = "hang detection: off (no progress signal)"


# --- JSON ---------------------------------------------------------------------------------


def incident_json(incident: Incident) -> dict[str, Any]:
    """One incident for scripts: its fields (``timeline`` holds the phase times), plus
    ``phases``: the timeline's :meth:`~RecoveryTimeline.durations` (phase, seconds
    since the previous phase, seconds since the fault), [] when it has none."""
    body = incident.model_dump(mode="json", by_alias=True)
    timeline = incident.timeline
    body["phases"] = (
        [] if timeline is None else [d.model_dump(mode="json") for d in timeline.durations()]
    )
    return body


def incidents_json(incidents: list[Incident]) -> list[dict[str, Any]]:
    return [incident_json(incident) for incident in incidents]


def status_json(view: StatusView) -> dict[str, Any]:
    """The ``status --json`` document. The keys of :class:`JobStatus` are always
    present (null when unknown) so scripts need not special-case a silent worker."""
    if view.status is not None:
        body = view.status.model_dump(mode="json", by_alias=True)
        body["incidents"] = incidents_json(view.status.incidents)
    else:
        body = {
            name: None
            for name in JobStatus.model_fields
            if name not in ("incidents", "ranks", "suggested_actions")
        }
        body.update(
            job_id=job_name_from(view.workflow_id),
            phase=view.phase,
            incidents=[],
            ranks=[],
            suggested_actions=[],
        )
    body["step"] = view.step
    body["workflow_id"] = view.workflow_id
    body["workflow_status"] = view.execution_status
    body["live"] = view.live.model_dump(mode="json") if view.live is not None else None
    body["start_time"] = view.start_time.isoformat() if view.start_time else None
    body["close_time"] = view.close_time.isoformat() if view.close_time else None
    body["note"] = view.note
    return body


def watch_key(view: StatusView) -> tuple[object, ...]:
    """What ``status --watch`` off a terminal prints a line for when it changes: the
    phase, the generation, the step, restarts, incidents, the operator's reason. Not
    the clock-driven fields (elapsed time, ETTR), which would print a line a second."""
    status = view.status
    return (
        view.execution_status,
        view.phase,
        view.step,
        status.generation if status is not None else None,
        status.restarts if status is not None else None,
        len(status.incidents) if status is not None else None,
        status.operator_reason if status is not None else None,
    )


def status_line(view: StatusView) -> str:
    """One ``status --watch`` line for a log file: a UTC time, then ``key=value`` facts
    (``grep``-able, one line per change)."""
    status = view.status
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    parts = [now, f"job={view.job}", f"phase={view.phase or '?'}"]
    if view.execution_status != "RUNNING":
        parts.append(f"workflow={view.execution_status}")
    parts.append(f"step={'-' if view.step is None else view.step}")
    if status is not None:
        parts += [
            f"generation={status.generation}",
            f"restarts={status.restarts}/{status.max_restarts}",
            f"incidents={len(status.incidents) + status.incidents_dropped}",
        ]
        if status.operator_reason:
            parts.append(f"reason={status.operator_reason!r}")
    elif view.note:
        parts.append(f"note={view.note!r}")
    return " ".join(parts)


def wait_json(result: WaitResult) -> dict[str, Any]:
    """``wait --json`` (and ``start --wait --json``'s ``wait``): the outcome, its exit
    code, and where the job stands."""
    view = result.view
    status = view.status
    return {
        "job": result.job,
        "outcome": result.outcome.value,
        "exit_code": result.outcome.exit_code,
        "phase": view.phase,
        "workflow_status": view.execution_status,
        "step": view.step,
        "generation": status.generation if status is not None else None,
        "operator_reason": status.operator_reason if status is not None else None,
        "suggested_actions": status.suggested_actions if status is not None else [],
        "waited_s": round(result.waited_s, 1),
    }


def wait_line(result: WaitResult) -> str:
    """``wait``'s last line: the outcome in words, with what to do about it."""
    view = result.view
    status = view.status
    step = "" if view.step is None else f" at step {view.step}"
    if result.outcome == Outcome.TIMEOUT:
        return (
            f"job '{result.job}' is still {view.phase or 'running'}{step} after "
            f"{result.waited_s:.0f} s; stopped waiting (the job goes on)"
        )
    line = f"job '{result.job}' {result.outcome.value}{step}"
    if status is not None and status.operator_reason:
        line += f": {status.operator_reason}"
    if result.outcome == Outcome.NEEDS_OPERATOR:
        line += f"; see 'lazarus status {result.job}'"
    return line


def job_list_json(rows: list[JobRow]) -> list[dict[str, Any]]:
    return [
        {
            "job": row.job,
            "workflow_id": row.workflow_id,
            "phase": row.phase,
            "step": row.step,
            "workflow_status": row.execution_status,
            "start_time": row.start_time.isoformat() if row.start_time else None,
            "close_time": row.close_time.isoformat() if row.close_time else None,
        }
        for row in rows
    ]


# --- dry run ------------------------------------------------------------------------------


def dry_run_json(plan: StartPlan) -> dict[str, Any]:
    return {
        "workflow_id": plan.workflow_id,
        "task_queue": plan.task_queue,
        "world_size": len(plan.ranks),
        "spec": plan.spec.model_dump(mode="json"),
        "nodes": [node.model_dump(mode="json") for node in plan.nodes],
        "master_addr": plan.ranks[0].get(env_names.MASTER_ADDR) if plan.ranks else None,
        "submit": plan.submit,
        "ranks": plan.ranks,
    }


def render_dry_run(plan: StartPlan) -> RenderableType:
    spec = plan.spec
    facts = Table.grid(padding=(0, 2))
    facts.add_row("job", plain(spec.name))
    facts.add_row("workflow id", plain(plan.workflow_id))
    facts.add_row("task queue", plain(plan.task_queue))
    nodes = len(plan.nodes) or len(spec.nodes)
    facts.add_row(
        "world size", f"{nodes * spec.nproc_per_node} ({nodes} node x {spec.nproc_per_node} proc)"
    )
    if plan.ranks:
        facts.add_row("MASTER_ADDR", plain(plan.ranks[0].get(env_names.MASTER_ADDR, "")))
    if plan.submit is not None:
        facts.add_row("submits first", plain(" ".join(plan.submit)))
    facts.add_row("command", plain(" ".join(spec.command)))
    facts.add_row("workdir", plain(spec.workdir))
    facts.add_row("checkpoints", plain(spec.checkpoint_dir))
    facts.add_row("run dir", plain(spec.run_dir))
    facts.add_row(
        "restarts",
        f"at most {spec.recovery.max_restarts} per {spec.recovery.restart_window_s:g}s",
    )
    facts.add_row(
        "health",
        f"hang after {spec.health.hang_timeout_s:g}s without progress, "
        f"startup grace {spec.health.startup_timeout_s:g}s",
    )

    varying = [
        env_names.RANK,
        env_names.LOCAL_RANK,
        env_names.GROUP_RANK,
        env_names.WORLD_SIZE,
        env_names.LOCAL_WORLD_SIZE,
    ]
    ranks = Table(title="per-rank environment", title_justify="left")
    for name in varying:
        ranks.add_column(name, justify="right")
    for env in plan.ranks:
        ranks.add_row(*(plain(env[name]) for name in varying))
    shared = Table(
        title="shared by every rank, as the launcher sets it for the first generation "
        "(<...>: known only at launch)",
        title_justify="left",
        show_header=False,
    )
    shared.add_column("variable", style="bold")
    shared.add_column("value", overflow="fold")
    for name, value in plan.ranks[0].items():
        if name in varying:
            continue
        differs = any(env.get(name) != value for env in plan.ranks[1:])
        shared.add_row(
            plain(name), plain(f"{value}  (rank 0's; differs per rank)" if differs else value)
        )
    parts: list[RenderableType] = [
        Panel(facts, title="dry run: nothing was started", border_style="cyan"),
        node_table(plan),
        ranks,
        shared,
    ]
    local = any(transport(node.launcher).runs_here for node in plan.nodes)
    if spec.env_from_file is not None:
        parts.append(
            Text(
                f"plus the KEY=VALUE lines of {spec.env_from_file}, read where each rank runs "
                "(not shown: secrets)"
                + ("; local ranks also inherit the worker's environment" if local else ""),
                style="dim",
            )
        )
    elif local:
        parts.append(Text("local ranks also inherit the worker's environment", style="dim"))
    return Group(*parts)


def node_table(plan: StartPlan) -> RenderableType:
    """Each node: where it is, how it is reached, its interpreter, ranks and what it runs."""
    table = Table(title="nodes of the first generation", title_justify="left")
    for column in ("node", "launcher", "address", "login", "python", "ranks"):
        table.add_column(column)
    table.add_column("runs", overflow="fold")
    for node in plan.nodes:
        table.add_row(
            plain(node.name),
            node.launcher,
            plain(node.address),
            plain(node.login or "-"),
            plain(node.python or "-"),
            ",".join(str(r) for r in node.ranks),
            plain(" ".join(node.runs)),
        )
    return table


# --- status -------------------------------------------------------------------------------


def phase_text(phase: str | None) -> Text:
    if phase is None:
        return Text("unknown", style="dim")
    return Text(phase, style=PHASE_STYLES.get(phase, ""))


def render_status(view: StatusView, now: float | None = None) -> RenderableType:
    parts: list[RenderableType] = [_header(view)]
    status = view.status
    if status is not None and status.phase == Phase.NEEDS_OPERATOR:
        parts.append(_operator_panel(status))
    if status is not None and status.ranks:
        parts.append(ranks_table(status.ranks, now if now is not None else time.time()))
    if status is not None and (
        status.nodes.spares or status.nodes.quarantined or len(status.nodes.active) > 1
    ):
        parts.append(nodes_table(status.nodes))
    if status is not None and status.stragglers:
        parts.append(stragglers_table(status.stragglers))
    if status is not None and status.incidents:
        parts.append(incidents_table(status.incidents))
        breakdown = last_recovery_line(status.incidents)
        if breakdown is not None:
            parts.append(breakdown)
    if status is not None and status.incidents_dropped:
        counts = ", ".join(f"{n} {c}" for c, n in sorted(status.dropped_by_class.items()))
        parts.append(
            Text(f"{status.incidents_dropped} older incidents not listed: {counts}", style="dim")
        )
    if status is not None and status.ignored_messages:
        parts.append(ignored_table(status.ignored_messages))
    if status is not None and status.checkpoint_interval is not None:
        parts.append(checkpoint_interval_table(status.checkpoint_interval))
    if progress_signal(view) == "none":
        parts.append(Text(HANG_DETECTION_OFF, style="yellow"))
    if view.note:
        parts.append(Text(view.note, style="yellow"))
    return Group(*parts)


def progress_signal(view: StatusView) -> str | None:
    """What tells the supervisor the job progresses (heartbeat, log, none): the
    workflow's record, else the live supervisor's, when it is of this generation."""
    if view.status is not None and view.status.progress_signal is not None:
        return view.status.progress_signal
    live = view.live
    if live is None or (view.status is not None and live.generation < view.status.generation):
        return None
    return live.progress_signal


def hang_budget_text(view: StatusView) -> str | None:
    """The live supervisor's hang budget (issue 38), and the ranks in a slow phase:
    ``1.00 s learned (p99 0.2 s, longest 0.31 s, 240 intervals); rank 0 in
    checkpoint_save``. None without a live view of this generation, or with hang
    detection off. Phase names come from the ranks' heartbeats: printed as they are."""
    live = view.live
    if live is None or live.hang_budget is None or live.progress_signal == "none":
        return None
    if view.status is not None and live.generation < view.status.generation:
        return None
    text = live.hang_budget.describe()
    phases = [f"rank {rank} in {name}" for rank, name in sorted(live.slow_phases.items())[:4]]
    if len(live.slow_phases) > 4:
        phases.append(f"{len(live.slow_phases) - 4} more")
    return "; ".join([text, *phases])


def start_notes(spec: JobSpec) -> list[str]:
    """What ``start`` should tell the operator about how the job will be watched.
    Heartbeats cannot be known before the ranks run, so a spec without
    ``progress_regex`` always gets the note."""
    return [] if spec.health.progress_regex else [f"note: {NO_PROGRESS_SIGNAL_NOTE}"]


def _header(view: StatusView) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_column(style="bold")
    grid.add_column()
    status = view.status
    workflow = Text(
        view.execution_status, style="" if view.execution_status == "RUNNING" else "dim"
    )
    grid.add_row("phase", phase_text(view.phase), "workflow", workflow)
    if status is None:
        grid.add_row("step", _opt(view.step), "", "")
    else:
        grid.add_row("generation", str(status.generation), "step", _step_text(view))
        grid.add_row(
            "world size",
            str(status.world_size),
            "restarts",
            f"{status.restarts}/{status.max_restarts}",
        )
        grid.add_row("ETTR", _percent(status.ettr), "elapsed", format_duration(status.elapsed_s))
        if status.incidents:
            mttr = _DASH if status.mttr_s is None else f"{status.mttr_s:.1f}s"
            grid.add_row("MTTR", mttr, "steps lost", str(status.steps_lost))
        if status.resume_step is not None or status.runs > 1:
            grid.add_row("resumed from", _opt(status.resume_step), "runs", str(status.runs))
        if status.slurm_job_id is not None:
            grid.add_row("Slurm job", str(status.slurm_job_id), "", "")
    if view.live is not None and view.live.seconds_per_step:
        grid.add_row(
            "alive", f"{view.live.alive}/{view.live.world_size}",
            "s/step", f"{view.live.seconds_per_step:.3g}",
        )  # fmt: skip
    budget = hang_budget_text(view)
    if budget is not None:
        grid.add_row("hang budget", plain(budget), "", "")
    title = status.job_id if status is not None else job_name_from(view.workflow_id)
    return Panel(
        grid, title=plain(title, style="bold"), subtitle=plain(view.workflow_id), expand=False
    )


def _step_text(view: StatusView) -> Text:
    text = Text(_opt(view.step))
    recorded = view.status.step if view.status is not None else None
    if view.step is not None and view.step != recorded:
        text.append("  (live)", style="dim")
    return text


def _operator_panel(status: JobStatus) -> Panel:
    body = Text()
    body.append(status.operator_reason or "the job stopped restarting itself", style="bold")
    if status.suggested_actions:
        body.append("\n\nwhat you can do:")
        for action in status.suggested_actions:
            body.append(f"\n  • {action}")
    return Panel(body, title="needs an operator", border_style="red", expand=False)


def ranks_table(ranks: list[RankStatus], now: float) -> Table:
    table = Table(title="ranks", title_justify="left")
    for column in ("rank", "pid", "state", "step", "last progress"):
        table.add_column(column, justify="right" if column != "state" else "left")
    for rank in ranks:
        table.add_row(
            str(rank.rank),
            str(rank.pid),
            _rank_state(rank),
            _opt(rank.step),
            _ago(rank.last_progress_at, now),
        )
    return table


def _rank_state(rank: RankStatus) -> Text:
    if rank.stopped_by_signal:
        return Text("stopped (SIGSTOP)", style="yellow")
    if rank.alive:
        return Text("alive", style="green")
    if rank.signal:
        return Text(f"killed by {rank.signal}", style="red")
    if rank.exit_code is not None:
        return Text(f"exited {rank.exit_code}", style="green" if rank.exit_code == 0 else "red")
    return Text("gone", style="red")


def nodes_table(pool: NodePool) -> Table:
    """Where the job runs, what is held back, and what was taken out of service and why."""
    table = Table(title="nodes", title_justify="left")
    table.add_column("node")
    table.add_column("state")
    table.add_column("detail")
    for index, node in enumerate(pool.active):
        table.add_row(plain(node), Text("active", style="green"), "master" if index == 0 else "")
    for node in pool.spares:
        table.add_row(plain(node), Text("spare", style="cyan"), "")
    for quarantined in pool.quarantined:
        fenced = "fenced" if quarantined.fenced else "not yet fenced"
        ago = format_duration(time.time() - quarantined.at)
        table.add_row(
            plain(quarantined.node),
            Text("quarantined", style="red"),
            plain(f"{quarantined.reason} ({fenced}, {ago} ago)"),
        )
    return table


def incidents_table(incidents: list[Incident]) -> RenderableType:
    return _IncidentsTable(incidents)


class _IncidentsTable:
    """Picks its layout from the width it is given: a reason squeezed into a narrow
    column folds into a tower of fragments, so narrow terminals get it below instead."""

    WIDE = 120

    def __init__(self, incidents: list[Incident]) -> None:
        self.incidents = incidents

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        wide = options.max_width >= self.WIDE
        yield _incident_columns(self.incidents, with_reason=wide)
        if not wide:
            for incident in self.incidents:
                line = Text(f"  #{incident.id} ", style="bold")
                line.append(f"{_action(incident)}: " if incident.action else "", style="dim")
                line.append(incident.reason or _DASH)
                if incident.escalation_hook:
                    line.append(f" (on_escalation: {incident.escalation_hook})", style="dim")
                yield line


def _incident_columns(incidents: list[Incident], with_reason: bool) -> Table:
    table = Table(title="incidents", title_justify="left")
    columns = [
        ("id", "right"), ("class", "left"), ("kind", "left"), ("rank", "right"),
        ("node", "left"), ("detection\ns", "right"), ("recovery\ns", "right"),
        ("steps\nlost", "right"),
    ]  # fmt: skip
    if with_reason:
        columns += [("action", "left"), ("reason", "left")]
    for name, justify in columns:
        # Numbers stay whole; words fold rather than vanish behind an ellipsis.
        numeric = justify == "right"
        table.add_column(
            name,
            justify=justify,  # type: ignore[arg-type]
            no_wrap=numeric,
            overflow="ellipsis" if numeric else "fold",
        )
    for incident in incidents:
        cells: list[str | Text] = [
            str(incident.id),
            plain(incident.failure_class),
            plain(incident.kind),
            _opt(incident.rank),
            plain(_opt(incident.node)),
            f"{incident.detection_s:.2f}",
            _DASH if incident.recovery_s is None else f"{incident.recovery_s:.2f}",
            _opt(incident.steps_lost),
        ]
        if with_reason:
            hook = (
                f" (on_escalation: {incident.escalation_hook})" if incident.escalation_hook else ""
            )
            cells += [plain(_action(incident)), plain(incident.reason + hook)]
        table.add_row(*cells)
    return table


def _action(incident: Incident) -> str:
    """The decision, and for jobs with ``rejoin`` how the ranks restarted:
    ``restart (rejoin)`` or ``restart (whole generation)``."""
    if not incident.restart_path:
        return str(incident.action)
    return f"{incident.action} ({incident.restart_path.replace('_', ' ')})"


PHASE_TABLES_SHOWN = 3
"""``incidents`` draws the phase tables of this many latest recoveries (--json has all)."""


def render_incidents(incidents: list[Incident]) -> RenderableType:
    """What ``lazarus incidents JOB`` prints: the incidents, then where the latest
    recoveries' time went, phase by phase."""
    timed = [i for i in incidents if i.timeline is not None]
    parts: list[RenderableType] = [incidents_table(incidents)]
    parts += [phase_table(i) for i in timed[-PHASE_TABLES_SHOWN:]]
    if len(timed) > PHASE_TABLES_SHOWN:
        parts.append(
            Text(
                f"{len(timed) - PHASE_TABLES_SHOWN} older recoveries' phases: see --json",
                style="dim",
            )
        )
    return Group(*parts)


def phase_table(incident: Incident) -> Table:
    """One recovery's phases: the seconds each took and the time since the fault. A
    phase not reached (a script without the rank helper, a recovery under way) is
    not listed."""
    table = Table(title=f"incident #{incident.id}: recovery phases", title_justify="left")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    table.add_column("since fault", justify="right")
    timeline = incident.timeline
    for phase in [] if timeline is None else timeline.durations():
        table.add_row(plain(phase.phase), f"{phase.seconds:.2f}", f"{phase.since_fault_s:.2f}")
    return table


SHORT_PHASES: dict[str, str] = {
    "survivors torn down": "teardown",
    "detected": "detect",
    "decision": "decide",
    "survivors stopped": "stop",
    "resume point chosen": "resume",
    "launch requested": "launch",
    "rank process started": "start",
    "rejoin request read": "rejoin",
    "framework imported": "import",
    "process group initialised": "pg",
    "checkpoint loaded": "load",
    "first new step": "step",
}
"""The phase labels of :data:`~lazarus.domain.recovery_timeline.PHASES`, shortened
for the one line ``status`` gives them."""


def last_recovery_line(incidents: list[Incident]) -> Text | None:
    """The latest recovery's breakdown on one line, for ``status``: how long it took
    so far, then the seconds each reached phase took (``incidents`` has the table)."""
    latest = next((i for i in reversed(incidents) if i.timeline is not None), None)
    if latest is None or latest.timeline is None:
        return None
    phases = latest.timeline.durations()
    if not phases:
        return None
    line = Text(f"last recovery #{latest.id}: ", style="bold")
    line.append(f"{phases[-1].since_fault_s:.2f}s to {phases[-1].phase}", style="bold")
    line.append(" = ")
    line.append(", ".join(f"{SHORT_PHASES.get(p.phase, p.phase)} {p.seconds:.2f}" for p in phases))
    return line


def ignored_table(messages: list[IgnoredMessage]) -> Table:
    """Operator messages the job did not act on, and why (they have no later effect)."""
    table = Table(title="Ignored operator messages", title_justify="left")
    table.add_column("message")
    table.add_column("phase")
    table.add_column("why")
    for message in messages[-5:]:
        table.add_row(plain(message.name), message.phase.value, plain(message.reason))
    return table


def checkpoint_interval_table(view: CheckpointIntervalView) -> Table:
    """``checkpoints.interval: auto``: what the Young-Daly interval is made of."""
    table = Table(
        title="Checkpoint interval (auto, Young-Daly)",
        title_justify="left",
        caption=plain(
            f"M: {view.node_mtbf_h:.0f} h per node over {view.nodes} nodes "
            f"({view.mtbf_source}); {view.reason or 'no interval sent yet'}"
        ),
        caption_justify="left",
    )
    for column in ("δ save", "s/step", "M", "τ", "interval", "expected loss", "sent"):
        table.add_column(column, justify="right")
    sent = _DASH if view.sent_generation is None else f"{view.changes}x, gen {view.sent_generation}"
    table.add_row(
        _DASH if view.checkpoint_save_s is None else f"{view.checkpoint_save_s:.2f}s",
        _DASH if view.seconds_per_step is None else f"{view.seconds_per_step:.3g}",
        short_duration(view.job_mtbf_s),
        _DASH if view.optimum_s is None else short_duration(view.optimum_s),
        _DASH if view.every_steps is None else f"{view.every_steps} steps",
        _percent(view.expected_loss),
        sent,
    )
    return table


def stragglers_table(stragglers: list[StragglerRecord]) -> Table:
    """Slow nodes found, swapped or not: a recorded straggler still costs throughput."""
    table = Table(title="stragglers", title_justify="left")
    for name, justify in (
        ("gen", "right"), ("node", "left"), ("rank", "right"), ("slowdown", "right"),
        ("compute\nms/step", "right"), ("peers\nms/step", "right"),
        ("detection\ns", "right"), ("action", "left"), ("reason", "left"),
    ):  # fmt: skip
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for s in stragglers:
        table.add_row(
            str(s.generation),
            plain(s.node),
            str(s.rank),
            f"{s.slowdown:.2f}x",
            f"{s.compute_s * 1000:.1f}",
            f"{s.peers_compute_s * 1000:.1f}",
            f"{s.detection_s:.1f}",
            plain(s.action),
            plain(s.reason),
        )
    return table


def render_job_list(rows: list[JobRow]) -> RenderableType:
    if not rows:
        return Text("no jobs yet; start one with 'lazarus start JOB.yaml'", style="dim")
    table = Table()
    for column in ("job", "phase", "step", "workflow", "started"):
        table.add_column(column, justify="right" if column == "step" else "left")
    for row in rows:
        table.add_row(
            plain(row.job),
            phase_text(row.phase),
            _opt(row.step),
            row.execution_status,
            row.start_time.astimezone().strftime("%Y-%m-%d %H:%M:%S") if row.start_time else "",
        )
    return table


# --- small formatters ---------------------------------------------------------------------


def format_duration(seconds: float) -> str:
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _percent(ratio: float | None) -> str:
    return _DASH if ratio is None else f"{ratio * 100:.1f}%"


def _opt(value: object) -> str:
    return _DASH if value is None else str(value)


def _ago(timestamp: float | None, now: float) -> str:
    if timestamp is None:
        return _DASH
    return f"{max(0.0, now - timestamp):.1f}s ago"
