"""Typed inputs and outputs of every activity: the only shapes that cross into history.

Workflows import this module (passed through the sandbox), so it must stay free of
I/O and heavy imports. Times are Unix seconds as measured on the worker, because
they describe the ranks' world, not workflow time.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from lazarus.spec import HealthSpec, JobSpec, NodeSpec, PreflightSpec, SSHSpec


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CheckpointRef(_Model):
    step: int
    path: str


class FindCheckpointRequest(_Model):
    checkpoint_dir: str


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


class LaunchResult(_Model):
    generation: int
    master_addr: str
    master_port: int
    run_dir: str
    ranks: list[RankProcess]
    launched_at: float
    adopted: bool
    """True when this call found the generation already launched (a retry) and adopted it."""


class StopRequest(_Model):
    job_id: str
    run_root: str
    """The job's run directory; every generation below it is considered."""
    keep_generation: int | None = None
    """Stop every generation except this one. ``None`` stops them all."""
    grace_s: float = 10.0
    reason: str = ""
    nodes: list[NodeSpec] = Field(default_factory=list)
    """Every node that may hold ranks of this job; empty means this machine only."""
    ssh: SSHSpec = Field(default_factory=SSHSpec)


class StopResult(_Model):
    generations: list[int]
    signalled_groups: int
    killed_groups: int
    """Groups that ignored SIGTERM for the grace period and needed SIGKILL."""
    last_step: int | None = None
    """The newest step any stopped rank reported: what a forced stop costs, in steps."""
    unreachable: list[str] = Field(default_factory=list)
    """Nodes that could not be reached: whatever runs there is not yet fenced."""


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


FailureKind = Literal["crash", "hang", "vanished", "node_lost"]


class FailureReport(_Model):
    kind: FailureKind
    failure_class: str
    """A class of the failure taxonomy (see ``lazarus.failure_classes``)."""
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


class SuperviseRequest(_Model):
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
    nodes: list[NodeSpec] = Field(default_factory=list)
    """The generation's nodes in rank order; empty means one local node."""
    nproc_per_node: int = 1
    node_timeout_s: float = 15.0
    ssh: SSHSpec = Field(default_factory=SSHSpec)


OutcomeKind = Literal["succeeded", "failed", "progress", "first_step"]


class SuperviseOutcome(_Model):
    kind: OutcomeKind
    generation: int
    observed_at: float
    step: int | None = None
    first_step_at: float | None = None
    seconds_per_step: float | None = None
    ranks: list[RankStatus] = Field(default_factory=list)
    failure: FailureReport | None = None


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


class NodeHealth(_Model):
    node: str
    ok: bool
    problems: list[str] = Field(default_factory=list)
    free_disk_gb: float | None = None
    gpus: int | None = None


class PreflightActivityRequest(_Model):
    nodes: list[NodeSpec]
    ssh: SSHSpec
    checks: PreflightSpec
    interpreter: str
    workdir: str
    disk_path: str
    search_path: str | None = None
    """PATH the ranks get on ssh nodes; None lets the launcher's default apply."""


class PreflightReport(_Model):
    nodes: list[NodeHealth]

    @property
    def failed(self) -> list[NodeHealth]:
        return [n for n in self.nodes if not n.ok]
