"""The job's durable state: what the workflow knows, queries return, and continue-as-new carries.

Everything here is plain data so that a new run, started by continue-as-new, can
rebuild the job exactly and adopt the ranks that are still alive.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from lazarus.domain.checkpoint_interval import CheckpointIntervalView
from lazarus.domain.contracts import (
    CheckpointRef,
    EscalationHookRequest,
    RankStatus,
    VerifiedCheckpoint,
)
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.job_view import (
    TRANSITIONS,
    Action,
    Decision,
    ForceRecover,
    IgnoredMessage,
    Incident,
    IncidentClass,
    IncidentKind,
    JobStatus,
    NodePool,
    NodeRequest,
    Phase,
    PlannedMove,
    PlannedStop,
    QuarantinedNode,
    StragglerRecord,
    drawn_transitions,
    undrawn_transition,
)
from lazarus.domain.spec import FleetLeaseSpec, JobSpec, NodeSpec, SlurmSpec
from lazarus.domain.timeline import RetiredCheckpoint, TimelineCut, with_bound, with_cut
from workflows.playbook import PastFailure

# The job's public view lives in lazarus/domain/job_view.py (issue 40) and is
# re-exported here: the workflow's modules import it from its state, unchanged.
__all__ = [
    "MAX_INCIDENTS",
    "MAX_RECORDS",
    "TRANSITIONS",
    "Action",
    "Decision",
    "DroppedIncidentTotals",
    "ForceRecover",
    "IgnoredMessage",
    "Incident",
    "IncidentClass",
    "IncidentKind",
    "JobInput",
    "JobState",
    "JobStatus",
    "NodePool",
    "NodeRequest",
    "NodeRoster",
    "Phase",
    "PlannedMove",
    "PlannedStop",
    "QuarantinedNode",
    "StragglerRecord",
    "drawn_transitions",
    "undrawn_transition",
]

MAX_INCIDENTS = 50
"""Incidents kept in full in the state (and so in every query and continue-as-new);
older ones are counted by class. Bounds the state far below Temporal's payload limit."""
MAX_RECORDS = 50
"""The same bound for planned stops, stragglers and ignored messages."""


class DroppedIncidentTotals(BaseModel):
    """What the incidents dropped from the bounded list cost, so that a long job's
    ETTR, MTTR and steps lost keep counting them. Before, a job past
    :data:`MAX_INCIDENTS` incidents forgot the cost of the oldest: the simulator's
    54-day job reported an ETTR of 99% against the 89% it had."""

    recoveries: int = 0
    """Dropped incidents that recovered (had a first step)."""
    recovery_s: float = 0.0
    """Their fault-to-first-step seconds, summed."""
    steps_lost: int = 0
    redone_s: float = 0.0
    """Their steps lost at the seconds per step measured when they were dropped."""

    def add(self, incident: Incident, seconds_per_step: float) -> None:
        if incident.recovery_s is not None:
            self.recoveries += 1
            self.recovery_s += incident.recovery_s
        lost = incident.steps_lost or 0
        self.steps_lost += lost
        self.redone_s += lost * seconds_per_step


class NodeRoster(BaseModel):
    """Where the job runs at runtime, apart from its spec: the node lists and the
    settings that name them (the Slurm allocation granted, the fleet's lease)."""

    nodes: list[NodeSpec]
    spares: list[NodeSpec] = Field(default_factory=list)
    slurm: SlurmSpec | None = None
    fleet: FleetLeaseSpec | None = None

    @classmethod
    def of(cls, spec: JobSpec) -> NodeRoster:
        return cls(nodes=spec.nodes, spares=spec.spares, slurm=spec.slurm, fleet=spec.fleet)

    def applied_to(self, intent: JobSpec) -> JobSpec:
        """The job as it runs: its intent, on these nodes."""
        return intent.model_copy(
            update={
                "nodes": self.nodes,
                "spares": self.spares,
                "slurm": self.slurm,
                "fleet": self.fleet,
            }
        )


