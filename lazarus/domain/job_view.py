"""What a client sees of a job: its phase (and the phase diagram), its status, its
incidents, and the messages an operator sends it.

These are the job's public contract, the types :class:`lazarus.app.client.JobClient`
returns and takes, so they live on the domain floor: a client imports them without
importing workflow code. The workflow keeps them in its state
(:mod:`workflows.state` re-exports them) and the playbook's answer
(:class:`Decision`, its :class:`Action`) is recorded on each incident. Moved here
unchanged from ``workflows/state.py`` and ``workflows/playbook.py`` (issue 40): the
payloads, and so the released histories, are the same.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from lazarus.domain.checkpoint_interval import CheckpointIntervalView
from lazarus.domain.contracts import FailureKind, FailureReport, RankStatus
from lazarus.domain.evidence import cap_evidence
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.recovery_timeline import RecoveryTimeline


class Action(StrEnum):
    RESTART = "restart"
    """Stop the whole generation, relaunch generation+1 from the newest checkpoint."""
    ROLLBACK = "rollback"
    """Like RESTART, but from the checkpoint before the newest (it may hold the divergence)."""
    NEEDS_OPERATOR = "needs_operator"
    """Stop the ranks and wait for a person: more restarts would not help."""
    REPLACE_NODE = "replace_node"
    """Quarantine the failed node, take a spare, relaunch with the same world size."""
    SHRINK = "shrink"
    """No spare left, but the spec allows fewer nodes: relaunch without the failed node."""
    RECORD = "record"
    """Note it and alert, keep training: acting would cost more than it gains."""
    PAUSE = "pause"
    """Not a strategy's answer: Slurm is taking the allocation away (preemption, time
    limit): checkpoint just in time, stop, and pause (``slurm.resubmit: false``)."""
    RESUBMIT = "resubmit"
    """Not a strategy's answer: Slurm is taking the allocation away and the job asked
    to go on (``slurm.resubmit``): checkpoint just in time, stop, submit a new
    allocation, relaunch there from that checkpoint."""
    GROW = "grow"
    """No spare left for a lost node, and the job may grow its Slurm allocation
    (``slurm.grow``): ask Slurm for a node, then relaunch as with a spare. If Slurm
    says no, shrink within ``min_nodes`` or ask a person."""
    FALLBACK = "fallback"
    """Not a strategy's answer: the relaunch found the newest checkpoints untrustworthy
    and resumed from an older verified one. Recorded on the incident it opens when no
    recovery was under way (class ``storage``, strategy ``verified_checkpoints_only``)."""


class Decision(BaseModel):
    action: Action
    reason: str
    backoff_s: float = 0.0
    strategy: str = ""
    """The ladder rung (or guard) that decided: visible in the incident."""


class Phase(StrEnum):
    """The job's state machine. Transitions live in ``workflows.job`` and its
    steps (``recovery_steps``, ``slurm_steps``, ``fleet_steps``, ...)::

    PENDING -> LAUNCHING -> RUNNING -> SUCCEEDED
                 ^  |  ^       |
                 |  |  |       v  a failure, a forced recovery, a straggler swap,
                 |  |  +--- RECOVERING      a Slurm preemption
                 |  |          |  ^
                 |  |          |  +-- LAUNCHING, when a node cannot be reached
                 |  |          +----> PAUSED, when Slurm preempted it (not resubmitted)
                 |  v          v
                 |  NEEDS_OPERATOR  (the playbook escalates, no spare is left,
                 |       |           or ranks would not die)
                 +-------+  (resume or recover, or the fleet had nodes again;
                             too few nodes: stays NEEDS_OPERATOR)

    Every transition the code makes, one per line (``A -> B: why``); the workflow
    checks each phase change against these lines (:data:`TRANSITIONS`), and
    ``tests/unit/test_phases.py`` holds them against the code:

    PENDING -> LAUNCHING: the first turn launches
    PENDING -> PAUSED: a pause before the first launch
    PENDING -> FAILED: the fleet refused the lease, or Slurm the first allocation (no nodes)
    PENDING -> CANCELLED: cancelled (waiting for the first allocation: it is given back)
    LAUNCHING -> RUNNING: the generation launched
    LAUNCHING -> RECOVERING: a node could not be reached during the launch
    LAUNCHING -> NEEDS_OPERATOR: ranks would not die, or a node failed preflight, no spare left
    LAUNCHING -> PAUSED: a pause before the launch
    LAUNCHING -> FAILED: the launch or the preflight failed for good
    LAUNCHING -> CANCELLED: cancelled
    RUNNING -> RECOVERING: a failure, a forced recovery, a straggler swap, a Slurm preemption
    RUNNING -> SUCCEEDED: every rank finished
    RUNNING -> PAUSED: a pause (a just-in-time checkpoint, then a stop)
    RUNNING -> FAILED: supervision failed for good
    RUNNING -> CANCELLED: cancelled
    RECOVERING -> LAUNCHING: recovered (restart, swap, shrink, grow, or a resubmitted allocation)
    RECOVERING -> NEEDS_OPERATOR: the playbook escalates, or no spare is left
    RECOVERING -> PAUSED: Slurm preempted the job and it was not resubmitted
    RECOVERING -> CANCELLED: cancelled
    PAUSED -> LAUNCHING: resume or recover
    PAUSED -> NEEDS_OPERATOR: resumed, but too few nodes are left
    PAUSED -> CANCELLED: cancelled
    NEEDS_OPERATOR -> LAUNCHING: resume or recover, or the fleet had nodes again (no person)
    NEEDS_OPERATOR -> CANCELLED: cancelled

    A forced recovery sent before RUNNING waits for it; one sent while PAUSED or
    NEEDS_OPERATOR acts as a resume that first excludes its node. SUCCEEDED, FAILED
    and CANCELLED are final.
    """

    PENDING = "PENDING"
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    PAUSED = "PAUSED"
    NEEDS_OPERATOR = "NEEDS_OPERATOR"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED)


def drawn_transitions(doc: str) -> dict[tuple[Phase, Phase], str]:
    """The ``A -> B: why`` lines of a docstring, as ``{(A, B): why}``."""
    found: dict[tuple[Phase, Phase], str] = {}
    for line in doc.splitlines():
        match = _TRANSITION_LINE.match(line)
        if match is not None:
            found[(Phase(match["a"]), Phase(match["b"]))] = match["why"]
    return found


_TRANSITION_LINE = re.compile(r"^\s*(?P<a>[A-Z_]+) -> (?P<b>[A-Z_]+): (?P<why>.+)$")

TRANSITIONS: dict[tuple[Phase, Phase], str] = drawn_transitions(Phase.__doc__ or "")
"""Every phase change the code may make, read from :class:`Phase`'s diagram."""


