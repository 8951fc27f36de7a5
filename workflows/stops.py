"""Stopping ranks: which nodes a stop reaches, what its result means for the node
pool, and what a planned stop cost.

Pure functions of the spec, the state and the stop activity's result
(``tests/unit/test_stops.py``); the workflow only runs the activities. A stop is also
the fence: a quarantined node counts as fenced only once a stop reached it and found
nothing left alive, and ranks that survive SIGKILL block the next launch.
"""

from __future__ import annotations

from lazarus.domain.contracts import CheckpointRef, StopResult
from lazarus.domain.process_groups import UnkillableGroup
from lazarus.domain.spec import JobSpec
from workflows.placement import find_node
from workflows.state import MAX_RECORDS, JobState, NodePool, PlannedStop


def stop_targets(spec: JobSpec, pool: NodePool, only: list[str] | None) -> list[str]:
    """The nodes a stop reaches: ``only`` those, else the active nodes and the
    quarantined ones not yet fenced; each once, and only nodes the spec knows."""
    names = only if only is not None else [*pool.active, *pool.unfenced()]
    return [n for n in dict.fromkeys(names) if find_node(spec, n) is not None]


def leaves_state(spec: JobSpec) -> bool:
    """Whether a run of ``spec`` leaves something on its nodes beyond its ranks: zygotes
    (``warm_start``, on spares too) or memory-tier snapshots in tmpfs, which its last
    stop removes."""
    return spec.warm is not None or spec.checkpoints.memory_every_steps is not None


def end_of_run_targets(spec: JobSpec, state: JobState) -> list[str]:
    """The nodes the end-of-run stop reaches: every node the run may have left a
    zygote or memory-tier snapshots on, not only those it holds now. Those a stop
    reaches (active, unfenced), then every node a stop ever targeted
    (``state.touched_nodes``: spares that ran ranks, returned nodes), every quarantined
    node, fenced or not, and the nodes handed back to the fleet. A fenced node's ranks
    are gone, but its zygote (an idle standby included) and the run's ``/dev/shm``
    snapshots are not: nothing else ever stops them (issue 26). The spares too, which
    never ran a rank: with ``warm_start`` each holds the zygote its prewarm started
    (:func:`workflows.placement.prewarm_nodes`), and a memory replica may have been
    copied onto one."""
    names = [
        *stop_targets(spec, state.pool, None),
        *(state.pool.spares if leaves_state(spec) else []),
        *state.touched_nodes,
        *(q.node for q in state.pool.quarantined),
        *state.handed_back,
    ]
    return [n for n in dict.fromkeys(names) if find_node(spec, n) is not None]


def settle_stop(
    state: JobState, names: list[str], result: StopResult, now: float, whole_job: bool
) -> str | None:
    """Take in a stop of ``names``: they are remembered as touched (the end of the run
    revisits them wherever they went), the generation is down (``whole_job``),
    quarantined nodes it reached are fenced, and nodes whose ranks would not die are
    quarantined, unfenced. Returns what blocks the next launch (also in
    ``state.stuck_ranks``), or None when every rank died."""
    pool = state.pool
    state.touched_nodes = list(dict.fromkeys([*state.touched_nodes, *names]))
    if whole_job:
        state.generation_live = False
    for quarantined in pool.quarantined:
        if quarantined.node in names and reached(quarantined.node, result):
            quarantined.fenced = True
    if not result.unkillable:
        return None
    state.stuck_ranks = _quarantine_unkillable(pool, result.unkillable, now)
    return state.stuck_ranks


def reached(node: str, result: StopResult) -> bool:
    """A stop that targeted ``node`` reached it and left nothing alive there: what
    makes a quarantined node fenced."""
    return node not in result.unreachable and all(g.node != node for g in result.unkillable)


def _quarantine_unkillable(pool: NodePool, groups: list[UnkillableGroup], now: float) -> str:
    """Ranks that survived SIGKILL (uninterruptible sleep after a GPU Xid, or not ours
    to signal): their node is quarantined, unfenced, and the next launch escalates
    instead of starting a generation beside them. Returns the escalation's reason."""
    lines = []
    for group in groups:
        pids = ", ".join(str(p) for p in group.pids)
        lines.append(f"{group.node}: pgid {group.pgid} (pids {pids}) {group.reason}")
        if group.node in pool.active or group.node in pool.spares:
            pool.quarantine(group.node, f"ranks would not die: pids {pids}", now)
    return "ranks would not die after SIGKILL: " + "; ".join(lines)


def record_planned_stop(
    state: JobState,
    reason: str,
    *,
    requested_at: float,
    saved: CheckpointRef | None,
    saved_at: float,
    stopped: StopResult,
    stopped_at: float,
) -> PlannedStop:
    """Record a stop somebody asked for: a planned stop should cost no steps, and when
    it does (the just-in-time save did not arrive in time) the cost is kept. Steps
    lost count from the save, or else from the step the generation resumed from."""
    record = PlannedStop(
        reason=reason,
        requested_at=requested_at,
        stopped_at=stopped_at,
        step_at_stop=stopped.last_step,
        checkpoint_step=saved.step if saved else None,
        checkpoint_s=saved_at - requested_at if saved else None,
    )
    if stopped.last_step is not None:
        resume_from = saved.step if saved else state.resume.step if state.resume else 0
        record.steps_lost = max(0, stopped.last_step - resume_from)
    state.planned_stops = [*state.planned_stops, record][-MAX_RECORDS:]
    return record


def checkpoint_evidence(checkpoint_step: int | None) -> str:
    """The incident's line about its just-in-time checkpoint."""
    if checkpoint_step is None:
        return "just-in-time checkpoint did not arrive in time"
    return f"just-in-time checkpoint at step {checkpoint_step}"
