"""``checkpoints.interval: auto``: the disk checkpoint interval by Young and Daly.

Pure policy, decided in the workflow and unit-tested without a server. Each supervision
report that finds the generation training (``progress``, ``first_step``) brings what
the ranks measured: δ, the blocking seconds of a save (``checkpoint_save_s``), and the
seconds per step. With M, the job's MTBF (a per-node figure from the spec's prior, a
fleet's observed rate, and this job's own interruptions, over its node count), Daly's
optimum τ follows (:mod:`lazarus.domain.checkpoint_interval`), in steps.

The workflow sends the interval to the ranks (``set_checkpoint_interval``) only when it
matters, so history grows with changes, never with steps or reports:

* the first time it is known in a generation (a launch writes the spec's interval into
  the new generation's control file, so each generation is told once);
* when τ in steps moves by more than :data:`RETUNE_THRESHOLD` from the interval in force.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lazarus.domain.checkpoint_interval import (
    LLAMA3_NODE_MTBF_H,
    CheckpointIntervalView,
    daly_interval_s,
    expected_goodput_loss,
    interval_steps,
    job_mtbf_s,
    node_mtbf_h,
    short_duration,
)
from lazarus.domain.contracts import NodeAccess, SetCheckpointIntervalRequest, SuperviseOutcome
from lazarus.domain.spec import JobSpec
from workflows.accounting import mean_time_to_recover
from workflows.placement import active_nodes, generation_dir
from workflows.state import JobState

RETUNE_THRESHOLD = 0.2
"""A new interval is sent when τ in steps differs from the one in force by more than
this fraction: measurements jitter, and near the optimum the goodput curve is flat
(a 20% longer or shorter interval costs well under a percent), so chasing every
wobble would only grow the history."""
TUNED_OUTCOMES = frozenset({"progress", "first_step"})
"""Supervision outcomes after which the generation is known to be training."""
INTERRUPTIONS = frozenset({"crash", "hang", "vanished", "node_lost"})
"""Incident kinds that cost redone work: what the MTBF counts (Llama 3's rate counts
every unexpected interruption, software ones included). Preemptions (saved just in
time), operator moves, straggler swaps and checkpoint findings do not."""
PLANNED_CLASSES = frozenset({"operator", "straggler", "preempted"})
"""Classes of dropped incidents (only counted by class) that are not interruptions."""
MAX_EVERY_STEPS = 100_000_000
"""The largest interval sent (``checkpoints.every_steps``'s own bound)."""


@dataclass(frozen=True)
class IntervalChange:
    """An interval to send now, and why."""

    every_steps: int
    reason: str


def usable_seconds_per_step(seconds: float | None) -> float | None:
    """The measured step time, or None when it cannot be divided by: zero, negative
    or not finite. The supervisor measures it from the ranks' wall clocks, and a clock
    stepped backwards once gave a negative rate, on which ``interval_steps`` raised in
    workflow code and the workflow task failed on every retry. An unusable rate means
    "not measured yet": no interval is sent until a good one arrives."""
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        return None
    return seconds


def interruptions(state: JobState) -> int:
    """This job's interruptions so far, the dropped incidents' tail included."""
    kept = sum(1 for incident in state.incidents if incident.kind in INTERRUPTIONS)
    dropped = sum(n for cls, n in state.dropped_by_class.items() if cls not in PLANNED_CLASSES)
    return kept + dropped


def node_hours(state: JobState, now: float) -> float:
    """This job's exposure: its node count times the time since it started."""
    return max(1, len(state.pool.active)) * max(0.0, now - state.started_at) / 3600.0


def estimate(
    spec: JobSpec,
    state: JobState,
    now: float,
    *,
    checkpoint_save_s: float | None = None,
    fleet_failures_per_node_hour: float | None = None,
) -> CheckpointIntervalView:
    """The view with M and τ brought up to date from the state (and a new δ, if one
    was measured). ``fleet_failures_per_node_hour`` is the hook for a fleet: its
    observed per-node failure rate across jobs, when the job belongs to one; it
    replaces the spec's prior."""
    previous = state.checkpoint_interval or CheckpointIntervalView()
    prior_h = spec.checkpoints.mtbf_prior_h or LLAMA3_NODE_MTBF_H
    nodes = max(1, len(state.pool.active))
    failures = interruptions(state)
    hours = node_hours(state, now)
    per_node_h = node_mtbf_h(
        prior_h,
        failures=failures,
        node_hours=hours,
        fleet_failures_per_node_hour=fleet_failures_per_node_hour,
    )
    fleet = fleet_failures_per_node_hour is not None and fleet_failures_per_node_hour > 0
    source = "fleet rate" if fleet else f"prior {prior_h:.0f} h"
    source += f" + this job: {failures} interruptions in {hours:.1f} node-hours"
    mtbf_s = job_mtbf_s(per_node_h, nodes)
    delta = checkpoint_save_s if checkpoint_save_s is not None else previous.checkpoint_save_s
    if delta is not None and delta <= 0:
        delta = None  # a save that blocked for nothing measurable says nothing yet
    per_step = usable_seconds_per_step(state.seconds_per_step)
    optimum = daly_interval_s(delta, mtbf_s) if delta is not None else None
    view = previous.model_copy(
        update={
            "checkpoint_save_s": delta,
            "seconds_per_step": per_step,
            "nodes": nodes,
            "node_mtbf_h": per_node_h,
            "mtbf_source": source,
            "job_mtbf_s": mtbf_s,
            "optimum_s": optimum,
        }
    )
    return view.model_copy(update={"expected_loss": _expected_loss(view, state)})


def _expected_loss(view: CheckpointIntervalView, state: JobState) -> float | None:
    """Goodput lost at the interval in force (at τ before one was sent); restarts cost
    this job's MTTR, once it has one."""
    delta = view.checkpoint_save_s
    if delta is None or view.optimum_s is None:
        return None
    interval = view.optimum_s
    per_step = usable_seconds_per_step(view.seconds_per_step)
    if view.every_steps is not None and per_step is not None:
        interval = view.every_steps * per_step
    if interval <= 0:
        return None
    restart_s = mean_time_to_recover(state) or 0.0
    return expected_goodput_loss(interval, delta, view.job_mtbf_s, restart_s)


def retune(
    spec: JobSpec,
    state: JobState,
    outcome: SuperviseOutcome,
    now: float,
    *,
    fleet_failures_per_node_hour: float | None = None,
) -> IntervalChange | None:
    """Record what ``outcome`` measured in ``state.checkpoint_interval``; the interval
    to send, or None (nothing known yet, or the one in force is close enough)."""
    view = estimate(
        spec,
        state,
        now,
        checkpoint_save_s=outcome.checkpoint_save_s,
        fleet_failures_per_node_hour=fleet_failures_per_node_hour,
    )
    state.checkpoint_interval = view
    per_step = usable_seconds_per_step(view.seconds_per_step)
    if view.optimum_s is None or per_step is None:
        return None
    steps = min(MAX_EVERY_STEPS, interval_steps(view.optimum_s, per_step))
    in_force = view.every_steps if view.sent_generation == state.generation else None
    if in_force is None:
        return IntervalChange(steps, f"generation {state.generation}: first tuned interval")
    if abs(steps - in_force) <= RETUNE_THRESHOLD * in_force:
        return None
    return IntervalChange(
        steps,
        f"tau moved from {in_force} to {steps} steps (more than {RETUNE_THRESHOLD:.0%})",
    )


def interval_request(
    spec: JobSpec, state: JobState, change: IntervalChange
) -> SetCheckpointIntervalRequest:
    return SetCheckpointIntervalRequest(
        job_id=spec.job_id,
        run_dir=generation_dir(spec, state),
        access=NodeAccess.of(spec, active_nodes(spec, state.pool)),
        checkpoint_every_steps=change.every_steps,
        memory_every_steps=spec.checkpoints.memory_every_steps,
    )


def record_sent(state: JobState, change: IntervalChange, now: float) -> CheckpointIntervalView:
    """The interval reached the ranks: it is the one in force in this generation."""
    view = state.checkpoint_interval or CheckpointIntervalView()
    view = view.model_copy(
        update={
            "every_steps": change.every_steps,
            "sent_generation": state.generation,
            "changes": view.changes + 1,
            "changed_at": now,
            "reason": change.reason,
        }
    )
    view = view.model_copy(update={"expected_loss": _expected_loss(view, state)})
    state.checkpoint_interval = view
    return view


def interval_in_force(spec: JobSpec, state: JobState) -> int | None:
    """The disk interval the current generation's control file holds: the tuned one
    once sent to it, else the spec's. A just-in-time request rewrites the file and
    must carry it."""
    view = state.checkpoint_interval
    if view is not None and view.sent_generation == state.generation:
        return view.every_steps
    return spec.checkpoints.every_steps


def status_view(spec: JobSpec, state: JobState, now: float) -> CheckpointIntervalView | None:
    """What ``status`` shows: None for a fixed interval; under ``auto``, M from the
    prior even before anything was measured."""
    if spec.checkpoints.interval != "auto":
        return None
    return state.checkpoint_interval or estimate(spec, state, now)


def describe(view: CheckpointIntervalView | None, change: IntervalChange) -> str:
    """One line for the activity summary and the workflow log (the expected loss once
    ``view`` holds the change as sent)."""
    parts = [f"checkpoint every {change.every_steps} steps"]
    if view is None:
        return f"{parts[0]}: {change.reason}"
    if view.optimum_s is not None:
        parts.append(f"tau {short_duration(view.optimum_s)}")
    if view.checkpoint_save_s is not None:
        parts.append(f"delta {short_duration(view.checkpoint_save_s)}")
    parts.append(f"M {short_duration(view.job_mtbf_s)}")
    if view.expected_loss is not None and view.every_steps == change.every_steps:
        parts.append(f"expected loss {view.expected_loss:.1%}")
    return f"{', '.join(parts)}: {change.reason}"
