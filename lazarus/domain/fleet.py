"""The fleet: one durable memory per cluster, shared by the jobs that name it.

A fleet owns an inventory of nodes. Jobs lease their nodes (and private spares) from
it, report every quarantine to it, and ask it for a replacement when their own spares
run out; the fleet remembers what each node did across jobs, and keeps "lemons" (a
node blamed in K incidents within a window) out of new leases.

Every node is in one state (:class:`NodeState`)::

    HEALTHY --lease--> LEASED(job) --release--> HEALTHY or SPARE (spare pool refilled first)
    SPARE --replace--> LEASED(job)        (the shared spare pool serves replacements)
    LEASED --report_quarantine--> QUARANTINED(reason, class, at, fenced=False)
    QUARANTINED --release of its job (fenced)--> PROBATION (when a health command is set)
    QUARANTINED --hand_back by its job, mid-run (fenced)--> PROBATION, or QUARANTINED(job: none)
    PROBATION --N passes in a row--> HEALTHY or SPARE;  a failed pass restarts the count
    any free state --drain--> QUARANTINED(operator, drained): only ``return`` ends it
    LEASED(job that ended unreleased) --release_orphan--> QUARANTINED (unfenced), or the pool
    LEASED --drain--> stays with its job, quarantined when the job releases it
    QUARANTINED/PROBATION --return--> HEALTHY or SPARE (only once fenced)

Every move is a pure function of (:class:`FleetState`, :class:`FleetConfig`, request,
now) here, unit-tested without a server (``tests/unit/test_fleet_*.py``); the fleet
workflow only decides *when*. A move that cannot be taken raises
:class:`FleetRefusal` with the reason, before changing anything: the workflow's
update validators run the same move on a copy (:func:`scratch_copy`), so a refused
request never reaches history as accepted. Moves *replace* a record's fields and
lists (``record.incidents = [*record.incidents, new]``), never change them in place:
that is what lets the copy share them.

The moves are here; the state and config they act on are in
:mod:`lazarus.domain.fleet_state`, the lemon and probation rules in
:mod:`lazarus.domain.fleet_health`, the requests and replies in
:mod:`lazarus.domain.fleet_messages`. This module re-exports them (``__all__``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from lazarus.domain.fleet_health import (
    counting_incidents,
    is_lemon,
    on_probation,
    probation_not_run,
    probation_result,
    start_probation,
)
from lazarus.domain.fleet_messages import (
    FLEET_REFUSED,
    FLEET_UNREACHABLE,
    DrainRequest,
    FleetHandBackCall,
    FleetLeaseCall,
    FleetReleaseCall,
    FleetReply,
    FleetReportCall,
    FleetReportReply,
    FleetStatus,
    HandBackReply,
    HandBackRequest,
    Lease,
    LeaseRequest,
    NodeView,
    OrphanRelease,
    QuarantineReport,
    ReleaseRequest,
    ReplaceRequest,
    ReturnRequest,
)
from lazarus.domain.fleet_state import (
    INCIDENT_CLASSES,
    MAX_FLEET_LOG,
    MAX_NODE_INCIDENTS,
    OPERATOR_CLASS,
    PREFLIGHT_CLASS,
    STRAGGLER_CLASS,
    FleetConfig,
    FleetEvent,
    FleetIncident,
    FleetInput,
    FleetRefusal,
    FleetState,
    LemonRule,
    NodeRecord,
    NodeState,
    ProbationSpec,
    Reputation,
    _log,
    _move,
    _to_pool,
    decay,
    scratch_copy,
)
from lazarus.domain.spec import NodeSpec

__all__ = [
    "FLEET_REFUSED",
    "FLEET_UNREACHABLE",
    "INCIDENT_CLASSES",
    "MAX_FLEET_LOG",
    "MAX_NODE_INCIDENTS",
    "OPERATOR_CLASS",
    "PREFLIGHT_CLASS",
    "STRAGGLER_CLASS",
    "DrainRequest",
    "FleetConfig",
    "FleetEvent",
    "FleetHandBackCall",
    "FleetIncident",
    "FleetInput",
    "FleetLeaseCall",
    "FleetRefusal",
    "FleetReleaseCall",
    "FleetReply",
    "FleetReportCall",
    "FleetReportReply",
    "FleetState",
    "FleetStatus",
    "HandBackReply",
    "HandBackRequest",
    "Lease",
    "LeaseRequest",
    "LemonRule",
    "NodeRecord",
    "NodeState",
    "NodeView",
    "OrphanRelease",
    "ProbationSpec",
    "QuarantineReport",
    "ReleaseRequest",
    "ReplaceRequest",
    "Reputation",
    "ReturnRequest",
    "counting_incidents",
    "decay",
    "drain",
    "fleet_status",
    "hand_back",
    "initial_state",
    "is_lemon",
    "lease",
    "node_names",
    "on_probation",
    "probation_not_run",
    "probation_result",
    "release",
    "release_orphan",
    "replace",
    "report_quarantine",
    "return_node",
    "scratch_copy",
    "start_probation",
]

# ------------------------------------------------------------------------ moves


def initial_state(config: FleetConfig, now: float) -> FleetState:
    records = [NodeRecord(spec=n, since=now, reputation=Reputation(at=now)) for n in config.nodes]
    records += [
        NodeRecord(spec=n, state=NodeState.SPARE, since=now, reputation=Reputation(at=now))
        for n in config.spares
    ]
    return FleetState(nodes=records, started_at=now)


def lease(state: FleetState, config: FleetConfig, request: LeaseRequest, now: float) -> Lease:
    """Lease ``nodes`` + ``spares`` healthy nodes to a job, lemons excluded.

    The same run asking again (a retried call) gets the same lease back, never a second.
    A lease the job's name holds from another run is refused, never handed over: it
    belongs to an earlier start that ended without releasing it, may be of another
    size (the new start would train at the wrong world size), and that start's ranks
    may still run on it. An operator frees it (:func:`release_orphan`). Jobs from before
    runs were named (an empty ``run`` on both sides) keep the old answer, but only for a
    lease of the size they ask for."""
    held = state.held_by(request.job)
    if held:
        nodes = [r.spec for r in held if r.role == "node"]
        spares = [r.spec for r in held if r.role != "node"]
        runs = {r.run for r in held}
        same_size = (len(nodes), len(spares)) == (request.nodes, request.spares)
        if runs == {request.run} and (request.run or same_size):
            return Lease(nodes=nodes, spares=spares)
        earlier = ", ".join(sorted(r for r in runs if r)) or "an unnamed run"
        raise FleetRefusal(
            f"job {request.job} already holds {', '.join(node_names(nodes + spares))} in fleet "
            f"{config.name}, leased by an earlier start ({earlier}; {len(nodes)} node(s) + "
            f"{len(spares)} spare(s)); once that start has ended, free them with "
            f"'lazarus fleet release {request.job} --fleet {config.name}', then start again"
        )
    free = [r for r in state.nodes if r.state == NodeState.HEALTHY]
    lemons = [r.name for r in free if is_lemon(r, config.lemon, now)]
    eligible = [r for r in free if r.name not in lemons]
    wanted = request.nodes + request.spares
    if len(eligible) < wanted:
        lemon_note = f" ({len(lemons)} lemon(s) excluded: {', '.join(lemons)})" if lemons else ""
        raise FleetRefusal(
            f"fleet {config.name} has {len(eligible)} healthy node(s) free{lemon_note}; "
            f"job {request.job} wants {request.nodes} node(s) + {request.spares} spare(s)"
        )
    # Best reputation first: the lowest decayed failure rate trains.
    chosen = sorted(eligible, key=lambda r: _rate_key(r, config, now))[:wanted]
    for index, record in enumerate(chosen):
        role: Literal["node", "spare"] = "node" if index < request.nodes else "spare"
        _move(record, config, now, NodeState.LEASED, job=request.job, role=role, run=request.run)
    names = ", ".join(r.name for r in chosen)
    excluded = f"; lemons excluded: {', '.join(lemons)}" if lemons else ""
    _log(state, now, f"leased {names}{excluded}", None, request.job)
    return Lease(
        nodes=[r.spec for r in chosen[: request.nodes]],
        spares=[r.spec for r in chosen[request.nodes :]],
        excluded_lemons=lemons,
    )


def _rate_key(record: NodeRecord, config: FleetConfig, now: float) -> float:
    rate = decay(record.reputation, now, config.reputation_half_life_h, False).rate()
    return rate if rate is not None else 0.0


def report_quarantine(
    state: FleetState, config: FleetConfig, report: QuarantineReport, now: float
) -> str:
    """Record a quarantine a job made: the node is out, its incident counts toward the
    lemon rule and its reputation. The same ``key`` twice is one incident."""
    if report.failure_class not in INCIDENT_CLASSES:
        raise FleetRefusal(f"unknown incident class {report.failure_class!r}")
    record = state.record(report.node)
    if record.state == NodeState.LEASED and record.job != report.job:
        raise FleetRefusal(f"node {report.node} is leased to job {record.job}, not {report.job}")
    if record.state not in (NodeState.LEASED, NodeState.QUARANTINED):
        raise FleetRefusal(f"node {report.node} is {record.state.value}, not leased to a job")
    if report.key and any(i.key == report.key for i in record.incidents):
        return f"{report.node}: already reported"
    incident = FleetIncident(
        failure_class=report.failure_class,
        at=now,
        job=report.job,
        key=report.key,
        reason=report.reason,
    )
    record.incidents = [*record.incidents, incident][-MAX_NODE_INCIDENTS:]
    was_leased = record.state == NodeState.LEASED
    if was_leased:
        _move(
            record,
            config,
            now,
            NodeState.QUARANTINED,
            job=report.job,
            run=record.run,
            reason=report.reason,
            failure_class=report.failure_class,
            fenced=False,
            drained=record.drain_pending is not None,
            drain_pending=None,
        )
    rep = decay(record.reputation, now, config.reputation_half_life_h, False)
    record.reputation = rep.model_copy(update={"failures": rep.failures + 1.0})
    lemon = " (now a lemon)" if is_lemon(record, config.lemon, now) else ""
    _log(
        state,
        now,
        f"quarantined ({report.failure_class}): {report.reason}{lemon}",
        report.node,
        report.job,
    )
    return f"{report.node} quarantined{lemon}"


def replace(
    state: FleetState, config: FleetConfig, request: ReplaceRequest, now: float
) -> NodeSpec | None:
    """A node for a job that lost ``lost`` with no spare of its own left: from the
    shared spare pool first, then from the healthy nodes, never a lemon. None when the
    fleet has none. Asking twice for the same loss (its key) returns the same replacement."""
    given = next(
        (
            r
            for r in state.held_by(request.job)
            if r.replaces == request.lost and r.replaces_key == request.key
        ),
        None,
    )
    if given is not None:
        return given.spec
    lost = state.record(request.lost)
    if lost.job != request.job:
        raise FleetRefusal(f"node {request.lost} is not held by job {request.job}")
    for pool in (NodeState.SPARE, NodeState.HEALTHY):
        candidates = [
            r for r in state.nodes if r.state == pool and not is_lemon(r, config.lemon, now)
        ]
        if candidates:
            chosen = min(candidates, key=lambda r: _rate_key(r, config, now))
            _move(
                chosen,
                config,
                now,
                NodeState.LEASED,
                job=request.job,
                run=lost.run,
                role="replacement",
                replaces=request.lost,
                replaces_key=request.key,
            )
            _log(
                state, now, f"replaces {request.lost} (from {pool.value})", chosen.name, request.job
            )
            return chosen.spec
    _log(
        state,
        now,
        f"no replacement for {request.lost}: no spare or healthy node",
        None,
        request.job,
    )
    return None


def release(state: FleetState, config: FleetConfig, request: ReleaseRequest, now: float) -> str:
    """A job ended: its nodes go back to the pool (a drained one to quarantine), and its
    quarantined nodes that its last stop fenced may start probation."""
    returned: list[str] = []
    for record in state.held_by(request.job):
        if request.run and record.run and record.run != request.run:
            continue  # a later start's lease: not this (late) release's to give back
        if record.drain_pending is not None:
            reason = record.drain_pending
            _move(
                record,
                config,
                now,
                NodeState.QUARANTINED,
                reason=reason,
                failure_class=OPERATOR_CLASS,
                fenced=True,
                drained=True,
                drain_pending=None,
            )
            _log(state, now, f"drained on release: {reason}", record.name, request.job)
            continue
        _to_pool(state, config, record, now)
        returned.append(record.name)
    for record in state.nodes:
        if record.state != NodeState.QUARANTINED or record.job != request.job:
            continue
        if record.name in request.fenced:
            record.fenced = True
            start_probation(state, config, record, now)
        elif not record.fenced:
            _log(
                state,
                now,
                "not fenced: the job's stops never reached it; stays quarantined until "
                f"checked and returned ('lazarus fleet return {record.name} --fenced')",
                record.name,
                request.job,
            )
    if returned:
        _log(state, now, f"released {', '.join(returned)}", None, request.job)
    return f"released {len(returned)} node(s)"


def release_orphan(
    state: FleetState, config: FleetConfig, request: OrphanRelease, now: float
) -> str:
    """An operator frees the nodes a job still holds after its workflow closed without a
    release (terminated, or a release that never reached the fleet): without this they
    stayed LEASED to it for good, ``return`` refusing a node in service and ``drain``
    waiting for a release that never came.

    Not fenced (the default): its leased nodes are quarantined, not fenced, since a
    terminated job's ranks may still run there; ``return NODE --fenced`` brings each
    back once checked. Fenced (the operator vouches): they go back as the job's own
    release would have sent them, and its unfenced quarantined nodes start probation."""
    held = state.held_by(request.job)
    unfenced = [
        r
        for r in state.nodes
        if r.state == NodeState.QUARANTINED and r.job == request.job and not r.fenced
    ]
    if not held and not (request.fenced and unfenced):
        left = f" ({len(unfenced)} quarantined, not fenced)" if unfenced else ""
        raise FleetRefusal(f"job {request.job} holds no leased node in fleet {config.name}{left}")
    if request.fenced:
        checked = [r.name for r in unfenced]
        reply = release(state, config, ReleaseRequest(job=request.job, fenced=checked), now)
        _log(state, now, "lease freed by operator (fenced)", None, request.job)
        after = "on probation" if config.probation.health_command is not None else "quarantined"
        more = f"; {', '.join(checked)} fenced by operator ({after})" if checked else ""
        return f"job {request.job}: {reply}{more}"
    names = [r.name for r in held]
    for record in held:
        drained = record.drain_pending
        _move(
            record,
            config,
            now,
            NodeState.QUARANTINED,
            job=request.job,
            reason=drained or f"lease of job {request.job} freed by operator",
            failure_class=OPERATOR_CLASS,
            fenced=False,
            drained=drained is not None,
            drain_pending=None,
        )
    _log(
        state,
        now,
        f"lease freed by operator, not fenced: {', '.join(names)} quarantined until checked "
        "and returned ('lazarus fleet return NODE --fenced')",
        None,
        request.job,
    )
    return (
        f"job {request.job}: {', '.join(names)} quarantined, not fenced: its ranks may still "
        f"run there. Check each node (or reboot it), then 'lazarus fleet return NODE --fenced "
        f"--fleet {config.name}'; or, if the job's stops reached them, 'lazarus fleet release "
        f"{request.job} --fenced --fleet {config.name}'"
    )


def hand_back(
    state: FleetState, config: FleetConfig, request: HandBackRequest, now: float
) -> HandBackReply:
    """A running job's fenced quarantined nodes leave it: on probation when the fleet
    has a health command, else quarantined and fenced with no job, for ``return``.

    Idempotent: a node no longer quarantined for this job (a retried call: already on
    probation, or back in service) is not taken again. A node the fleet still counts
    as leased to the job (its quarantine report never arrived) is kept, and the reply
    says so: the job holds it until it ends, as before. Only a node leased to another
    job is refused, before anything changes: the job names a node that is not its own."""
    records = [state.record(name) for name in request.nodes]
    for record in records:
        if record.state == NodeState.LEASED and record.job != request.job:
            raise FleetRefusal(f"node {record.name} is leased to job {record.job}")
    taken = [r for r in records if r.state == NodeState.QUARANTINED and r.job == request.job]
    kept = [r.name for r in records if r.state == NodeState.LEASED]
    for record in taken:
        record.fenced = True
        record.job = None
        record.run = ""
        start_probation(state, config, record, now)
    after = "on probation" if config.probation.health_command is not None else "quarantined"
    names = [r.name for r in taken]
    lines = []
    if names:
        _log(state, now, f"handed back, fenced: {', '.join(names)} ({after})", None, request.job)
        lines.append(f"took {', '.join(names)} back ({after})")
    if kept:
        lines.append(f"{', '.join(kept)} still leased here (no quarantine report): kept")
    if len(names) + len(kept) < len(records):
        lines.append("the rest were handed back before")
    return HandBackReply(
        gone=[r.name for r in records if r.name not in kept], note="; ".join(lines)
    )


def drain(state: FleetState, config: FleetConfig, request: DrainRequest, now: float) -> str:
    """An operator takes a node out. A free node is quarantined at once; a leased one
    stays with its job (stop it there with ``lazarus drain``) and is quarantined when
    the job releases it."""
    record = state.record(request.node)
    if record.state == NodeState.LEASED:
        if record.drain_pending is not None:
            raise FleetRefusal(f"node {request.node} is already to be drained")
        record.drain_pending = request.reason
        _log(
            state,
            now,
            f"drain pending until job {record.job} releases it: {request.reason}",
            request.node,
            record.job,
        )
        return (
            f"{request.node} is leased to job {record.job}: quarantined when the job "
            "releases it (use 'lazarus drain' to take it off the job now)"
        )
    if record.state == NodeState.QUARANTINED and record.drained:
        raise FleetRefusal(f"node {request.node} is already drained: {record.reason}")
    fenced = record.fenced if record.state == NodeState.QUARANTINED else True
    _move(
        record,
        config,
        now,
        NodeState.QUARANTINED,
        reason=request.reason,
        failure_class=OPERATOR_CLASS,
        fenced=fenced,
        drained=True,
    )
    _log(state, now, f"drained: {request.reason}", request.node, None)
    return f"{request.node} drained"


def return_node(state: FleetState, config: FleetConfig, request: ReturnRequest, now: float) -> str:
    """An operator puts a node back in service (or cancels a pending drain). A node a
    job may still run stale ranks on (not fenced) is refused until its job ends."""
    record = state.record(request.node)
    if record.state == NodeState.LEASED:
        if record.drain_pending is None:
            raise FleetRefusal(f"node {request.node} is in service (leased to job {record.job})")
        record.drain_pending = None
        _log(state, now, "pending drain cancelled", request.node, record.job)
        return f"{request.node}: pending drain cancelled"
    if record.state in (NodeState.HEALTHY, NodeState.SPARE):
        raise FleetRefusal(f"node {request.node} is already in service ({record.state.value})")
    if not record.fenced and not request.fenced:
        if record.job is not None and state.held_by(record.job):
            raise FleetRefusal(
                f"node {request.node} is not fenced: job {record.job} may still run ranks on "
                "it; it is fenced when that job ends (or check it and return it with --fenced)"
            )
        raise FleetRefusal(
            f"node {request.node} is not fenced: its job's stops never reached it, so stale "
            "ranks may still run there; check it (or reboot it), then return it with --fenced"
        )
    was = record.state.value
    vouched = ", fenced by operator" if not record.fenced else ""
    _to_pool(state, config, record, now)
    _log(state, now, f"returned by operator (was {was}{vouched})", request.node, None)
    return f"{request.node} is {record.state.value} again"


def fleet_status(state: FleetState, config: FleetConfig, now: float) -> FleetStatus:
    """The fleet as a person or a script sees it at ``now`` (workflow time)."""
    views = [_view(r, config, now) for r in state.nodes]
    counts = {s.value: sum(1 for v in views if v.state == s) for s in NodeState}
    return FleetStatus(
        name=config.name,
        counts=counts,
        nodes=views,
        log=state.log,
        runs=state.runs,
        lemons=[v.name for v in views if v.lemon],
        spare_target=config.spare_target,
        probation_passes=(
            config.probation.passes if config.probation.health_command is not None else None
        ),
    )


def _view(record: NodeRecord, config: FleetConfig, now: float) -> NodeView:
    rep = decay(
        record.reputation, now, config.reputation_half_life_h, record.state == NodeState.LEASED
    )
    return NodeView(
        name=record.name,
        state=record.state,
        job=record.job,
        role=record.role,
        reason=record.reason,
        failure_class=record.failure_class,
        since=record.since,
        fenced=record.fenced,
        passes=record.passes,
        lemon=is_lemon(record, config.lemon, now),
        incidents=counting_incidents(record, config.lemon, now),
        failures_per_node_hour=rep.rate(),
        drain_pending=record.drain_pending,
    )


def node_names(specs: Iterable[NodeSpec]) -> list[str]:
    return [n.name for n in specs]
