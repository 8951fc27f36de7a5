"""A node's health across jobs: the lemon rule (K incidents within a window keep a
node out of new leases) and probation (a fenced, failed node checked back into
service by N passing health checks in a row)."""

from __future__ import annotations

from lazarus.domain.fleet_state import (
    FleetConfig,
    FleetState,
    LemonRule,
    NodeRecord,
    NodeState,
    _log,
    _move,
    _to_pool,
)


def counting_incidents(record: NodeRecord, rule: LemonRule, now: float) -> int:
    """The node's incidents that the lemon rule counts at ``now``."""
    since = now - rule.window_h * 3600.0
    return sum(1 for i in record.incidents if i.failure_class in rule.classes and i.at >= since)


def is_lemon(record: NodeRecord, rule: LemonRule, now: float) -> bool:
    return counting_incidents(record, rule, now) >= rule.incidents


def start_probation(state: FleetState, config: FleetConfig, record: NodeRecord, now: float) -> None:
    """A fenced, failed (not drained) node is checked back into service, when the
    fleet has a health command to check it with."""
    if (
        record.state != NodeState.QUARANTINED
        or not record.fenced
        or record.drained
        or config.probation.health_command is None
    ):
        return
    _move(
        record,
        config,
        now,
        NodeState.PROBATION,
        reason=record.reason,
        failure_class=record.failure_class,
        fenced=True,
    )
    _log(state, now, "on probation", record.name, None)


def probation_result(
    state: FleetState, config: FleetConfig, node: str, passed: bool, detail: str, now: float
) -> None:
    """One health check of a node on probation: N passes in a row return it to the pool;
    a failure starts the count again. A node no longer on probation is left alone."""
    record = state.record(node)
    if record.state != NodeState.PROBATION:
        return
    if not passed:
        if record.passes:
            _log(state, now, f"probation check failed after {record.passes}: {detail}", node, None)
        record.passes = 0
        return
    record.passes += 1
    if record.passes >= config.probation.passes:
        _to_pool(state, config, record, now)
        _log(state, now, f"passed probation ({config.probation.passes} checks)", node, None)


def probation_not_run(state: FleetState, detail: str, now: float) -> None:
    """A probation round whose check could not run at all (the worker's allow-list
    refused the health command, say): logged where ``fleet status`` shows it, once
    per distinct reason, so a node stuck on probation says why."""
    what = f"probation check could not run: {detail}"
    if not any(e.what == what for e in state.log[-5:]):
        _log(state, now, what, None, None)


def on_probation(state: FleetState) -> list[NodeRecord]:
    return [r for r in state.nodes if r.state == NodeState.PROBATION]
