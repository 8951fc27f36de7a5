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
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lazarus.domain.compact_form import CompactForm
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.spec import JOB_NAME_PATTERN, NodeSpec, SSHSpec, repeated

PREFLIGHT_CLASS = "preflight"
"""The class of a node that failed the job's preflight checks before a launch."""
OPERATOR_CLASS = "operator"
"""A node an operator excluded (a job's ``recover --exclude-node``, a fleet drain)."""
STRAGGLER_CLASS = "straggler"
"""A node swapped out for being slow."""
INCIDENT_CLASSES = frozenset(
    {*(c.value for c in FailureClass), PREFLIGHT_CLASS, OPERATOR_CLASS, STRAGGLER_CLASS}
)
"""What a fleet incident's class may be, and so what a lemon rule may count."""

MAX_NODE_INCIDENTS = 20
"""Incidents kept per node (newest last): bounds the state carried by continue-as-new."""
MAX_FLEET_LOG = 100
"""Decisions kept in the fleet's log (newest last)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LemonRule(_Strict):
    """A node blamed in ``incidents`` incidents of ``classes`` within ``window_h`` hours,
    across any jobs, is a lemon: no new lease or replacement hands it out until enough
    of those incidents age out of the window."""

    incidents: Annotated[int, Field(ge=1)] = 2
    window_h: Annotated[float, Field(gt=0)] = 24.0 * 7
    classes: list[str] = Field(
        default_factory=lambda: [
            FailureClass.GPU_HARDWARE.value,
            FailureClass.NODE_LOST.value,
            FailureClass.NCCL_ERROR.value,
            FailureClass.NCCL_TIMEOUT.value,
            FailureClass.HANG.value,
            PREFLIGHT_CLASS,
        ]
    )
    """Classes that count; user code, OOM, preemption and operator moves do not blame
    the node by default."""

    @field_validator("classes")
    @classmethod
    def _known_classes(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - INCIDENT_CLASSES)
        if unknown:
            raise ValueError(
                f"unknown class {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(sorted(INCIDENT_CLASSES))}"
            )
        return value


class ProbationSpec(_Strict):
    """How a quarantined node earns its way back: ``health_command`` run on it every
    ``interval_s`` must pass ``passes`` times in a row. Without a command a quarantined
    node stays out until ``lazarus fleet return``."""

    health_command: list[str] | None = Field(default=None, min_length=1)
    passes: Annotated[int, Field(ge=1)] = 3
    interval_s: Annotated[float, Field(gt=0, le=86_400)] = 300.0
    timeout_s: Annotated[float, Field(gt=0, le=600)] = 30.0
    workdir: str = "/tmp"
    """Where the command runs on the node (and whose disk the check looks at)."""


class FleetConfig(_Strict):
    """A fleet's YAML (``lazarus fleet start CONFIG.yaml``): its nodes, its shared spare
    pool, the lemon rule, probation and the reputation's half-life."""

    name: str = Field(pattern=JOB_NAME_PATTERN)
    nodes: list[NodeSpec] = Field(min_length=1)
    """Nodes jobs lease to train on (and to hold as their own spares)."""
    spares: list[NodeSpec] = Field(default_factory=list)
    """The shared spare pool: handed out only as replacements, to whichever job loses a
    node with no spare of its own left. Its size is the target the fleet refills to."""
    ssh: SSHSpec = Field(default_factory=SSHSpec)
    """How probation reaches ``ssh`` nodes."""
    lemon: LemonRule = Field(default_factory=LemonRule)
    probation: ProbationSpec = Field(default_factory=ProbationSpec)
    reputation_half_life_h: Annotated[float, Field(gt=0)] = 24.0 * 7
    """Failures and node-hours both decay with this half-life: a node's reputation
    (failures per node-hour) follows what it did lately."""
    continue_as_new_after_events: Annotated[int, Field(ge=20)] = 5_000

    @model_validator(mode="after")
    def _nodes_consistent(self) -> FleetConfig:
        twice = repeated(n.name for n in (*self.nodes, *self.spares))
        if twice:
            raise ValueError(f"nodes/spares: node names must be unique; repeated: {twice}")
        launchers = {n.launcher for n in (*self.nodes, *self.spares)}
        if "slurm" in launchers:
            raise ValueError("nodes/spares: a fleet holds local or ssh nodes, not slurm ones")
        if len(launchers) > 1:
            raise ValueError("nodes/spares: all nodes must use the same launcher")
        return self

    @property
    def spare_target(self) -> int:
        return len(self.spares)


