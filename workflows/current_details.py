"""What the Temporal Web UI shows about a job, without anyone opening a payload.

Three things, all pure (unit-tested in ``tests/unit/test_current_details.py``):

- :func:`current_details`: the markdown the workflow hands to
  ``workflow.set_current_details``. The UI's workflow page shows it live (it reads it
  through the built-in ``__temporal_workflow_metadata`` query, so setting it adds no
  history event): the phase, generation, step and ETTR, the open incident and the
  decision taken about it, and what the job waits for now.
- :func:`start_summary` and :func:`start_details`: the static summary and details a
  job starts with (its name, world size and nodes), shown at the top of the page and
  in the workflow list.
- :func:`failure_class_attribute`: the ``LazarusFailureClass`` search attribute, the
  class of the newest incident, so the list can be filtered by what went wrong.

The text is built from the durable state and the workflow clock only, so a replay
renders the same; it names nodes and classes, never commands or environments.
"""

from __future__ import annotations

from lazarus.domain.spec import JobSpec
from workflows.accounting import effective_training_time_ratio
from workflows.playbook import SUGGESTED_OPERATOR_ACTIONS
from workflows.state import Incident, JobState, Phase

REASON_LIMIT = 200
"""Characters of a decision's reason or an operator reason shown: the page stays a
glance; ``lazarus status`` has the whole text."""


def current_details(spec: JobSpec, state: JobState, now: float) -> str:
    """The job at ``now`` (workflow time) as a few lines of markdown."""
    lines = [_headline(spec, state, now), ""]
    incident = state.current_incident
    if incident is not None:
        lines += [_incident_line("Open incident", incident), _decision_line(incident), ""]
    elif state.incidents:
        last = state.incidents[-1]
        recovered = f", recovered in {last.recovery_s:.1f} s" if last.recovery_s else ""
        lines += [f"Last incident: {_incident_summary(last)}{recovered}", ""]
    lines.append(f"**Waiting for:** {waiting_for(spec, state)}")
    return "\n".join(lines)


def waiting_for(spec: JobSpec, state: JobState) -> str:
    """What has to happen next for the job to move, in the words an operator acts on."""
    phase = state.phase
    nodes = ", ".join(state.pool.active) or "no node"
    if phase == Phase.PENDING:
        if spec.slurm is not None and spec.slurm.submits:
            return (
                f"Slurm to run the job's allocation ({_submitted_nodes(spec)}); the "
                "`submit_allocation` activity's details show its place in the queue"
            )
        return f"the first launch on {nodes}"
    if phase == Phase.LAUNCHING:
        origin = f"step {state.resume.step}" if state.resume else "scratch"
        return f"generation {state.generation + 1} to launch on {nodes} from {origin}"
    if phase == Phase.RUNNING:
        if state.current_incident is not None:
            return f"the first step of generation {state.generation} (the recovery ends there)"
        return (
            f"the supervisor of generation {state.generation} ({nodes}): it reports a "
            f"failure, a straggler, the end, or progress every "
            f"{spec.health.report_interval_s:.0f} s"
        )
    if phase == Phase.RECOVERING:
        return f"the ranks of generation {state.generation} to stop, then a relaunch"
    if phase in (Phase.PAUSED, Phase.NEEDS_OPERATOR):
        actions = ", ".join(f"`lazarus {action}`" for action in SUGGESTED_OPERATOR_ACTIONS)
        reason = f" ({_clip(state.operator_reason)})" if state.operator_reason else ""
        return f"an operator{reason}: {actions}"
    return f"nothing: the job ended ({phase.value})"


def start_summary(spec: JobSpec) -> str:
    """One line for the workflow list: which job, how big."""
    return f"Lazarus job {spec.name}: {_world_size(spec)} ranks on {_node_count(spec)} node(s)"


def start_details(spec: JobSpec) -> str:
    """The shape the job starts with, as markdown (nodes and launchers, no commands)."""
    nodes = ", ".join(f"`{node.name}` ({node.launcher})" for node in spec.nodes)
    if spec.slurm is not None and spec.slurm.submits:
        nodes = f"{_submitted_nodes(spec)}, from the allocation its first step submits"
    lines = [
        f"**Job** `{spec.name}`",
        f"**World size** {_world_size(spec)} ({_node_count(spec)} node(s) x "
        f"{spec.nproc_per_node} rank(s))",
        f"**Nodes** {nodes}",
    ]
    if spec.spares:
        lines.append(f"**Spares** {', '.join(f'`{node.name}`' for node in spec.spares)}")
    if spec.fleet is not None:
        lines.append(f"**Fleet** `{spec.fleet.name}`")
    return "\n\n".join(lines)


def failure_class_attribute(state: JobState) -> str | None:
    """``LazarusFailureClass``: the newest incident's class; None before the first."""
    return state.incidents[-1].failure_class.value if state.incidents else None


def _headline(spec: JobSpec, state: JobState, now: float) -> str:
    end = state.finished_at if state.finished_at is not None else now
    ettr = effective_training_time_ratio(state, end)
    parts = [
        f"**{state.phase.value}**",
        f"generation {state.generation}",
        f"step {state.step if state.step is not None else '-'}",
        f"ETTR {ettr:.1%}" if ettr is not None else "ETTR -",
        f"restarts {state.restarts} of {spec.recovery.max_restarts}",
    ]
    return " · ".join(parts)


def _incident_summary(incident: Incident) -> str:
    where = []
    if incident.rank is not None:
        where.append(f"rank {incident.rank}")
    if incident.node is not None:
        where.append(f"on `{incident.node}`")
    if incident.signal:
        where.append(f"({incident.signal})")
    elif incident.exit_code is not None:
        where.append(f"(exit {incident.exit_code})")
    if incident.step_at_failure is not None:
        where.append(f"at step {incident.step_at_failure}")
    place = f": {' '.join(where)}," if where else ","
    return (
        f"#{incident.id} {incident.kind} (class `{incident.failure_class.value}`){place} "
        f"generation {incident.generation}"
    )


def _incident_line(label: str, incident: Incident) -> str:
    return f"**{label}** {_incident_summary(incident)}"


def _decision_line(incident: Incident) -> str:
    if not incident.action:
        return "**Decision** not taken yet"
    why = f": {_clip(incident.reason)}" if incident.reason else ""
    path = {"rejoin": ", survivors rejoin in place", "whole_generation": ", whole generation"}
    how = path.get(incident.restart_path or "", "")
    return f"**Decision** `{incident.action}`{how}{why}"


def _world_size(spec: JobSpec) -> int:
    return _node_count(spec) * spec.nproc_per_node


def _node_count(spec: JobSpec) -> int:
    """The nodes that train: in submit mode, ``slurm.nodes`` (the spec lists none yet)."""
    if spec.slurm is not None and spec.slurm.submits and spec.slurm.nodes is not None:
        return spec.slurm.nodes
    return len(spec.nodes)


def _submitted_nodes(spec: JobSpec) -> str:
    assert spec.slurm is not None
    spares = f" + {spec.slurm.spares} spare(s)" if spec.slurm.spares else ""
    return f"{spec.slurm.nodes} Slurm node(s){spares}"


def _clip(text: str | None) -> str:
    text = (text or "").replace("\n", " ").strip()
    return text if len(text) <= REASON_LIMIT else text[: REASON_LIMIT - 1] + "…"