def undrawn_transition(before: Phase, after: Phase) -> str | None:
    """Why ``before -> after`` is not on the diagram, or None when it is (or is no
    change). The workflow logs it; with ``JobInput.strict_phases`` it fails the job,
    so the workflow tests find a transition the diagram misses."""
    if before == after or (before, after) in TRANSITIONS:
        return None
    return f"phase {before.value} -> {after.value} is not drawn on Phase"


class PlannedMove(StrEnum):
    """Incident classes that are not failures: stops the job chose or was told to make.
    The playbook never sees them (they count toward no failure budget)."""

    OPERATOR = "operator"
    """A forced recovery or a drain."""
    STRAGGLER = "straggler"
    """A checkpointed swap off a slow node."""


IncidentClass = FailureClass | PlannedMove
"""An incident's ``class``: a failure class, or one of the planned moves."""

IncidentKind = FailureKind | Literal["checkpoint", "operator", "straggler"]
"""How the incident was found: a supervisor's failure kind (crash, hang, vanished,
node_lost), ``checkpoint`` (the newest checkpoints failed verification while no
recovery was open), ``operator`` (a forced recovery or drain) or ``straggler``."""


class Incident(BaseModel):
    """One failure and what was done about it. ``class`` on the wire, for scripts."""

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True)

    id: int
    generation: int
    kind: IncidentKind
    """crash, hang, vanished or node_lost (a failure the supervisor or the launch found),
    checkpoint (untrusted newest checkpoints), operator (a forced recovery or drain), or
    straggler (a planned swap off a slow node)."""
    failure_class: IncidentClass = Field(alias="class")
    rank: int | None = None
    node: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    evidence: list[str] = Field(default_factory=list)
    collateral_ranks: list[int] = Field(default_factory=list)
    fault_at: float
    detected_at: float
    detection_s: float
    step_at_failure: int | None = None
    resumed_from_step: int | None = None
    steps_lost: int | None = None
    recovery_s: float | None = None
    """Fault to the first step of the new generation; None until that step happens."""
    stopped_at: float | None = None
    """Phase times of the recovery (fault_at, detected_at, then these): where it went."""
    relaunched_at: float | None = None
    first_step_at: float | None = None
    action: Action | Literal[""] = ""
    """What was done; empty only until the decision is made, in the same workflow task."""
    reason: str = ""
    strategy: str = ""
    """The playbook rung or guard that decided (restart_in_place, class_budget, ...)."""
    escalation_hook: str | None = None
    """For escalations with an ``on_escalation`` command: pending, ran, or failed: why."""
    skipped_checkpoints: list[str] = Field(default_factory=list)
    """Newer checkpoints the recovery could not trust (torn, corrupt), with why."""
    fallback_steps: int | None = None
    """What skipping them cost: the newest skipped step minus the step resumed from."""
    timeline: RecoveryTimeline | None = None
    """Where the recovery's time went, phase by phase (fault to first new step)."""
    restart_path: Literal["rejoin", "whole_generation"] | None = None
    """Jobs with ``rejoin``: whether survivors kept their process (``rejoin``) or every
    rank restarted; None for jobs without it, and before the relaunch."""

    @classmethod
    def opened(
        cls,
        *,
        id: int,
        generation: int,
        kind: IncidentKind,
        failure_class: IncidentClass,
        fault_at: float,
        detected_at: float,
        evidence: Sequence[str] = (),
        rank: int | None = None,
        node: str | None = None,
        step_at_failure: int | None = None,
        exit_code: int | None = None,
        signal: str | None = None,
        collateral_ranks: Sequence[int] = (),
    ) -> Incident:
        """A new incident: detection time derived, evidence bounded (it travels in
        every query and continue-as-new)."""
        return cls(
            id=id,
            generation=generation,
            kind=kind,
            failure_class=failure_class,
            rank=rank,
            node=node,
            exit_code=exit_code,
            signal=signal,
            evidence=cap_evidence(list(evidence)),
            collateral_ranks=list(collateral_ranks),
            fault_at=fault_at,
            detected_at=detected_at,
            detection_s=max(0.0, detected_at - fault_at),
            step_at_failure=step_at_failure,
        )

    @classmethod
    def from_failure(cls, failure: FailureReport, *, id: int, generation: int) -> Incident:
        """The incident for a failure the supervisor (or a launch) reported."""
        return cls.opened(
            id=id,
            generation=generation,
            kind=failure.kind,
            failure_class=failure.failure_class,
            rank=failure.rank,
            node=failure.node,
            fault_at=failure.fault_at,
            detected_at=failure.detected_at,
            step_at_failure=failure.step_at_failure,
            exit_code=failure.exit_code,
            signal=failure.signal,
            evidence=failure.evidence,
            collateral_ranks=failure.collateral_ranks,
        )

    def apply(self, decision: Decision) -> None:
        """Record what the playbook (or the straggler cost model) decided, and why."""
        self.action = decision.action
        self.reason = decision.reason
        self.strategy = decision.strategy

    def record_stop(self, at: float, last_step: int | None) -> None:
        """The ranks are stopped: when, and the last step they reached (a rank may have
        stepped past what the supervisor last saw before it noticed the failure)."""
        self.stopped_at = at
        if last_step is not None:
            self.step_at_failure = max(self.step_at_failure or 0, last_step)

    def add_evidence(self, lines: Sequence[str]) -> None:
        self.evidence = cap_evidence([*self.evidence, *lines])