class NodeState(StrEnum):
    HEALTHY = "healthy"
    """Free: a lease may take it."""
    SPARE = "spare"
    """Free, in the shared spare pool: only a replacement takes it."""
    LEASED = "leased"
    """Held by a job (training, or one of its own spares)."""
    QUARANTINED = "quarantined"
    """Out of service: blamed in an incident, or drained by an operator."""
    PROBATION = "probation"
    """Fenced and being checked: back in the pool after N passes in a row."""


class FleetIncident(_Strict):
    """One quarantine a job reported: what, when, in which job."""

    failure_class: str
    at: float
    job: str
    key: str = ""
    """The job's own name for the report (``job#run-<key>#incident N``): a retried
    report is a no-op."""
    reason: str = ""


class Reputation(BaseModel):
    """Failures per node-hour, both decayed with the fleet's half-life.

    ``failures`` and ``hours`` are exponentially weighted sums as of ``at``: a failure
    counts 1 when it happens and half that a half-life later; an hour in service
    likewise. Their ratio is a failure rate that forgets old behaviour."""

    failures: float = 0.0
    hours: float = 0.0
    at: float = 0.0

    def rate(self) -> float | None:
        """Failures per node-hour; None before the node has served any time."""
        return self.failures / self.hours if self.hours > 0 else None


def decay(rep: Reputation, now: float, half_life_h: float, in_service: bool) -> Reputation:
    """``rep`` carried forward to ``now``: both sums decay, and the time in service in
    between adds its node-hours (each weighted by how long ago it was)."""
    elapsed_h = max(0.0, now - rep.at) / 3600.0
    factor = 0.5 ** (elapsed_h / half_life_h)
    served = half_life_h / math.log(2) * (1.0 - factor) if in_service else 0.0
    return Reputation(
        failures=rep.failures * factor, hours=rep.hours * factor + served, at=max(now, rep.at)
    )


class NodeRecord(CompactForm):
    """One node of the fleet: where it is now, and what it has done. A fleet holds
    thousands, carried by every continue-as-new: written compactly (:class:`CompactForm`)."""

    always_written: ClassVar[frozenset[str]] = frozenset({"state"})
    spec: NodeSpec
    state: NodeState = NodeState.HEALTHY
    since: float = 0.0
    job: str | None = None
    """LEASED: the job holding it; QUARANTINED: the job that reported it, if any."""
    run: str = ""
    """LEASED (or QUARANTINED by its job): the start of ``job`` that leased it
    (:attr:`LeaseRequest.run`; a replacement, the lost node's), so a later
    start of the same name is not handed this one's nodes; empty for a lease from a job
    from before runs were named (and in state written before)."""
    role: Literal["node", "spare", "replacement"] | None = None
    """LEASED: what the job took it as."""
    replaces: str | None = None
    """A replacement: the lost node it stands in for."""
    replaces_key: str = ""
    """A replacement: the loss it answered (:attr:`ReplaceRequest.key`), which makes
    ``replace`` idempotent."""
    reason: str = ""
    failure_class: str | None = None
    fenced: bool = False
    """QUARANTINED: no stale rank can run on it (its job released it, or it was free)."""
    drained: bool = False
    """Taken out by an operator: probation does not bring it back, only ``return``."""
    drain_pending: str | None = None
    """LEASED and drained: quarantined with this reason when its job releases it."""
    passes: int = 0
    """PROBATION: health checks passed in a row."""
    incidents: list[FleetIncident] = Field(default_factory=list)
    reputation: Reputation = Field(default_factory=Reputation)

    @property
    def name(self) -> str:
        return self.spec.name


class FleetEvent(BaseModel):
    """One decision of the fleet, for ``lazarus fleet status``."""

    at: float
    what: str
    node: str | None = None
    job: str | None = None


