"""Typed inputs and outputs of every activity: the only shapes that cross into history.

Workflows import this module (passed through the sandbox), so it must stay free of
I/O and heavy imports. Times are Unix seconds as measured on the worker, because
they describe the ranks' world, not workflow time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lazarus.domain.compact_form import CompactForm
from lazarus.domain.evidence import cap_evidence
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.process_groups import UnkillableGroup
from lazarus.domain.spec import (
    CheckpointsSpec,
    HealthSpec,
    JobSpec,
    NodeSpec,
    PreflightSpec,
    SlurmSpec,
    SSHSpec,
    StragglerSpec,
)
from lazarus.domain.timeline import RetiredCheckpoint, TimelineCut, off_timeline_reason


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeAccess(_Model):
    """Which nodes an activity works on and how to reach them: the node list, the ssh
    settings for its ssh nodes and the Slurm allocation its Slurm nodes live in.

    One shape instead of three fields repeated in every request that touches nodes:
    a new transport setting is added here once, and
    :func:`activities.nodes.factory.agents` opens agents from it alone."""

    nodes: list[NodeSpec] = Field(default_factory=list)
    """In rank order where ranks run; what empty means is the request's to say
    (usually: this machine only, see :meth:`or_this_machine`)."""
    ssh: SSHSpec = Field(default_factory=SSHSpec)
    slurm: SlurmSpec | None = None
    """The job's allocation (``spec.slurm``): Slurm nodes need it to start a step, run
    a preflight or reach node-local state."""

    @classmethod
    def of(cls, spec: JobSpec, nodes: Sequence[NodeSpec] | None = None) -> NodeAccess:
        """``nodes`` (default: ``spec.nodes``) reached the way ``spec`` says. Pass the
        nodes in use, not the spec's: the pool's active nodes differ after a swap."""
        return cls(
            nodes=list(spec.nodes if nodes is None else nodes), ssh=spec.ssh, slurm=spec.slurm
        )

    def with_nodes(self, nodes: Sequence[NodeSpec]) -> NodeAccess:
        """Other nodes of the same job (a subset: the reachable ones, the lost ones),
        reached the same way."""
        return self.model_copy(update={"nodes": list(nodes)})

    def or_this_machine(self) -> NodeAccess:
        """No nodes named means this machine, as one default local node."""
        return self if self.nodes else self.with_nodes([NodeSpec()])


class _OnNodes(_Model):
    """A request that reaches nodes: it carries one :class:`NodeAccess`.

    Requests recorded before ``access`` existed wrote ``nodes`` (or another name,
    :attr:`_legacy_nodes`), ``ssh`` and ``slurm`` side by side, and an activity an
    old worker scheduled may run on a new one: those fields are still read, folded
    into ``access``, and never written."""

    _legacy_nodes: ClassVar[str] = "nodes"

    access: NodeAccess = Field(default_factory=NodeAccess)

    @model_validator(mode="before")
    @classmethod
    def _fold_legacy_access(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "access" in data:
            return data  # both forms at once is refused below (extra fields)
        legacy = {cls._legacy_nodes: "nodes", "ssh": "ssh", "slurm": "slurm"}
        if not legacy.keys() & data.keys():
            return data
        folded = {k: v for k, v in data.items() if k not in legacy}
        folded["access"] = {new: data[old] for old, new in legacy.items() if old in data}
        return folded


class FileStamp(_Model):
    """One checkpoint file as verified: enough to tell, without reading it again,
    whether it is still the file that was hashed."""

    size: int
    mtime_ns: int


class VerifiedCheckpoint(_Model):
    """A checkpoint the controller has verified in full (every sha256), once, when it
    first saw it committed. At relaunch only sizes and mtimes are compared against
    these stamps; only what was never verified is hashed again."""

    step: int
    path: str
    files: dict[str, FileStamp] = Field(default_factory=dict)
    verified_at: float


class CheckpointRef(_Model):
    step: int
    path: str
    verified: VerifiedCheckpoint | None = None
    """Set by the housekeeping watch when it verified this checkpoint in full."""
    generation: int | None = None
    """The generation whose ranks wrote it, from its manifest, where the activity
    read it (a rollback's retired checkpoints: they are retired by identity); None:
    not read, or not recorded."""


class RankProcess(_Model):
    """One launched rank. ``start_ticks`` guards against pid reuse."""

    rank: int
    node: str = "local"
    pid: int
    pgid: int
    start_ticks: int
    log_file: str


class LaunchRequest(_Model):
    spec: JobSpec
    generation: int = Field(ge=1)
    resume: CheckpointRef | None = None
    nodes: list[NodeSpec] | None = None
    """The node set of this generation, in rank order; None means ``spec.nodes``."""
    run_root: str | None = None
    """This workflow run's directory, ``<run_dir>/<job_id>/<run_key>``: generations live
    under it, so a job started again never sees an earlier run's files. None: the
    legacy ``<run_dir>/<job_id>`` (jobs started before run directories existed)."""
    rejoin_ranks: list[int] = Field(default_factory=list)
    """Ranks of the newest older generation that keep their process and rejoin this
    one (``rejoin`` in the spec): they are carried over, not started, when still
    alive; any that is not is started like the others."""
    prewarm: list[NodeSpec] = Field(default_factory=list)
    """Spares of the pool that run no rank (``workflows.placement.prewarm_nodes``):
    with ``warm_start``, each gets the run's zygote started beside the launch, not
    waited for, so a relaunch onto it after a node loss forks its ranks warm. Empty
    without ``warm_start``, and in requests recorded before spares were prewarmed."""


class WarmStartOutcome(_Model):
    """Which ranks a launch forked from a node's zygote (warm) and which it started
    cold, and why: a zygote that died or a preload that failed falls back to cold
    starts, and the incident says so."""

    warm_ranks: list[int] = Field(default_factory=list)
    cold_ranks: list[int] = Field(default_factory=list)
    from_standby: int = 0
    """Warm ranks handed to an idle pre-forked process (no fork on the critical path)."""
    fallback_reasons: list[str] = Field(default_factory=list)
    """Per node that fell back cold: ``"<node>: <reason>"``."""
    prewarmed: list[str] = Field(default_factory=list)
    """Spares whose zygote this launch started, or found running (``LaunchRequest.prewarm``)."""
    not_prewarmed: list[str] = Field(default_factory=list)
    """Per spare whose zygote could not be started: ``"<node>: <reason>"``. Its first
    launch starts the zygote itself then (and waits for it), or starts cold."""

    def summary(self) -> str:
        """One line for the incident's evidence: how the relaunch started its ranks."""
        line = f"warm start: {len(self.warm_ranks)} warm ({self.from_standby} from standby)"
        line += f", {len(self.cold_ranks)} cold"
        if self.fallback_reasons:
            line += ": " + "; ".join(self.fallback_reasons)
        if self.prewarmed:
            line += f"; spares prewarmed: {', '.join(self.prewarmed)}"
        if self.not_prewarmed:
            line += "; spares not prewarmed: " + "; ".join(self.not_prewarmed)
        return line


class LaunchResult(_Model):
    generation: int
    master_addr: str
    master_port: int
    run_dir: str
    ranks: list[RankProcess]
    launched_at: float
    adopted: bool
    """True when this call found the generation already launched (a retry) and adopted it."""
    ranks_started_at: float | None = None
    """When the last rank's process started (its pid file): the recovery timeline's
    "rank process started" for scripts without the rank helper."""
    warm_start: WarmStartOutcome | None = None
    """How the ranks were started when ``warm_start`` is on (None: it is off)."""
    rejoined: list[int] = Field(default_factory=list)
    """Ranks carried over from the previous generation in their own process."""
    rejoin_refused: list[str] = Field(default_factory=list)
    """Why asked-for ranks were started afresh instead (``"rank 1: exited"``)."""
    host: str | None = None
    """The launching worker's host, for jobs of local nodes (their ranks live there):
    the job routes its machine-bound activities to that host's task queue. None for
    ssh and Slurm nodes, and from workers older than host routing."""


class StopRequest(_OnNodes):
    job_id: str
    run_root: str
    """The job's run directory; every generation below it is considered."""
    keep_generation: int | None = None
    """Stop every generation except this one. ``None`` stops them all."""
    grace_s: float = 10.0
    reason: str = ""
    access: NodeAccess = Field(default_factory=NodeAccess)
    """Every node that may hold ranks of this job; no nodes means this machine only."""
    kill_wait_s: float = Field(default=10.0, ge=0)
    """After SIGKILL, how long to wait for a group to die before reporting it in
    ``StopResult.unkillable`` (instead of failing, and being retried, forever)."""
    kill_at_once: bool = False
    """SIGKILL without a grace period: the survivors of a crashed generation are
    stuck in a collective with a dead peer and cannot checkpoint; waiting only delays
    the restart. Planned stops keep the grace (they checkpoint first)."""
    skip_nodes: list[str] = Field(default_factory=list)
    """Nodes declared dead: not contacted (no log fetch, no stop), so a recovery
    never waits on a host that cannot answer. They stay quarantined and unfenced, and
    are fenced later like any node that comes back."""
    end_of_run: bool = False
    """The run is ending (finished, cancelled, failed): also stop each node's zygote
    and remove the run's memory-tier snapshots."""
    undrain: bool = False
    """The nodes are being returned to the pool (``lazarus return``): Slurm nodes are
    also given back to Slurm's scheduling (``scontrol update state=resume``), where
    the rights allow; a refusal is logged, never fatal."""


class StopResult(_Model):
    generations: list[int]
    signalled_groups: int
    killed_groups: int
    """Groups that ignored SIGTERM for the grace period and needed SIGKILL."""
    last_step: int | None = None
    """The newest step any stopped rank reported: what a forced stop costs, in steps."""
    unreachable: list[str] = Field(default_factory=list)
    """Nodes that could not be reached: whatever runs there is not yet fenced."""
    unkillable: list[UnkillableGroup] = Field(default_factory=list)
    """Groups that survived SIGKILL for ``kill_wait_s``: their nodes are not fenced
    (quarantine them and escalate, naming the pids)."""


class RankStatus(_Model):
    rank: int
    node: str = "local"
    pid: int
    alive: bool
    stopped_by_signal: bool = False
    """The process is in state T (SIGSTOP or a debugger): a hang we can name for sure."""
    exit_code: int | None = None
    signal: str | None = None
    ended_at: float | None = None
    step: int | None = None
    last_progress_at: float | None = None
    compute_s: float | None = None
    """The rank's own work per step (``lazarus.rank.compute_timer``), from its last heartbeat."""
    generation: int | None = None
    """The generation the rank's last heartbeat says it acts for (None: it does not say)."""


FailureKind = Literal["crash", "hang", "vanished", "node_lost", "preempted"]

HangBudgetSource = Literal["learned", "learning", "pinned", "off"]
"""Where a hang budget came from: ``learned`` from the job's own progress intervals,
``learning`` (too few seen yet: ``hang_timeout_s`` applies), ``pinned`` by the spec,
``off`` (``hang_budget.mode: off``: ``hang_timeout_s`` only)."""


class HangBudget(_Model):
    """How long a live rank outside a slow phase may now go without progress, and
    what that was learned from (``health.hang_budget``; issue 38). Shown by ``lazarus
    status`` and carried by a hang's report, so a person can see why it was called."""

    budget_s: float
    source: HangBudgetSource
    quantile: float
    """The quantile of the intervals the budget is a multiple of (0.99: p99)."""
    quantile_s: float | None = None
    """That quantile of the recent intervals between progress marks; None before any."""
    longest_recent_s: float | None = None
    """The longest interval of the last few minutes: the budget stays above it."""
    intervals_seen: int = 0
    """Progress intervals learned so far (this supervision), warm-ups and slow phases left out."""
    backoff_floor_s: float | None = None
    """Twice the budget of a hang the learned budget declared in this job within the
    hour: the least this budget may be (a false alarm must not repeat every generation)."""
    log_floor_s: float | None = None
    """``hang_budget.log_floor_s``, when it is the floor: progress comes from
    ``progress_regex`` lines alone, and such a script cannot declare a slow phase."""

    def describe(self) -> str:
        """One line: ``2.40 s learned (p99 0.6 s, longest 0.68 s, 240 intervals)``."""
        head = f"{self.budget_s:.2f} s {self.source}"
        if self.source in ("pinned", "off"):
            return head
        quantile = f"p{self.quantile * 100:g}"
        parts = []
        if self.quantile_s is not None:
            parts.append(f"{quantile} {self.quantile_s:.3g} s")
        if self.longest_recent_s is not None:
            parts.append(f"longest {self.longest_recent_s:.3g} s")
        if self.backoff_floor_s is not None:
            parts.append(f"at least {self.backoff_floor_s:.3g} s after a hang")
        if self.log_floor_s is not None:
            parts.append(f"floor {self.log_floor_s:.3g} s for log progress")
        parts.append(f"{self.intervals_seen} intervals")
        return f"{head} ({', '.join(parts)})"


class FailureReport(_Model):
    kind: FailureKind
    failure_class: FailureClass
    """A class of the failure taxonomy (see ``lazarus.domain.failure_classes``)."""
    rank: int
    node: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    evidence: list[str] = Field(default_factory=list)
    fault_at: float
    detected_at: float
    step_at_failure: int | None = None
    collateral_ranks: list[int] = Field(default_factory=list)
    """Ranks that died after the root cause, in the same collective: not separate incidents."""
    hang_budget: HangBudget | None = None
    """With ``hang``: the budget the culprit's silence was judged against."""
    slow_phase: str | None = None
    """With ``hang``: the slow phase the culprit had declared (``checkpoint_save``, ...),
    whose own budget it spent; None outside one."""

    @field_validator("evidence")
    @classmethod
    def _bounded(cls, lines: list[str]) -> list[str]:
        """Evidence is bounded where it is made: it travels in history and state."""
        return cap_evidence(lines)


class SuperviseRequest(_OnNodes):
    job_id: str
    generation: int
    run_dir: str
    world_size: int
    health: HealthSpec
    resume_step: int | None = None
    report_first_step: bool = False
    """Return as soon as the generation makes its first step (it closes a recovery)."""
    report_after_s: float = 300.0
    """Return with a progress report after this long even if nothing happened."""
    access: NodeAccess = Field(default_factory=NodeAccess)
    """The generation's nodes in rank order; no nodes means one local node."""
    nproc_per_node: int = 1
    node_timeout_s: float = 15.0
    preempt_marker: str | None = None
    """With ``access.slurm``: the file the allocation's holder writes when Slurm signals it
    (``--signal=B:USR1@<s>``: preemption or the time limit is near). Its appearance,
    or the allocation leaving RUNNING, ends supervision with a ``preempted`` outcome."""
    preempt_handled_at: float | None = None
    """The notice (the marker's time) the workflow already handled: not reported again."""
    straggler: StragglerSpec = Field(default_factory=StragglerSpec)
    known_stragglers: list[str] = Field(default_factory=list)
    """Nodes already reported as slow in this generation: not reported again."""
    rejoining: list[int] = Field(default_factory=list)
    """Ranks carried over from the previous generation (``rejoin``): one that has not
    written a heartbeat for this generation within ``rejoin_timeout_s`` of the launch
    is reported as hung, so the whole generation restarts."""
    rejoin_timeout_s: float | None = None


OutcomeKind = Literal["succeeded", "failed", "progress", "first_step", "straggler", "preempted"]

ProgressSignal = Literal["heartbeat", "log", "none"]
"""What tells the supervisor a generation makes progress: ``heartbeat`` (some rank
writes ``lazarus.rank`` heartbeats), ``log`` (``health.progress_regex`` is set and no
heartbeat was seen), ``none`` (neither, ``startup_timeout_s`` after launch: hang
detection is off for the generation, only crashes, vanished ranks and lost nodes are
detected). None while it cannot be known yet (before ``startup_timeout_s``)."""


class StragglerReport(_Model):
    rank: int
    node: str
    slowdown: float
    """The rank's median compute time over the median of its peers' medians."""
    compute_s: float
    peers_compute_s: float
    samples: int
    slow_since: float
    """When the rank's compute time first crossed the threshold in the window."""
    detected_at: float


class SuperviseOutcome(_Model):
    kind: OutcomeKind
    generation: int
    observed_at: float
    step: int | None = None
    first_step_at: float | None = None
    seconds_per_step: float | None = None
    ranks: list[RankStatus] = Field(default_factory=list)
    failure: FailureReport | None = None
    straggler: StragglerReport | None = None
    progress_signal: ProgressSignal | None = None
    """See :data:`ProgressSignal`; ``none`` means hang detection is off."""
    rank_phases: dict[str, float] = Field(default_factory=dict)
    """With ``first_step``: the ranks' own phase marks (:mod:`lazarus.domain.phases`),
    the latest rank's time for each; empty for scripts without the rank helper."""
    checkpoint_save_s: float | None = None
    """The blocking seconds of a disk checkpoint, as the ranks measured their recent
    saves (``lazarus.rank`` heartbeats; the slowest rank's): Young and Daly's δ for
    ``checkpoints.interval: auto``. None until a rank has saved."""


class ProgressMark(_Model):
    """When the controller first saw a rank's current progress (a new heartbeat or a
    new step in its log), by the controller's clock: staleness is never measured
    against a remote node's clock. ``marker`` identifies that progress."""

    marker: str
    seen_at: float


class SupervisionProgress(_Model):
    """The supervise activity's heartbeat details: the live view shown in the Web UI's
    pending-activity panel and merged into ``lazarus status`` without touching history."""

    generation: int
    step: int | None
    alive: int
    world_size: int
    seconds_per_step: float | None = None
    observed_at: float
    unreachable_since: dict[str, float] = Field(default_factory=dict)
    """Supervisor memory that files cannot hold: a retried attempt (after a worker crash)
    restores it from the last heartbeat, so node-loss clocks survive the hand-over."""
    dead_since: dict[int, float] = Field(default_factory=dict)
    progress_marks: dict[int, ProgressMark] = Field(default_factory=dict)
    """Per rank, when its current progress was first seen: hang clocks survive too."""
    progress_signal: ProgressSignal | None = None
    hang_budget: HangBudget | None = None
    """The hang budget now (``lazarus status`` shows it); None without a progress signal."""
    slow_phases: dict[int, str] = Field(default_factory=dict)
    """Ranks in a declared slow phase now, and which."""


class NodeHealth(CompactForm, _Model):
    """One node's preflight answer, one per node: written compactly, so a healthy
    node is its name and ``ok`` (:class:`CompactForm`)."""

    node: str
    ok: bool
    problems: list[str] = Field(default_factory=list)
    free_disk_gb: float | None = None
    gpus: int | None = None
    program_missing: bool = False
    """The command's program was not found there. When every node says so, the
    spec's ``command`` is wrong (a typo), not the nodes: the job fails, asking for a
    fixed ``command``, and no node is quarantined (``workflows/preflight_steps.py``)."""


class PreflightActivityRequest(_OnNodes):
    access: NodeAccess
    """The nodes to check (none: nothing is checked)."""
    checks: PreflightSpec
    interpreter: str
    workdir: str
    disk_path: str
    search_path: str | None = None
    """PATH the ranks get on ssh nodes; None lets the launcher's default apply."""
    job_id: str = ""
    """The job, for the reason a lost Slurm node is drained with ("" : not drained)."""


class PreflightReport(_Model):
    nodes: list[NodeHealth]

    @property
    def failed(self) -> list[NodeHealth]:
        return [n for n in self.nodes if not n.ok]


class CheckpointNowRequest(_OnNodes):
    """Ask a generation's ranks to checkpoint at their next step boundary, then wait
    (bounded) for that checkpoint to be committed."""

    run_dir: str
    """The generation's run directory: its control file is what the ranks read."""
    access: NodeAccess = Field(default_factory=NodeAccess)
    """The generation's nodes; no nodes means this machine only."""
    request_id: int = Field(ge=1)
    checkpoint_dir: str
    newer_than_step: int | None = None
    """The checkpoint must be newer than this; None: newer than the newest at request time."""
    timeout_s: float = 60.0
    checkpoint_every_steps: int | None = None
    memory_every_steps: int | None = None
    """The spec's ``checkpoints.every_steps`` and ``checkpoints.memory_every_steps``:
    the request rewrites the control file, which must keep carrying the intervals the
    launch wrote there (None: the key is left out and the ranks use the environment's
    interval, which the launch set from the same spec)."""


class CheckpointNowResult(_Model):
    checkpoint: CheckpointRef | None
    """None when no new checkpoint arrived in time (the caller records the steps lost)."""
    waited_s: float


class SetCheckpointIntervalRequest(_OnNodes):
    """Send a new disk checkpoint interval to a live generation's ranks through their
    control file (``checkpoints.interval: auto``): ``lazarus.rank.should_checkpoint``
    follows it at its next call, without a restart."""

    job_id: str
    run_dir: str
    """The generation's run directory: its control file is what the ranks read."""
    access: NodeAccess = Field(default_factory=NodeAccess)
    """The generation's nodes; no nodes means this machine only."""
    checkpoint_every_steps: int = Field(ge=1)
    memory_every_steps: int | None = None
    """The spec's ``checkpoints.memory_every_steps``, carried over like the interval."""
    checkpoint_request: int = Field(default=0, ge=0)
    """The checkpoint request the control file holds, carried over: 0 (none) in a
    running generation, because every just-in-time request is followed by the stop of
    its generation in the same turn. Where the file can be read (local nodes), a
    newer request found in it is kept instead."""


class SetCheckpointIntervalResult(_Model):
    nodes: list[str]
    """The nodes whose control file now holds the interval."""


class RollbackRequest(_Model):
    checkpoint_dir: str
    reason: str = ""
    job_id: str | None = None
    """Only this job's checkpoints are retired (None: any, as before)."""


class RollbackResult(_Model):
    retired: list[CheckpointRef]
    """Checkpoints moved aside (under ``.rolled-back/``): never resumed from again."""
    resume: CheckpointRef | None


class EscalationHookRequest(_Model):
    command: list[str]
    workdir: str
    payload: str
    """The incident as JSON, given to the command on stdin."""
    marker: str
    """Written after the command succeeds: a retried attempt never runs it twice."""
    incident: int | None = None
    """The incident escalated, so the workflow can record the hook's outcome on it."""
    timeout_s: float = 60.0


class EscalationHookResult(_Model):
    ran: bool
    """False when an earlier attempt had already run it (the marker existed)."""
    exit_code: int
    output_tail: str = ""


# --- checkpoints you can trust: verification, tiering, retention -------------------------

CheckpointLocation = Literal["local", "durable", "memory"]
"""``memory``: the run's memory tier (tmpfs), whole and committed on every relaunch node."""


class CheckpointVerification(_Model):
    """What ``activities.checkpoints.verify_checkpoint`` found. ``problems`` each name
    the file and what is wrong with it; ``ok`` means there are none."""

    step: int | None
    path: str
    ok: bool
    problems: list[str] = Field(default_factory=list)
    hashed: bool = False
    """Every file's sha256 was checked (False for sizes-only, or a manifest without hashes)."""
    files: int = 0
    size_bytes: int = 0
    world_size: int | None = None
    committed_at: float | None = None
    generation: int | None = None
    """The generation its manifest says wrote it (None: not recorded): whether it is
    on the job's timeline (:mod:`lazarus.domain.timeline`)."""


class SkippedCheckpoint(_Model):
    """A checkpoint newer than the one chosen that could not be trusted."""

    step: int
    path: str
    location: CheckpointLocation = "local"
    problems: list[str]
    moved_to: str | None = None
    """Where a corrupt local copy was moved (``<checkpoint_dir>/.corrupt/step-N.<n>``),
    kept for a person; None when it was left in place (durable, or another job's)."""


class FindVerifiedCheckpointRequest(_OnNodes):
    _legacy_nodes: ClassVar[str] = "memory_nodes"

    checkpoint_dir: str
    checkpoints: CheckpointsSpec = Field(default_factory=CheckpointsSpec)
    """``verify_hashes`` decides sha256 or sizes only; ``durable_uri`` (with
    ``endpoint_url``/``region``) adds the durable tier to the search."""
    expected_world_size: int | None = None
    """Refuse checkpoints whose manifest records another world size (None: any)."""
    include_durable: bool = True
    below_step: int | None = None
    """Only consider checkpoints older than this step (a rollback must not pick the
    durable copy of the checkpoint it just retired)."""
    job_id: str | None = None
    """Never resume from a checkpoint whose manifest names another job (it is listed
    in ``skipped`` as "written by job X"). None: any job's."""
    exclude_steps: list[int] = Field(default_factory=list)
    """Steps retired by number, never chosen from any tier: rollbacks recorded before
    checkpoints were retired by identity (``retired``), or whose manifest named no
    generation. New rollbacks leave it empty."""
    retired: list[RetiredCheckpoint] = Field(default_factory=list)
    """Checkpoints a numerical rollback retired, by identity (step and the generation
    that wrote it): no copy of them is chosen, from any tier, while a later
    generation's fresh checkpoint of the same step is (issue 37, N10)."""
    trusted: list[VerifiedCheckpoint] = Field(default_factory=list)
    """Checkpoints already verified in full: re-checked by sizes and mtimes only."""
    memory_dir: str | None = None
    """The run's memory tier directory, the same on every node
    (``lazarus.domain.memory_tier.memory_checkpoint_dir(job_id, run_root)``, with the
    ``run_root`` of the launch); None: the memory tier is not searched."""
    access: NodeAccess = Field(default_factory=NodeAccess)
    """The nodes the relaunch will run on (``memory_nodes`` in older requests): a
    memory snapshot is chosen only when every one of them holds it committed and
    whole (a replacement node holds none, so after a node loss disk or durable
    serves). No nodes: this machine only."""
    timeline: list[TimelineCut] = Field(default_factory=list)
    """Where earlier relaunches resumed, and the bound a rollback set
    (:mod:`lazarus.domain.timeline`): a checkpoint that one of these cuts abandons is
    never chosen, from any tier. Empty (a workflow that records none yet): memory
    snapshots above the newest retired step are trusted, as before."""

    def off_timeline(self, written_by: int | None, step: int) -> str | None:
        """Why a checkpoint of ``step`` written by generation ``written_by`` is not a
        resume point for this search (retired, or abandoned by a cut), or None."""
        return off_timeline_reason(written_by, step, self.timeline, self.retired)

    def disk_candidates(self, steps: set[int], above_step: int | None) -> list[int]:
        """The disk tiers' steps worth checking, newest first: not retired by number,
        below the rollback's bound (``below_step``), above ``above_step`` (the memory
        tier's choice: the disk tiers only matter when newer)."""
        return sorted(
            (
                step
                for step in steps - set(self.exclude_steps)
                if (self.below_step is None or step < self.below_step)
                and (above_step is None or step > above_step)
            ),
            reverse=True,
        )


class CheckpointSearch(_Model):
    chosen: CheckpointRef | None = None
    """The newest committed and verified checkpoint, or None to start fresh."""
    location: CheckpointLocation | None = None
    """``durable``: only the durable tier holds it (``chosen.path`` is its URI);
    restore it with ``restore_checkpoint`` before resuming from it. ``memory``:
    ``chosen.path`` is the step directory in the memory tier, the same path on every
    relaunch node: resume from it as it is (like ``local``)."""
    skipped: list[SkippedCheckpoint] = Field(default_factory=list)
    """Newer checkpoints passed over (torn, corrupt, without marker or manifest),
    newest first: each is an incident, and the steps between it and ``chosen`` are
    what it cost."""
    durable_unavailable: str | None = None
    """Why the durable tier could not be searched (the search then used local only)."""
    memory_unavailable: str | None = None
    """Why the memory tier could not be searched on every relaunch node (a node that
    did not answer): it then held nothing, and disk or durable served."""
    memory_restored: list[str] = Field(default_factory=list)
    """Memory choice only: the buddies' replicas copied onto relaunch nodes that lacked
    the step (a spare after a node loss), one line each, e.g. "step 25 of node h4
    restored from the replica on h3"."""


class UploadCheckpointRequest(_Model):
    checkpoint: CheckpointRef
    """A committed local checkpoint (``path`` is its step directory)."""
    checkpoints: CheckpointsSpec
    """``durable_uri`` must be set; part size, concurrency and endpoint come from here."""


class MultipartState(_Model):
    upload_id: str
    parts: dict[int, str] = Field(default_factory=dict)
    """Part number to ETag, for parts S3 acknowledged."""


class UploadProgress(_Model):
    """``upload_checkpoint``'s heartbeat details: enough for a retried attempt (after a
    worker crash or an S3 outage) to continue where the last one stopped."""

    step: int
    uri: str
    done_files: list[str] = Field(default_factory=list)
    multipart: dict[str, MultipartState] = Field(default_factory=dict)
    bytes_total: int = 0
    bytes_done: int = 0
    bytes_sent: int = 0
    """Sent by this attempt (bytes_done also counts what earlier attempts sent)."""
    phase: str = "uploading"


class UploadResult(_Model):
    step: int
    uri: str
    """The durable step location, e.g. ``s3://bucket/prefix/step-00000020``."""
    files: int
    size_bytes: int
    bytes_sent: int
    """Sent by the final attempt; less than size_bytes when it resumed earlier work."""
    skipped_files: int
    seconds: float
    verified: bool


class RestoreCheckpointRequest(_Model):
    uri: str
    """A durable checkpoint (``s3://bucket/prefix/step-NNNNNNNN`` or a path)."""
    checkpoint_dir: str
    checkpoints: CheckpointsSpec = Field(default_factory=CheckpointsSpec)
    """Endpoint, region, concurrency and ``verify_hashes`` for the download."""


class GarbageCollectionRequest(_Model):
    checkpoint_dir: str
    checkpoints: CheckpointsSpec
    """``keep_local``, ``keep_durable``, ``verify_hashes`` and the durable store."""
    protect_steps: list[int] = Field(default_factory=list)
    """Never delete these (e.g. the step being uploaded or resumed from)."""
    job_id: str | None = None
    """Never delete, nor count, a checkpoint whose manifest names another job."""


class GarbageCollectionResult(_Model):
    deleted_local: list[CheckpointRef] = Field(default_factory=list)
    deleted_durable: list[CheckpointRef] = Field(default_factory=list)
    newest_verified_local: int | None = None
    newest_verified_durable: int | None = None
    problems: list[str] = Field(default_factory=list)
    """Deletions that failed; the next collection tries again."""


class WatchCheckpointsRequest(_Model):
    checkpoint_dir: str
    newer_than_step: int | None = None
    min_interval_s: float = 0.0
    """Report no sooner than this after the call: bounds history growth."""
    verify: bool = True
    """Verify a reported checkpoint in full (every sha256) and return its stamps in
    ``CheckpointRef.verified``; the workflow passes ``checkpoints.verify_hashes``."""
    max_wait_s: float = 3600.0


def run_tag(run_key: str | None) -> str | None:
    """A short, Slurm-safe form of a workflow run's key (``run-<uuid>``): 10 hex
    digits of its SHA-256. It goes into the names of the Slurm jobs a run submits, so
    that two jobs called "train" (two users, or two deployments of one user) never
    take each other's jobs for their own. None for a run without a key."""
    if not run_key:
        return None
    return hashlib.sha256(run_key.encode()).hexdigest()[:10]


def slurm_job_name(job_name: str, run_key: str | None, token: str) -> str:
    """The name of a Slurm job a run submits (its first holder, ``token`` ``start``; a
    resubmitted holder, ``i<incident>``; a grow request, ``g<generation>``):
    ``lazarus-<job>-<run tag>-<token>``. Without a run key (a request from a
    workflow older than issue 26) the old ``lazarus-<job>-<token>``, which only the
    submitting user's own jobs are matched against."""
    tag = run_tag(run_key)
    return f"lazarus-{job_name}-{tag}-{token}" if tag else f"lazarus-{job_name}-{token}"


class SubmitAllocationRequest(_Model):
    """A Slurm allocation for a job: its first (the workflow's first step in submit
    mode, ``token`` ``start``, nothing to release), or a new one for a job whose old
    one Slurm is taking away (``slurm.resubmit``, ``token`` the incident). ``token``
    names the submission, so a retried activity finds the allocation it already
    submitted instead of a second, and a cancelled job's first one can be found to
    be given back."""

    job_name: str
    run_dir: str
    slurm: SlurmSpec
    """The submit-mode options, with the old ``job_id`` (``slurm.submitted``); no
    ``job_id`` for the first allocation."""
    token: str
    release_old: bool = True
    """Cancel the old allocation first: it is ending anyway, and its nodes may be the
    ones the new allocation needs."""
    run_key: str | None = None
    """The workflow run's key (``JobState.run_key``): the new holder's name carries
    it (:func:`slurm_job_name`), so a retry adopts only this run's holder. None in
    requests recorded before issue 26."""
    known_job_ids: list[int] = Field(default_factory=list)
    """Slurm jobs the workflow already recorded as its allocations (the one being
    released): never adopted as the new allocation."""

    @property
    def holder_name(self) -> str:
        return slurm_job_name(self.job_name, self.run_key, self.token)


class GrowAllocationRequest(_Model):
    """Nodes added to a running allocation (``slurm.grow``): a lost node had no spare."""

    job_name: str
    slurm: SlurmSpec
    count: int = Field(default=1, ge=1)
    known_nodes: list[str]
    """Every node the job already has or had in the allocation (quarantined ones
    included): a grown node is one outside this list, which also makes a retry
    find the node an earlier attempt added."""
    exclude: list[str] = Field(default_factory=list)
    """Nodes Slurm must not give (the lost ones: it may not know yet)."""
    token: str
    run_key: str | None = None
    """The workflow run's key: the grow request's name carries it
    (:func:`slurm_job_name`), so only this run's leftover requests are cancelled.
    None in requests recorded before issue 26."""
    known_job_ids: list[int] = Field(default_factory=list)
    """Slurm jobs the workflow recorded as its allocations (the one to grow): never
    cancelled as a leftover request, whatever their name."""

    @property
    def request_name(self) -> str:
        return slurm_job_name(self.job_name, self.run_key, self.token)


class AllocationGranted(_Model):
    job_id: int
    nodes: list[str]
    """Submit: every node of the new allocation, in Slurm's order. Grow: the new
    nodes only."""
    waited_s: float = 0.0


class AllocationsCancelled(_Model):
    """What giving back a submission found and cancelled (Slurm job ids; empty when it
    never reached Slurm)."""

    job_ids: list[int] = Field(default_factory=list)