class StragglerRecord(BaseModel):
    """A slow node the supervisor found, and what was done about it."""

    generation: int
    node: str
    rank: int
    slowdown: float
    compute_s: float
    peers_compute_s: float
    slow_since: float
    detected_at: float
    detection_s: float
    action: Action
    """replace_node (checkpointed, then swapped onto a spare) or record (alert only)."""
    reason: str


class PlannedStop(BaseModel):
    """A stop somebody asked for (pause, drain, forced recovery, straggler swap): what
    the just-in-time checkpoint saved and what the stop still cost."""

    reason: str
    requested_at: float
    stopped_at: float
    step_at_stop: int | None = None
    checkpoint_step: int | None = None
    """The just-in-time checkpoint; None when it did not arrive within the bound."""
    checkpoint_s: float | None = None
    """Request to committed checkpoint, in seconds."""
    steps_lost: int | None = None


class QuarantinedNode(BaseModel):
    """A node taken out of service, durably, with why and when."""

    node: str
    reason: str
    at: float
    fenced: bool = False
    """Its stale ranks were confirmed stopped; until then it is never launched on."""


class NodePool(BaseModel):
    """Which nodes run the job, wait as spares, or are out of service.

    Every move of a node between these lists is a method here, pure and unit-tested
    (``tests/unit/test_node_pool.py``); the workflow decides *when* to move. The fields
    are the serialized shape carried by continue-as-new: methods never add fields."""

    active: list[str] = Field(default_factory=list)
    """Nodes of the current generation, in rank order (the first hosts MASTER_ADDR)."""
    spares: list[str] = Field(default_factory=list)
    quarantined: list[QuarantinedNode] = Field(default_factory=list)

    def quarantine(self, node: str, reason: str, at: float) -> None:
        if node in self.active:
            self.active.remove(node)
        if node in self.spares:
            self.spares.remove(node)
        self.quarantined = [q for q in self.quarantined if q.node != node]
        self.quarantined.append(QuarantinedNode(node=node, reason=reason, at=at))

    def replace(self, node: str, reason: str, at: float) -> str | None:
        """Quarantine the active ``node`` and move the first spare into its rank slot,
        so every other rank keeps its number. Returns that spare; None when none was
        left: the node is out all the same, and the pool is one node short."""
        slot = self.active.index(node)
        self.quarantine(node, reason, at)
        if not self.spares:
            return None
        spare = self.spares.pop(0)
        self.active.insert(slot, spare)
        return spare

    def shrink(self, node: str, reason: str, at: float, min_nodes: int | None) -> bool:
        """Quarantine ``node`` with no spare to take its place. True when the job may go
        on without it: the spec allows fewer nodes (``min_nodes``) and at least one is
        left. False: the node is out all the same, and a person must return one."""
        self.quarantine(node, reason, at)
        return min_nodes is not None and len(self.active) >= min_nodes and bool(self.active)

    def swap_out(self, node: str, reason: str, at: float, min_nodes: int | None) -> bool:
        """Quarantine ``node`` and put a spare in its rank slot, or shrink when the spec
        allows. False when neither is possible: the node is out all the same, and the
        job needs an operator."""
        if node not in self.active:
            # Not running this job (a spare, or already out): nothing to replace, and
            # appending a spare would grow the world.
            self.quarantine(node, reason, at)
            return True
        if self.spares:
            self.replace(node, reason, at)
            return True
        return self.shrink(node, reason, at, min_nodes)

    def refill(self, size: int) -> list[str]:
        """Spares fill the slots lost to quarantine, up to ``size`` active nodes (the
        spec's node count); returns the nodes moved, in order."""
        moved = []
        while len(self.active) < size and self.spares:
            moved.append(self.spares.pop(0))
            self.active.append(moved[-1])
        return moved

    def release(self, node: str) -> None:
        """Take a fenced node out of quarantine into the spares (``lazarus return``)."""
        self.quarantined = [q for q in self.quarantined if q.node != node]
        if node not in self.spares:
            self.spares.append(node)

    def unfenced(self) -> list[str]:
        return [q.node for q in self.quarantined if not q.fenced]

    def mark_fenced(self, node: str) -> None:
        """A quarantined node a stop has just reached and found empty."""
        for quarantined in self.quarantined:
            if quarantined.node == node:
                quarantined.fenced = True

    def forget(self, nodes: list[str]) -> None:
        """Quarantined nodes handed back to the fleet are no longer the job's."""
        self.quarantined = [q for q in self.quarantined if q.node not in nodes]

    def held(self) -> set[str]:
        """Every node the job holds: training, spare or quarantined."""
        return {*self.active, *self.spares, *(q.node for q in self.quarantined)}