class FleetState(BaseModel):
    """Carried across continue-as-new: the fleet's only memory."""

    nodes: list[NodeRecord] = Field(default_factory=list)
    log: list[FleetEvent] = Field(default_factory=list)
    runs: int = 1
    started_at: float = 0.0

    def record(self, name: str) -> NodeRecord:
        found = next((r for r in self.nodes if r.name == name), None)
        if found is None:
            raise FleetRefusal(f"node {name!r} is not in this fleet")
        return found

    def held_by(self, job: str) -> list[NodeRecord]:
        return [r for r in self.nodes if r.state == NodeState.LEASED and r.job == job]


def scratch_copy(state: FleetState) -> FleetState:
    """A copy to try a move on (the update validators'): every record is copied, what
    a record holds is shared, which is sound because moves replace fields and never
    change them in place. A deep copy of 2,000 records took 0.3 to 0.5 s, on every
    update; this takes milliseconds."""
    return state.model_copy(update={"nodes": [record.model_copy() for record in state.nodes]})


class FleetInput(BaseModel):
    config: FleetConfig
    state: FleetState | None = None


class FleetRefusal(ValueError):
    """A request the fleet cannot take; the message says why, for the caller."""


# ----------------------------------------------------------------- requests/replies


class LeaseRequest(BaseModel):
    job: str
    nodes: Annotated[int, Field(ge=1)]
    spares: Annotated[int, Field(ge=0)] = 0
    run: str = ""
    """The requesting start of ``job`` (its run key, ``run-<first run id>``, kept across
    continue-as-new). A retried lease is one with the same run; a job's name alone
    does not say whether an earlier start's lease is this one's. Empty from jobs from
    before runs were named."""


class Lease(BaseModel):
    """What a job holds: its training nodes in rank order, then its own spares."""

    nodes: list[NodeSpec]
    spares: list[NodeSpec] = Field(default_factory=list)
    excluded_lemons: list[str] = Field(default_factory=list)
    """Free nodes the lemon rule kept out of this lease."""


class ReleaseRequest(BaseModel):
    job: str
    fenced: list[str] = Field(default_factory=list)
    """Quarantined nodes the job's last stop confirmed empty: they may go on probation."""
    run: str = ""
    """The releasing start (:attr:`LeaseRequest.run`): a late release of an earlier start
    never frees a later start's nodes. Empty: every node leased to ``job``."""


class OrphanRelease(BaseModel):
    """``lazarus fleet release JOB``: an operator frees the nodes of a job whose workflow
    has closed without releasing them (terminated, or its release never reached the
    fleet). The client checks that the job's workflow is closed first: the fleet cannot."""

    job: str
    fenced: bool = False
    """The operator vouches that no rank of the job runs on its nodes any more (its last
    stop reached them, or they were checked or rebooted): they go back to service.
    Without it they are quarantined, not fenced: a terminated job's ranks may still run
    there, so each is checked and returned (``lazarus fleet return NODE --fenced``)."""


class HandBackRequest(BaseModel):
    """A running job gives back quarantined nodes its stops have fenced, so they need
    not wait for the job's end (weeks, for a large run) to be checked back into
    service: probation starts now, and a repaired node serves any job again."""

    job: str
    nodes: list[str] = Field(min_length=1)


class HandBackReply(BaseModel):
    gone: list[str] = Field(default_factory=list)
    """Nodes no longer the job's: taken now, or by an earlier (retried) call."""
    note: str = ""


class QuarantineReport(BaseModel):
    job: str
    node: str
    failure_class: str
    reason: str = ""
    key: str = ""
    """``job#incident``: the same key twice is counted once (a retried report)."""


class ReplaceRequest(BaseModel):
    job: str
    lost: str
    key: str = ""
    """One loss of ``lost`` (``job#node@gen N``): asked again with the same key, the
    fleet answers with the same node. Empty, as jobs from before sent it, the lost
    node's name alone was the key, so a node lost a second time (back from repair)
    got its first replacement again, a node the job already ran on, and no spare."""


class DrainRequest(BaseModel):
    node: str
    reason: str


class ReturnRequest(BaseModel):
    node: str
    fenced: bool = False
    """The operator vouches that no stale rank runs on the node (checked or rebooted):
    needed for a node its job's stops never reached, such as a host that was dead
    when the job ended."""


