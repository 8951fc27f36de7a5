"""The fleet's durable state and configuration: its inventory (:class:`NodeRecord`,
one per node, in one :class:`NodeState`), each node's incidents and decayed
reputation, the lemon and probation rules it is configured with, and the one state
change every move goes through (:func:`_move`). The moves themselves are in
:mod:`lazarus.domain.fleet`."""

from __future__ import annotations

import math
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
        if any(n.transport.scheduled for n in (*self.nodes, *self.spares)):
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


# ---------------------------------------------------------------- state changes


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