class IgnoredMessage(BaseModel):
    """An operator message the job did not act on, and why: it has no later effect."""

    name: str
    at: float
    phase: Phase
    reason: str


class ForceRecover(BaseModel):
    reason: str = "forced by operator"
    exclude_node: str | None = None
    """Quarantine this node and relaunch without it (a spare takes its place)."""
    checkpoint_first: bool = False
    """Ask the ranks for a just-in-time checkpoint before stopping them."""


class NodeRequest(BaseModel):
    """``drain`` and ``return`` name one node of the job."""

    node: str
    reason: str = ""


class JobStatus(BaseModel):
    """What ``status`` returns: enough for a person or a script to know where the job is."""

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True)

    job_id: str
    phase: Phase
    generation: int
    step: int | None
    world_size: int
    ranks: list[RankStatus]
    restarts: int
    max_restarts: int
    incidents: list[Incident]
    ettr: float | None
    """Effective training time ratio so far: productive time over wall time."""
    elapsed_s: float
    operator_reason: str | None = None
    suggested_actions: list[str] = Field(default_factory=list)
    resume_step: int | None = None
    runs: int = 1
    nodes: NodePool = Field(default_factory=NodePool)
    mttr_s: float | None = None
    """Mean time to recover over the incidents that have recovered."""
    steps_lost: int = 0
    checkpoint_dir: str = ""
    """Where the ranks write checkpoints (fast, node-local or shared storage)."""
    durable_checkpoint_uri: str | None = None
    """Where committed checkpoints are tiered to (``s3://bucket/prefix``), if anywhere."""
    stragglers: list[StragglerRecord] = Field(default_factory=list)
    planned_stops: list[PlannedStop] = Field(default_factory=list)
    durable_steps: list[int] = Field(default_factory=list)
    """Checkpoints whose durable copy is uploaded and verified (newest last)."""
    incidents_dropped: int = 0
    """Older incidents not listed in ``incidents`` (counted by class in ``dropped_by_class``)."""
    dropped_by_class: dict[str, int] = Field(default_factory=dict)
    ignored_messages: list[IgnoredMessage] = Field(default_factory=list)
    retired_steps: list[int] = Field(default_factory=list)
    progress_signal: str | None = None
    """heartbeat, log, or none: with none, hang detection is off (crashes only)."""
    run_dir: str | None = None
    """This start's run directory (generations, logs, exit files)."""
    slurm_job_id: int | None = None
    """The Slurm allocation the job runs in now (it changes on a resubmission)."""
    fleet: str | None = None
    """The fleet the job leased its nodes from, if any."""
    fleet_notes: list[str] = Field(default_factory=list)
    checkpoint_interval: CheckpointIntervalView | None = None
    """``checkpoints.interval: auto``: the Young-Daly tuning (δ, M, τ, the interval sent,
    the expected goodput loss); None for a fixed interval."""
    host_task_queue: str | None = None
    """Where a local job's machine-bound activities run: its host's task queue."""
    cleanup_unreached: list[str] = Field(default_factory=list)
    """Nodes the end-of-run cleanup could not reach: the run's zygotes and memory-tier
    snapshots may remain there."""