class NodeView(BaseModel):
    """A node as ``lazarus fleet nodes`` shows it."""

    name: str
    state: NodeState
    job: str | None = None
    role: str | None = None
    reason: str = ""
    failure_class: str | None = None
    since: float
    fenced: bool = False
    passes: int = 0
    lemon: bool = False
    incidents: int = 0
    """Incidents within the lemon window that count toward the rule."""
    failures_per_node_hour: float | None = None
    drain_pending: str | None = None


class FleetStatus(BaseModel):
    name: str
    counts: dict[str, int]
    nodes: list[NodeView]
    log: list[FleetEvent]
    runs: int
    lemons: list[str]
    spare_target: int
    probation_passes: int | None
    """Passes a quarantined node needs; None when no health command is configured."""


# ------------------------------------------------------------------------ moves


def initial_state(config: FleetConfig, now: float) -> FleetState:
    records = [NodeRecord(spec=n, since=now, reputation=Reputation(at=now)) for n in config.nodes]
    records += [
        NodeRecord(spec=n, state=NodeState.SPARE, since=now, reputation=Reputation(at=now))
        for n in config.spares
    ]
    return FleetState(nodes=records, started_at=now)


def counting_incidents(record: NodeRecord, rule: LemonRule, now: float) -> int:
    """The node's incidents that the lemon rule counts at ``now``."""
    since = now - rule.window_h * 3600.0
    return sum(1 for i in record.incidents if i.failure_class in rule.classes and i.at >= since)


def is_lemon(record: NodeRecord, rule: LemonRule, now: float) -> bool:
    return counting_incidents(record, rule, now) >= rule.incidents


def _log(state: FleetState, now: float, what: str, node: str | None, job: str | None) -> None:
    state.log = [*state.log, FleetEvent(at=now, what=what, node=node, job=job)][-MAX_FLEET_LOG:]


def _move(
    record: NodeRecord, config: FleetConfig, now: float, to: NodeState, **fields: object
) -> None:
    """Change a node's state, settling its reputation's node-hours first (time in
    service counts only while it was leased)."""
    record.reputation = decay(
        record.reputation, now, config.reputation_half_life_h, record.state == NodeState.LEASED
    )
    record.state = to
    record.since = now
    record.job = None
    record.run = ""
    record.role = None
    record.replaces = None
    record.replaces_key = ""
    record.passes = 0
    for key, value in fields.items():
        setattr(record, key, value)


def _to_pool(state: FleetState, config: FleetConfig, record: NodeRecord, now: float) -> None:
    """A node back in service refills the shared spare pool first, up to its target."""
    spares = sum(1 for r in state.nodes if r.state == NodeState.SPARE)
    to = NodeState.SPARE if spares < config.spare_target else NodeState.HEALTHY
    _move(record, config, now, to, reason="", failure_class=None, fenced=False, drained=False)


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


def on_probation(state: FleetState) -> list[NodeRecord]:
    return [r for r in state.nodes if r.state == NodeState.PROBATION]


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


# ------------------------------------------------- a job's calls into its fleet
#
# A workflow cannot send an update to another workflow, and a signal cannot answer: a
# job calls its fleet through these activities, which send the update with the
# worker's Temporal client and bring back the fleet's validated reply. A refusal
# comes back as a non-retryable ``FleetRefused`` error; a fleet that is not running
# (or not answering) as a retryable ``FleetUnreachable``.

FLEET_REFUSED = "FleetRefused"
FLEET_UNREACHABLE = "FleetUnreachable"


class FleetLeaseCall(BaseModel):
    fleet: str
    request: LeaseRequest


class FleetReportCall(BaseModel):
    """Report a quarantine, ask for a node in place of ``replace``, or both (in that
    order)."""

    fleet: str
    job: str
    report: QuarantineReport | None = None
    replace: str | None = None
    replace_key: str = ""
    """The loss ``replace`` answers (:attr:`ReplaceRequest.key`)."""


class FleetReportReply(BaseModel):
    note: str = ""
    replacement: NodeSpec | None = None


class FleetReleaseCall(BaseModel):
    fleet: str
    request: ReleaseRequest


class FleetHandBackCall(BaseModel):
    fleet: str
    request: HandBackRequest


class FleetReply(BaseModel):
    note: str