class JobState(BaseModel):
    """Carried across continue-as-new; the workflow's only memory."""

    phase: Phase = Phase.PENDING
    generation: int = 0
    """The newest generation launched; 0 before the first launch."""
    generation_live: bool = False
    """True while ranks of ``generation`` may be running (adopt them after continue-as-new)."""
    step: int | None = None
    seconds_per_step: float | None = None
    restarts: int = 0
    restart_times: list[float] = Field(default_factory=list)
    """Workflow time of each automatic restart, for the budget window."""
    consecutive_failures: int = 0
    incidents: list[Incident] = Field(default_factory=list)
    open_incident: int | None = None
    """Id of the incident whose recovery has not yet produced a first step."""
    resume: CheckpointRef | None = None
    ranks: list[RankStatus] = Field(default_factory=list)
    started_at: float = 0.0
    finished_at: float | None = None
    operator_reason: str | None = None
    waits_for_node: bool = False
    """NEEDS_OPERATOR only for want of nodes (no spare left, or a resume that found too
    few): a fleet job then resumes by itself once its fleet has a node. False for any
    other escalation (a spent budget, a crash loop, ranks that would not die), which
    waits for a person, and in state from before it was kept (issue 26)."""
    runs: int = 1
    """How many workflow runs (continue-as-new hops) this job has used."""
    pool: NodePool = Field(default_factory=NodePool)
    stragglers: list[StragglerRecord] = Field(default_factory=list)
    planned_stops: list[PlannedStop] = Field(default_factory=list)
    noted_stragglers: list[str] = Field(default_factory=list)
    stopped_generation: int | None = None
    """The generation a recovery has just stopped completely: the relaunch's fence
    stop would find nothing of it alive, so the fast path skips it."""
    verified_checkpoints: list[VerifiedCheckpoint] = Field(default_factory=list)
    """Checkpoints verified in full when the housekeeping watch first saw them (newest
    last, bounded): a relaunch re-checks them by sizes and mtimes only."""
    """Nodes reported slow in this generation and left running (not reported again)."""
    checkpoint_requests: int = 0
    """Just-in-time checkpoint requests so far: each request's id."""
    housekept_step: int | None = None
    """The newest checkpoint handed to tiering and garbage collection."""
    durable_steps: list[int] = Field(default_factory=list)
    """Checkpoints whose durable copy was uploaded and verified (newest last)."""
    escalations: int = 0
    """Escalations to NEEDS_OPERATOR so far: numbers each ``on_escalation`` run."""
    rollback_pending: bool = False
    """The next launch must first retire the newest checkpoint (numerical rollback)."""
    rollback_below: int | None = None
    """A rollback's bound, durable from the moment it is decided (the failure's step)
    and tightened when the rollback retires a checkpoint (its step): every search
    stays below it, without the memory tier, until a launch records its cut. A
    relaunch sent back by the preflight, then made by a ``resume`` or a fleet's
    re-ask, still goes back (issue 37, the audit's N1)."""
    run_key: str | None = None
    """This start's own run directory under ``<run_dir>/<job_id>/``, kept across
    continue-as-new; None for jobs started before runs had their own directory (they
    keep the legacy ``<run_dir>/<job_id>`` so that an upgraded worker adopts their ranks)."""
    retired_steps: list[int] = Field(default_factory=list)
    """Steps retired by number: rollbacks recorded before checkpoints were retired by
    identity, or whose manifest named no generation. Never resumed from again, from
    any tier, whatever a later relaunch or an operator's resume does."""
    retired: list[RetiredCheckpoint] = Field(default_factory=list)
    """Checkpoints retired by a numerical rollback, by identity (step, and the
    generation that wrote it): no copy of them is resumed from again, while a later
    generation's fresh checkpoint of the same step is (N10)."""
    timeline_cuts: list[TimelineCut] = Field(default_factory=list)
    """Where relaunches resumed (:mod:`lazarus.domain.timeline`): the checkpoint search
    never resumes a snapshot these cuts abandon (the timeline a rollback or a fallback
    left), and they travel across continue-as-new like the retired steps."""
    incidents_dropped: int = 0
    """Incidents older than the newest ``MAX_INCIDENTS``, no longer kept in full."""
    dropped_by_class: dict[str, int] = Field(default_factory=dict)
    """How many of the dropped incidents each class had: the long tail, aggregated."""
    dropped_totals: DroppedIncidentTotals = Field(default_factory=DroppedIncidentTotals)
    ignored_messages: list[IgnoredMessage] = Field(default_factory=list)
    """Operator messages that made no sense when they arrived (newest last, bounded)."""
    pending_hooks: list[EscalationHookRequest] = Field(default_factory=list)
    """Escalation hooks not yet delivered: carried across continue-as-new and delivered
    again by the next run (the hook's marker file makes a repeat a no-op)."""
    checkpoint_interval: CheckpointIntervalView | None = None
    """``checkpoints.interval: auto``: δ, M, τ and the interval sent (None otherwise)."""
    progress_signal: str | None = None
    """How the supervisor sees progress: heartbeat, log, or none (hang detection off)."""
    stuck_ranks: str | None = None
    """Set when a stop met ranks that survived SIGKILL: the next launch escalates."""
    rejoin_ranks: list[int] = Field(default_factory=list)
    """Ranks the next launch carries over from the current generation (``rejoin``)."""
    rejoining: list[int] = Field(default_factory=list)
    """Ranks the running generation carried over: supervision gives each
    ``rejoin.timeout_s`` to act for it."""
    fleet_notes: list[str] = Field(default_factory=list)
    """What the job's fleet (``spec.fleet``) leased, replaced or refused, or that it did
    not answer (newest last, bounded)."""
    handed_back: list[str] = Field(default_factory=list)
    """Quarantined nodes the job gave back to its fleet while running (newest last,
    bounded): ``lazarus return`` names the fleet for them."""
    host_task_queue: str | None = None
    """A local job's host queue, ``<task_queue>@<host>``: its machine-bound activities
    go there (``workflows/routing.py``). None: any worker (ssh, Slurm, not known yet)."""
    touched_nodes: list[str] = Field(default_factory=list)
    """Every node a stop of this job has targeted (in the order first stopped), kept after the node
    leaves the pool: a node that ran a generation was stopped at least once while it
    held the job's ranks, and may still hold its zygote and memory-tier snapshots
    after it is fenced, returned or handed back. The end-of-run stop revisits them all
    (issue 26). Bounded by the nodes the job ever knew."""
    cleanup_unreached: list[str] = Field(default_factory=list)
    """Nodes the end-of-run cleanup could not reach: this run's zygote and memory-tier
    snapshots may still be there (a host that comes back, or a person, removes them)."""
    roster: NodeRoster | None = None
    """The nodes the job runs on once they differ from its spec (leased, granted, grown,
    or the fleet's spares); None: the spec's. The spec itself is intent, never
    rewritten (``run_context.JobRun.spec`` joins the two). Histories from before it
    carried these in the spec they continued as new with, and still do."""

    # Incident bookkeeping: pure, unit-tested in tests/unit/test_incidents.py. Ids keep
    # counting past the incidents dropped from the bounded list.

    @property
    def next_incident_id(self) -> int:
        return self.incidents_dropped + len(self.incidents) + 1

    def incident(self, incident_id: int | None) -> Incident | None:
        """An incident still kept in full, by id; None for None or a dropped one."""
        if incident_id is None:
            return None
        index = incident_id - self.incidents_dropped - 1
        return self.incidents[index] if 0 <= index < len(self.incidents) else None

    @property
    def current_incident(self) -> Incident | None:
        """The open incident: its recovery has not yet produced a first step."""
        return self.incident(self.open_incident)

    def add_incident(self, incident: Incident) -> Incident:
        """Make ``incident`` the open one. An incident still open failed again before
        its first step: it never recovered, and says so. The list stays bounded: the
        oldest are dropped, counted by class."""
        previous = self.current_incident
        if previous is not None:
            previous.reason += " (superseded: failed again before the first step)"
        self.incidents.append(incident)
        self.open_incident = incident.id
        while len(self.incidents) > MAX_INCIDENTS:
            dropped = self.incidents.pop(0)
            self.incidents_dropped += 1
            counts = self.dropped_by_class
            key = dropped.failure_class.value
            counts[key] = counts.get(key, 0) + 1
            self.dropped_totals.add(dropped, self.seconds_per_step or 0.0)
        return incident

    def open_incident_now(
        self,
        kind: IncidentKind,
        failure_class: IncidentClass,
        now: float,
        *,
        action: Action,
        reason: str,
        strategy: str = "",
        evidence: Sequence[str] = (),
    ) -> Incident:
        """Open an incident the workflow itself finds at ``now`` (a forced recovery, an
        untrusted newest checkpoint), with what it does about it: nothing failed
        earlier, so the fault and its detection are the same moment."""
        incident = self.add_incident(
            Incident.opened(
                id=self.next_incident_id,
                generation=self.generation,
                kind=kind,
                failure_class=failure_class,
                fault_at=now,
                detected_at=now,
                step_at_failure=self.step,
                evidence=evidence,
            )
        )
        incident.action = action
        incident.reason = reason
        incident.strategy = strategy
        return incident

    def cut_timeline(self, resume: CheckpointRef | None) -> None:
        """The next generation resumes from ``resume`` (None: from scratch): record
        the cut, so nothing written above it by an older generation is resumed again.
        A rollback's bound is spent here: the cut now holds it."""
        self.timeline_cuts = with_cut(
            self.timeline_cuts, self.generation + 1, resume.step if resume else 0
        )
        self.rollback_below = None

    def count_restart(self, action: Action, step_at_failure: int | None, now: float) -> None:
        """A recovery decided to relaunch by ``action``: count the restart, and record a
        rollback as decided (pending, and bounded below the failure's step): whatever
        happens before the launch, the job goes back."""
        self.restarts += 1
        self.restart_times.append(now)
        self.rollback_pending = action == Action.ROLLBACK
        if self.rollback_pending and step_at_failure is not None:
            self.bound_rollback(step_at_failure)

    def bound_rollback(self, below: int) -> None:
        """The job has decided to go back below step ``below`` (a numerical rollback):
        recorded at once, as the bound every search keeps until a launch and as a cut
        for the next generation, so no later path (a preflight that escalates, an
        operator's ``resume``, a fleet's re-ask) can resume the timeline it leaves."""
        self.rollback_below = (
            below if self.rollback_below is None else min(self.rollback_below, below)
        )
        self.timeline_cuts = with_bound(
            self.timeline_cuts, self.generation + 1, max(0, self.rollback_below - 1)
        )

    @property
    def retired_step_numbers(self) -> list[int]:
        """Every retired step, by number or by identity: what ``status`` shows."""
        return sorted({*self.retired_steps, *(r.step for r in self.retired)})

    def account_resume(self, resume: CheckpointRef | None) -> None:
        """Fill in what the open incident cost in steps, now that the resume point is known."""
        incident = self.current_incident
        if incident is None:
            return
        resumed = resume.step if resume else 0
        incident.resumed_from_step = resumed
        if incident.step_at_failure is not None:
            incident.steps_lost = max(0, incident.step_at_failure - resumed)

    def close_incident(self, first_step_at: float) -> None:
        """The new generation made its first step: the open incident has recovered, and
        failures count from zero again."""
        incident = self.current_incident
        if incident is not None:
            incident.recovery_s = max(0.0, first_step_at - incident.fault_at)
            incident.first_step_at = first_step_at
            self.open_incident = None
        self.consecutive_failures = 0

    def remember_verified(self, checkpoint: VerifiedCheckpoint, keep: int) -> None:
        """Keep ``checkpoint``'s stamps for relaunches: one record per step (a re-save
        replaces it), the newest ``keep`` steps."""
        kept = [v for v in self.verified_checkpoints if v.step != checkpoint.step]
        kept.append(checkpoint)
        self.verified_checkpoints = sorted(kept, key=lambda v: v.step)[-max(1, keep) :]

    def past_failures(self) -> list[PastFailure]:
        """Earlier incidents as the playbook weighs them: failures only, not the planned
        moves (forced recoveries, straggler swaps)."""
        return [
            PastFailure(
                failure_class=i.failure_class, at=i.detected_at, node=i.node, step=i.step_at_failure
            )
            for i in self.incidents
            if isinstance(i.failure_class, FailureClass)
        ]


class JobInput(BaseModel):
    spec: JobSpec
    state: JobState | None = None
    continue_as_new_after_events: int = 10_000
    """Hop to a new run past this many history events, or when Temporal suggests it."""
    strict_phases: bool = False
    """Fail the job on a phase change not drawn on :class:`Phase` (the workflow tests
    set it; in production such a change is only logged). In the input, so in the
    history: every worker replays a run alike. It was an environment variable the
    workflow read, which two workers could disagree on (issue 37, N12)."""
