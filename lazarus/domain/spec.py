"""The job spec: what a user writes in YAML, validated strictly before anything starts.

A bad spec must never start half a job, so :func:`load_spec` either returns a
fully resolved :class:`JobSpec` (every path absolute) or raises
:class:`SpecError`, whose lines read ``file: field: what is wrong`` so the user
can fix the exact field. The spec travels into the workflow as its input, which
lands in Temporal history: it must hold paths to secrets, never secrets.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

from lazarus.domain import environment as env_names
from lazarus.domain.compact_form import CompactForm
from lazarus.domain.failure_classes import PLAYBOOK_CLASSES

JOB_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
JOB_ID_PLACEHOLDER = "{job_id}"
DEFAULT_CHECKPOINT_DIR = "checkpoints/{job_id}"
"""Relative to ``workdir``: checkpoints are per job unless a spec says otherwise."""

# Variables the launcher owns; a spec that sets them would break rendezvous or fencing.
RESERVED_ENV = frozenset(
    {
        env_names.RANK,
        env_names.LOCAL_RANK,
        env_names.WORLD_SIZE,
        env_names.LOCAL_WORLD_SIZE,
        env_names.GROUP_RANK,
        env_names.MASTER_ADDR,
        env_names.MASTER_PORT,
        env_names.RESTART_COUNT,
    }
)

ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

SECRET_NAME_PATTERN = re.compile(
    r"TOKEN$|SECRET|PASSWORD|PASSWD|PASSPHRASE|API_?KEY|PRIVATE_?KEY|CREDENTIALS?$",
    re.IGNORECASE,
)
"""Names that usually hold a secret (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``,
``WANDB_API_KEY``, ``DB_PASSWORD``, ``GOOGLE_APPLICATION_CREDENTIALS``...). The spec is
the workflow's input, so a value in ``env`` lands in Temporal history and the Web UI:
such names must come through ``pass_env`` or ``env_from_file`` instead."""


def secret_env_message(name: str) -> str:
    """Why ``name`` is refused in ``env``, and the two ways to supply it instead."""
    return (
        f"{name} looks like a secret, and env values are stored in workflow history and "
        f"shown in the Web UI; remove it from env and either list it in pass_env: [{name}] "
        "(the value is read from the worker's own environment at launch) or put the line "
        f"{name}=VALUE in a file readable only by its owner (chmod 600) named by "
        "env_from_file (read on the node where each rank runs)"
    )


def _env_name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a variable a spec supplies, or None."""
    if name in RESERVED_ENV or name.startswith("LAZARUS_"):
        return f"{name} is set by Lazarus for every rank; remove it"
    if not ENV_NAME_PATTERN.fullmatch(name):
        return f"{name!r} is not a valid environment variable name"
    return None


def repeated(names: Iterable[str]) -> list[str]:
    """The names that occur more than once, sorted. Linear: node lists run to
    thousands, and these checks run every time a spec or fleet is read back."""
    return sorted(name for name, times in Counter(names).items() if times > 1)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class NodeSpec(CompactForm, _Strict):
    """One machine that hosts ranks (or waits as a spare).

    ``local`` nodes run on the controller's machine; several local nodes are
    logical nodes of one machine (useful for tests and single-box jobs). ``ssh``
    nodes are reached with paramiko; only a *path* to the identity file is ever
    stored, and host keys are checked against ``ssh.known_hosts``. ``slurm`` nodes
    are Slurm node names of the job's allocation (``slurm:``), reached with
    ``srun``/``scontrol``; their ``host`` is informational (the rendezvous address
    is the address Slurm knows the first node by).

    Written into history as its name and the fields it changes (:class:`CompactForm`).
    """

    always_written: ClassVar[frozenset[str]] = frozenset({"name"})
    name: str = Field(default="local", pattern=r"^[A-Za-z0-9._-]+$")
    launcher: Literal["local", "ssh", "slurm"] = "local"
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 22
    user: str | None = None
    identity_file: str | None = None
    """Path to a private key file; without it, the ssh agent is used."""
    labels: dict[str, str] = Field(default_factory=dict)


class SSHSpec(_Strict):
    known_hosts: str = "~/.ssh/known_hosts"
    accept_new_host_keys: bool = False
    """Trust-on-first-use: add unknown host keys to ``known_hosts``. Off by default;
    a changed key is refused even when this is on."""
    connect_timeout_s: Annotated[float, Field(gt=0, le=120)] = 5.0
    command_timeout_s: Annotated[float, Field(gt=0, le=600)] = 5.0
    """A status poll with no answer this long marks the node unreachable for that poll."""
    use_agent: bool = True


PREEMPT_MARKER_PREFIX = ".slurm-preempt-"
"""The holder's preemption notice is ``<run_dir>/.slurm-preempt-<job id>``."""


class SlurmSpec(_Strict):
    """The Slurm allocation a job with ``launcher: slurm`` nodes runs in, named one of
    two ways: ``job_id``, an existing one (``salloc``, or ``sbatch`` with a holder
    script), or ``nodes`` (+ ``spares``, ``partition``...), one the job's first step
    submits with ``sbatch --no-kill --no-requeue --signal=B:USR1@<notice_s>`` and
    whose nodes become the job's ``nodes`` and ``spares``. Each generation is one job
    step inside it."""

    job_id: Annotated[int, Field(ge=1)] | None = None
    """The allocation's job id (``squeue --me`` shows it)."""
    nodes: Annotated[int, Field(ge=1)] | None = None
    """Submit mode: how many nodes train; the job's ``nodes`` are taken from the
    allocation, in Slurm's order."""
    spares: Annotated[int, Field(ge=0)] = 0
    """Submit mode: extra nodes held in the allocation to replace lost ones."""
    partition: str | None = None
    time: str | None = None
    """Submit mode: the allocation's time limit, in ``sbatch --time`` form (``4:00:00``)."""
    account: str | None = None
    extra_args: list[str] = Field(default_factory=list)
    """Submit mode: more ``sbatch`` options, passed as they are (``--qos=high``): options
    only, values after ``=``. Those the holder sets itself, or that choose what it runs
    or its environment (``--export``, ``--wrap``, ``--job-name``, ``--output``...), are
    refused when the allocation is submitted (``slurm_submit.extra_args_problems``)."""
    notice_s: Annotated[int, Field(ge=10, le=86_400)] = 120
    """Submit mode: ``--signal=B:USR1@<notice_s>``: how long before the end Slurm warns
    the holder, for the just-in-time checkpoint. Give the same to your own holder."""
    resubmit: bool = False
    """Submit mode: when Slurm takes the allocation away (a preemption notice, the time
    limit's warning), checkpoint just in time, then submit a new allocation with the
    same options and go on in it, in the same workflow (true); or pause (false)."""
    grow: bool = False
    """A lost node with no spare left: ask Slurm for a replacement node and add it to
    the allocation (``--dependency=expand``; the cluster must allow it with
    ``SchedulerParameters=permit_job_expansion``) instead of shrinking or asking a
    person. When Slurm says no, the job shrinks (``min_nodes``) or needs an operator."""
    wait_s: Annotated[int, Field(ge=10, le=7 * 86_400)] = 1800
    """How long the first allocation, a resubmitted one or a grown node may wait in
    Slurm's queue: then the job fails (the first), pauses (a resubmission) or shrinks
    or needs an operator (a grown node) instead."""
    submitted: bool = False
    """Set by Lazarus, never by hand: ``job_id`` is the allocation Lazarus submitted
    from the submit-mode options kept beside it (``nodes``, ``partition``...), so a
    resubmission asks Slurm for the same."""

    @model_validator(mode="after")
    def _one_allocation(self) -> SlurmSpec:
        if self.submitted:
            if self.job_id is None or self.nodes is None:
                raise ValueError(
                    "slurm.submitted: set by Lazarus once it submitted the allocation; "
                    "remove it (give slurm.job_id or slurm.nodes)"
                )
            return self
        if (self.job_id is None) == (self.nodes is None):
            field = "slurm.job_id" if self.job_id is None else "slurm.nodes"
            raise ValueError(
                f"{field}: give slurm.job_id (an existing allocation) or slurm.nodes (one "
                "Lazarus submits), exactly one of them"
            )
        if self.job_id is not None:
            # By value, not by presence: a dumped spec (the workflow's input) has them all.
            submit_only = [
                name
                for name, value in (
                    ("spares", self.spares),
                    ("partition", self.partition),
                    ("time", self.time),
                    ("account", self.account),
                    ("extra_args", self.extra_args),
                    ("resubmit", self.resubmit),
                )
                if value
            ]
            if submit_only:
                raise ValueError(
                    f"slurm.{submit_only[0]}: only with slurm.nodes (an allocation Lazarus "
                    f"submits); job {self.job_id} already has its own"
                )
        return self

    @property
    def submits(self) -> bool:
        """Whether the job must submit its allocation first (the workflow's first step)."""
        return self.job_id is None

    @property
    def resubmits(self) -> bool:
        """Whether a preempted job goes on in a new allocation Lazarus submits: only one
        Lazarus submitted knows what to ask for again."""
        return self.submitted and self.resubmit

    def granted(self, job_id: int) -> SlurmSpec:
        """The same options, running as Slurm job ``job_id`` (Lazarus submitted it)."""
        return self.model_copy(update={"job_id": job_id, "submitted": True})

    @property
    def allocation_id(self) -> int:
        """The allocation's job id, once there is one (the first submit grants it)."""
        if self.job_id is None:
            raise ValueError("slurm: the allocation has not been submitted yet")
        return self.job_id

    def preempt_marker(self, run_dir: str | Path) -> Path:
        """Where the allocation's holder writes its preemption notice when Slurm sends
        it USR1 (``sbatch --signal=B:USR1@<s>``): in the job's ``run_dir``, which is on
        the filesystem the nodes and the controller share."""
        return Path(run_dir) / f"{PREEMPT_MARKER_PREFIX}{self.allocation_id}"


class PreflightSpec(_Strict):
    """Checked on every node, in parallel, before each launch; a failing node is
    replaced from the spares and never launched on."""

    min_free_disk_gb: Annotated[float, Field(ge=0)] = 0.0
    health_command: list[str] | None = None
    """Optional check that must exit 0, e.g. ``[nvidia-smi, -q]``; its nvidia-smi
    output, when present, is parsed for GPU count, ECC and Xid errors."""
    timeout_s: Annotated[float, Field(gt=0, le=600)] = 30.0


class HealthSpec(_Strict):
    """How Lazarus decides a rank is unhealthy, in seconds."""

    hang_timeout_s: Annotated[float, Field(ge=2.0, le=86_400.0)] = 60.0
    """No heartbeat progress for this long while the process is alive means a hang."""

    startup_timeout_s: Annotated[float, Field(ge=2.0, le=86_400.0)] = 300.0
    """Grace before the first heartbeat of a generation: imports and rendezvous are slow."""

    poll_interval_s: Annotated[float, Field(ge=0.05, le=10.0)] = 0.5
    """How often the supervisor looks at pids, exit files and heartbeats."""

    progress_regex: str | None = None
    """For scripts that do not use ``lazarus.rank``: a regex whose group ``step``
    (or first group) captures the step number from each rank's stdout."""

    supervisor_heartbeat_timeout_s: Annotated[float, Field(ge=2.0, le=600.0)] = 10.0
    """How quickly Temporal notices a dead worker and moves supervision elsewhere."""

    report_interval_s: Annotated[float, Field(ge=1.0, le=86_400.0)] = 300.0
    """How often a healthy generation reports its step into workflow history. Larger
    means a shorter history; the live step is always visible in the pending activity."""

    @field_validator("progress_regex")
    @classmethod
    def _regex_compiles(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            compiled = re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from exc
        if compiled.groups == 0:
            raise ValueError("needs a capture group for the step, e.g. 'step (?P<step>\\d+)'")
        return value


class RecoverySpec(_Strict):
    """The restart budget and pacing; the playbook reads these."""

    max_restarts: Annotated[int, Field(ge=0, le=10_000)] = 5
    restart_window_s: Annotated[float, Field(gt=0)] = 3600.0
    backoff_initial_s: Annotated[float, Field(ge=0)] = 1.0
    backoff_max_s: Annotated[float, Field(ge=0)] = 60.0
    backoff_multiplier: Annotated[float, Field(ge=1.0)] = 2.0
    backoff_jitter: Annotated[float, Field(ge=0.0, le=1.0)] = 0.2
    """Each backoff is stretched by up to this fraction, so jobs that failed together
    (one switch, one storage outage) do not all come back in the same second. The
    jitter is derived from the job and incident, so a workflow replay computes it
    identically."""
    node_failure_limit: Annotated[int, Field(ge=1, le=1000)] = 3
    """Failures blamed on one node inside the window before it is replaced even for
    classes that normally restart in place (when a spare exists)."""
    crash_loop_after: Annotated[int, Field(ge=1, le=1000)] = 3
    """Restarts that may fail before making a step; one more failure is a crash loop."""
    stop_grace_s: Annotated[float, Field(ge=0, le=600)] = 10.0
    """SIGTERM, then this long, then SIGKILL for the whole process group."""

    @model_validator(mode="after")
    def _backoff_ordered(self) -> RecoverySpec:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("backoff_max_s must be >= backoff_initial_s")
        return self


class StrategyName(StrEnum):
    """The rungs a playbook ladder may use: the one list of strategy names.

    The spec validates ladders against it; ``lazarus.workflows.playbook`` registers
    exactly one strategy per member, keyed by it (a unit test checks both ways), so a
    name cannot be accepted here and then be missing there."""

    RESTART_IN_PLACE = "restart_in_place"
    REPLACE_NODE = "replace_node"
    NO_BLIND_RESTARTS = "no_blind_restarts"
    ROLLBACK = "rollback"
    ESCALATE = "escalate"


class ClassPolicy(_Strict):
    """How one failure class is handled: an escalation ladder and its own budget.

    The n-th failure of the class inside ``recovery.restart_window_s`` takes rung
    n (the last rung repeats), so ``[restart_in_place, replace_node, escalate]``
    means "restart once, then move off the node, then ask a person"."""

    ladder: list[Annotated[StrategyName, Strict(False)]] = Field(min_length=1)
    """Strategy names; YAML gives them as strings, hence not strict like the rest."""
    budget: Annotated[int, Field(ge=0, le=10_000)] | None = None
    """Automatic recoveries of this class allowed inside the window; None: only the
    job-wide ``max_restarts`` applies."""

    @field_validator("ladder", mode="before")
    @classmethod
    def _known_strategies(cls, value: object) -> object:
        # Before the enum's own check, so the message lists every unknown name at once.
        if not isinstance(value, list):
            return value
        known = {s.value for s in StrategyName}
        unknown = [name for name in value if isinstance(name, str) and name not in known]
        if unknown:
            raise ValueError(
                f"unknown strategy {', '.join(map(repr, unknown))}; "
                f"choose from {', '.join(sorted(known))}"
            )
        return value


class StragglerSpec(_Strict):
    """When a slow rank is worth moving off its node.

    Ranks report per-step compute time (``lazarus.rank.compute_timer``); a rank whose
    median over ``window_s`` is ``slowdown_factor`` times the median of its peers,
    and also beyond ``mad_threshold`` median absolute deviations of them, is a
    straggler. One slow step moves no median, so it is not."""

    enabled: bool = True
    slowdown_factor: Annotated[float, Field(gt=1.0, le=100.0)] = 1.5
    window_s: Annotated[float, Field(ge=1.0, le=86_400.0)] = 10.0
    min_samples: Annotated[int, Field(ge=1, le=10_000)] = 4
    """Heartbeat samples per rank in the window before any judgement."""
    mad_threshold: Annotated[float, Field(ge=0.0, le=100.0)] = 3.0
    swap: bool = True
    """Move the job off a straggling node when a spare exists and the gain beats the
    restart cost; False only records and alerts."""
    default_restart_cost_s: Annotated[float, Field(ge=0.0)] = 30.0
    """Assumed cost of a restart before one has been measured."""


S3_BUCKET_PATTERN = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class CheckpointsSpec(_Strict):
    """How checkpoints are trusted, tiered and kept (``checkpoints:`` in the spec).

    ``checkpoint_dir`` stays the fast tier the ranks write to; ``durable_uri``
    names a second, durable tier that committed and verified checkpoints are
    copied to: a filesystem path (shared storage; relative to ``workdir``) or
    ``s3://bucket/prefix`` for S3 and S3-compatible stores. Credentials for S3
    come only from the standard AWS chain (environment, shared files, instance
    or pod roles), never from the spec, which is stored in workflow history."""

    durable_uri: str | None = None
    """``{job_id}`` is replaced by the job's name, as in ``checkpoint_dir``: give each
    job its own prefix (``s3://bucket/{job_id}``), or two jobs' step N collide."""
    endpoint_url: str | None = None
    """For S3-compatible stores (MinIO, Ceph, R2, ...): ``http(s)://host[:port]``."""
    region: str | None = None
    keep_local: Annotated[int, Field(ge=0, le=100_000)] = 3
    """Newest committed checkpoints kept in ``checkpoint_dir`` (the newest verified
    one is always kept, even with 0)."""
    keep_durable: Annotated[int, Field(ge=0, le=100_000)] = 10
    verify_hashes: bool = True
    """Check every file's sha256 against the manifest before trusting a checkpoint;
    False checks sizes only (much faster for very large checkpoints)."""
    upload_part_size_mb: Annotated[int, Field(ge=5, le=5120)] = 16
    """S3 multipart part size; S3 needs at least 5 MiB for every part but the last. Grown
    automatically for files over 10,000 parts. Memory: about size x concurrency."""
    upload_concurrency: Annotated[int, Field(ge=1, le=64)] = 8
    jit_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 60.0
    """How long a just-in-time save (asked for before a planned stop) may take."""
    housekeeping_interval_s: Annotated[float, Field(ge=0, le=86_400)] = 60.0
    """At most this often, the newest new checkpoint is tiered (with ``durable_uri``)
    and old ones are collected: one handful of history events per interval."""
    every_steps: Annotated[int, Field(ge=0, le=100_000_000)] | None = None
    """The disk checkpoint interval in steps, set by the controller
    (``LAZARUS_CHECKPOINT_EVERY_STEPS``): scripts that ask
    ``lazarus.rank.should_checkpoint(step, every=...)`` use it instead of their own
    ``every``. 0: only when the controller asks (before a planned stop). None (the
    default): the script's own interval."""
    memory_every_steps: Annotated[int, Field(ge=1, le=100_000_000)] | None = None
    """The memory checkpoint tier: every this many steps, each node snapshots the
    state into its tmpfs (``/dev/shm``), so a crash on a healthy node loses at most
    this many steps instead of a disk interval. 1 is the usual value. None (the
    default): the tier is off."""
    memory_keep: Annotated[int, Field(ge=1, le=100)] = 2
    """Committed memory snapshots each node keeps (RAM: ``memory_keep + 1`` copies of
    the state). 2, because a node that dies between the cross-node barrier and its own
    commit leaves the previous step as the newest one every node holds."""
    interval: Literal["auto"] | None = None
    """``auto``: the controller tunes the disk interval by Young and Daly, from the
    measured blocking cost of a save and the job's MTBF, and sends it to the ranks
    without a restart (:mod:`lazarus.domain.checkpoint_interval`); ``every_steps``,
    if set, is the interval until then. None (the default): ``every_steps`` or the
    script's own interval, fixed."""
    mtbf_prior_h: Annotated[float, Field(gt=0, le=10_000_000)] | None = None
    """With ``interval: auto``: the per-node MTBF to assume, in hours, until a fleet's
    or this job's own failures say otherwise. None: 6,383 h, an 8-GPU node at Llama 3's
    4.7e-4 failures per GPU-day."""

    @field_validator("durable_uri")
    @classmethod
    def _uri_form(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.strip():
            raise ValueError("must not be empty; omit it to keep checkpoints local only")
        if "://" not in value:
            return value  # a filesystem path
        scheme, _, rest = value.partition("://")
        if scheme != "s3":
            raise ValueError(
                f"unsupported scheme {scheme!r}; use s3://bucket/prefix or a filesystem path"
            )
        bucket = rest.split("/", 1)[0]
        if not bucket:
            raise ValueError("s3 URI needs a bucket: s3://bucket/prefix")
        if not S3_BUCKET_PATTERN.match(bucket) or ".." in bucket:
            raise ValueError(
                f"{bucket!r} is not a valid S3 bucket name "
                "(3-63 characters: lowercase letters, digits, '.' and '-')"
            )
        if "//" in rest or rest.endswith("/.") or "/../" in f"{rest}/":
            raise ValueError("s3 prefix must not contain empty or '..' segments")
        return value

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint_form(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not re.fullmatch(r"https?://[^/\s@]+(/.*)?", value):
            if "@" in value:
                raise ValueError(
                    "must not hold credentials; they come from the AWS chain "
                    "(AWS_ACCESS_KEY_ID, ~/.aws/credentials, an instance role)"
                )
            raise ValueError(f"{value!r} is not an http(s)://host[:port] URL")
        return value

    @field_validator("interval", mode="before")
    @classmethod
    def _interval_form(cls, value: object) -> object:
        if value is None or value == "auto":
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            raise ValueError(
                f"{value!r}: a fixed interval is every_steps: {value}; interval takes only 'auto'"
            )
        raise ValueError(f"{value!r} is not 'auto' (omit it for a fixed interval)")

    @model_validator(mode="after")
    def _auto_interval_fits(self) -> CheckpointsSpec:
        if self.interval == "auto" and self.every_steps == 0:
            raise ValueError(
                "every_steps: 0 (save only when asked) contradicts interval: auto; drop one of them"
            )
        if self.mtbf_prior_h is not None and self.interval != "auto":
            raise ValueError("mtbf_prior_h is only used with interval: auto")
        return self

    @model_validator(mode="after")
    def _endpoint_needs_s3(self) -> CheckpointsSpec:
        is_s3 = self.durable_uri is not None and self.durable_uri.startswith("s3://")
        if self.endpoint_url is not None and not is_s3:
            raise ValueError("endpoint_url is only used with an s3:// durable_uri")
        if self.region is not None and not is_s3:
            raise ValueError("region is only used with an s3:// durable_uri")
        return self

    @property
    def durable_is_s3(self) -> bool:
        return self.durable_uri is not None and self.durable_uri.startswith("s3://")

    def resolved(self, workdir: Path) -> CheckpointsSpec:
        """Anchor a filesystem ``durable_uri`` at ``workdir``; URIs stay as they are."""
        if self.durable_uri is None or self.durable_is_s3:
            return self
        path = (workdir / Path(self.durable_uri).expanduser()).resolve()
        return self.model_copy(update={"durable_uri": str(path)})


MODULE_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
MAX_STANDBY = 8


class WarmStartSpec(_Strict):
    """Warm-standby ranks (``warm_start:`` in the spec; absent = off).

    Each node gets a *zygote* for the run: one process that imports ``preload``
    once and forks ranks from then on, so a relaunch does not pay for a fresh
    interpreter importing the framework. The section being present turns it on;
    ``enabled: false`` keeps it written down but off. Whatever cannot be forked (a
    non-python command, a failed preload, a dead zygote) starts cold, and the
    launch result says which ranks did and why."""

    enabled: bool = True
    preload: list[str] = Field(default_factory=lambda: ["torch"], max_length=32)
    """Modules the zygote imports before it forks anything (dotted import names)."""
    standby: Annotated[int, Field(ge=0, le=MAX_STANDBY)] = 1
    """Idle processes pre-forked per node beyond the running ranks: a relaunch takes
    one instead of forking on its critical path."""

    @field_validator("preload")
    @classmethod
    def _importable_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not MODULE_NAME_PATTERN.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not a module name: use dotted Python identifiers "
                    "such as torch or torch.distributed"
                )
        duplicates = repeated(value)
        if duplicates:
            raise ValueError(f"{', '.join(duplicates)} listed more than once")
        return value


class RejoinSpec(_Strict):
    """Rejoin in place (``rejoin:`` in the spec; absent = off): when a rank crashes,
    the healthy ranks keep their process and rejoin the next generation, and only the
    failed rank is relaunched. The training script opts in by running its loop through
    ``lazarus.rank.torch.run_resilient``; a script that does not simply exits with its
    failed peers and the generation restarts whole, as without this section.

    Hangs, node losses the survivors cannot see, and anything the playbook answers
    other than a restart in place or a node replacement restart the whole generation;
    the incident says which path was taken."""

    enabled: bool = True
    timeout_s: Annotated[float, Field(ge=1.0, le=3600.0)] = 60.0
    """How long a survivor waits for the controller's rejoin request, and how long
    the controller waits for a survivor to act for the new generation before it
    stops the whole generation and starts it afresh."""


class FleetLeaseSpec(_Strict):
    """Which fleet a job leases from, and how many nodes: ``nodes`` train, ``spares``
    wait as the job's own spares. When those run out the fleet's shared pool is asked."""

    name: str = Field(pattern=JOB_NAME_PATTERN)
    nodes: Annotated[int, Field(ge=1)] = 1
    spares: Annotated[int, Field(ge=0)] = 0
    hand_back: bool = True
    """Give fenced quarantined nodes back to the fleet while the job runs, so probation
    can return them to any job, this one included, before this one ends. On by
    default: in the 54-day simulation it takes the job from 96.5% to 96.9% ETTR
    (README, "Scale"). ``false`` holds them until the job ends, as before."""
    retry_s: Annotated[float, Field(ge=10)] = 300.0
    """While the job waits for an operator only because it is short of nodes (its
    spares and the fleet's were gone), it asks the fleet again this often, and goes on
    by itself as soon as the fleet has a node: the operator's page stands, but a
    repaired node that passes probation first needs no person."""
    leased: bool = False
    """Set by the job once the fleet leased it nodes: from then on ``nodes`` and
    ``spares`` are the leased ones (carried by continue-as-new). Not for spec files."""


class JobSpec(_Strict):
    """A training job. Paths are absolute once :func:`load_spec` has resolved them."""

    name: str = Field(pattern=JOB_NAME_PATTERN)
    command: list[str] = Field(min_length=1)
    workdir: str = "."
    env: dict[str, str] = Field(default_factory=dict)
    """Plain settings for every rank. Stored in workflow history: names that look like
    secrets are refused (see ``pass_env`` and ``env_from_file``)."""
    pass_env: list[str] = Field(default_factory=list)
    """Names of variables whose values come from the worker's own environment at each
    launch (e.g. ``WANDB_API_KEY``): only the names are in history. A name the worker
    does not have is a launch error."""
    env_from_file: str | None = None
    """A file of ``KEY=VALUE`` lines (``#`` comments and blank lines ignored; the value
    is literal, no quotes or expansion), read on the node where each rank runs at
    launch; absolute or relative to ``workdir``. It must be readable by its owner only
    (mode 0600 or stricter) or the launch is refused. ``env`` and ``pass_env`` win over
    it, and Lazarus's own variables win over all."""
    nodes: list[NodeSpec] = Field(default_factory=lambda: [NodeSpec()], min_length=1)
    spares: list[NodeSpec] = Field(default_factory=list)
    """Healthy nodes held back to replace a dead, failing or straggling one."""
    min_nodes: Annotated[int, Field(ge=1)] | None = None
    """Allow elastic shrinking down to this many nodes when no spare is left;
    None means the world size is fixed and running out of spares needs an operator."""
    node_timeout_s: Annotated[float, Field(ge=1, le=3600)] = 15.0
    """A node unreachable this long is dead (its ranks may still run: it is fenced)."""
    ssh: SSHSpec = Field(default_factory=SSHSpec)
    preflight: PreflightSpec = Field(default_factory=PreflightSpec)
    nproc_per_node: Annotated[int, Field(ge=1, le=1024)] = 1
    checkpoint_dir: str = DEFAULT_CHECKPOINT_DIR
    """Where the ranks write checkpoints (relative to ``workdir``). ``{job_id}`` is
    replaced by the job's final name (after ``--name``), so one spec started under
    two names never shares checkpoints; the default is ``checkpoints/{job_id}``."""
    run_dir: str = ".lazarus/runs"
    """Where each generation's pid, log, heartbeat and exit-status files live."""
    health: HealthSpec = Field(default_factory=HealthSpec)
    recovery: RecoverySpec = Field(default_factory=RecoverySpec)
    checkpoints: CheckpointsSpec = Field(default_factory=CheckpointsSpec)
    """Verification, durable tiering (S3) and retention of checkpoints."""
    playbook: dict[str, ClassPolicy] = Field(default_factory=dict)
    """Per-class overrides of the default playbook, keyed by failure class."""
    straggler: StragglerSpec = Field(default_factory=StragglerSpec)
    total_steps: Annotated[int, Field(ge=1)] | None = None
    """The job's length in steps, if known: the straggler cost model weighs the gain
    of a swap over the steps that remain."""
    on_escalation: list[str] | None = Field(default=None, min_length=1)
    """A command run once per escalation to NEEDS_OPERATOR (a webhook call, a page),
    with the incident as JSON on stdin; retried durably until it exits 0."""
    warm_start: WarmStartSpec | None = None
    """Warm-standby ranks forked from a per-node zygote; None: every rank starts cold."""
    rejoin: RejoinSpec | None = None
    """Healthy ranks rejoin the next generation in their own process; None: every
    recovery restarts the whole generation."""
    slurm: SlurmSpec | None = None
    """The Slurm allocation of ``launcher: slurm`` nodes; required with them, refused
    without them."""
    fleet: FleetLeaseSpec | None = None
    """Lease the nodes from a fleet (``lazarus fleet start``) instead of listing them;
    ``fleet: NAME`` is short for ``{name: NAME}``. None: the job's own nodes, as before."""

    @field_validator("fleet", mode="before")
    @classmethod
    def _fleet_shorthand(cls, value: object) -> object:
        return {"name": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _fleet_owns_the_nodes(self) -> JobSpec:
        if self.fleet is None:
            return self
        if self.slurm is not None:
            raise ValueError("fleet: a fleet job cannot also name a Slurm allocation")
        if not self.fleet.leased and (self.nodes != [NodeSpec()] or self.spares):
            raise ValueError(
                "nodes/spares: with fleet the nodes are leased from the fleet; remove them "
                "and give fleet.nodes and fleet.spares (counts) instead"
            )
        if self.min_nodes is not None and self.min_nodes > self.fleet.nodes:
            raise ValueError(f"min_nodes: {self.min_nodes} is more than fleet.nodes")
        return self

    @model_validator(mode="before")
    @classmethod
    def _job_scoped_checkpoint_dir(cls, data: object) -> object:
        # Substituted here, while the name is the final one (parse_spec applies
        # --name before validation), so every JobSpec holds a concrete path.
        if not isinstance(data, dict):
            return data
        template = data.get("checkpoint_dir", DEFAULT_CHECKPOINT_DIR)
        name = data.get("name")
        if not isinstance(name, str):
            return data
        data = dict(data)
        if isinstance(template, str):
            data["checkpoint_dir"] = template.replace(JOB_ID_PLACEHOLDER, name)
        checkpoints = data.get("checkpoints")
        if isinstance(checkpoints, dict) and isinstance(checkpoints.get("durable_uri"), str):
            uri = checkpoints["durable_uri"].replace(JOB_ID_PLACEHOLDER, name)
            data["checkpoints"] = {**checkpoints, "durable_uri": uri}
        return data

    @field_validator("checkpoint_dir")
    @classmethod
    def _only_known_placeholders(cls, value: str) -> str:
        unknown = sorted(set(re.findall(r"\{[^}]*\}", value)) - {JOB_ID_PLACEHOLDER})
        if unknown:
            raise ValueError(
                f"unknown placeholder {', '.join(unknown)}; only {JOB_ID_PLACEHOLDER} "
                "(the job's name) is replaced"
            )
        if not value.strip():
            raise ValueError("must name a directory (or leave it out for checkpoints/{job_id})")
        return value

    @field_validator("playbook")
    @classmethod
    def _known_classes(cls, value: dict[str, ClassPolicy]) -> dict[str, ClassPolicy]:
        # ``straggler`` passes here only so that jobs started with it still decode:
        # ``parse_spec`` refuses it in a spec file (it was never read).
        unknown = sorted(set(value) - PLAYBOOK_CLASSES)
        if unknown:
            raise ValueError(
                f"unknown failure class {', '.join(map(repr, unknown))}; "
                f"choose from {', '.join(sorted(PLAYBOOK_CLASSES - {'straggler'}))}"
            )
        return value

    @field_validator("command")
    @classmethod
    def _no_empty_args(cls, value: list[str]) -> list[str]:
        if not value[0].strip():
            raise ValueError("the first element must name a program")
        return value

    @field_validator("env")
    @classmethod
    def _env_not_reserved(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            problem = _env_name_problem(key)
            if problem is not None:
                raise ValueError(problem)
            if SECRET_NAME_PATTERN.search(key):
                raise ValueError(secret_env_message(key))
        return value

    @field_validator("pass_env")
    @classmethod
    def _pass_env_names(cls, value: list[str]) -> list[str]:
        for name in value:
            problem = _env_name_problem(name)
            if problem is not None:
                raise ValueError(problem)
        twice = repeated(value)
        if twice:
            raise ValueError(f"names must be unique; repeated: {', '.join(twice)}")
        return value

    @field_validator("env_from_file")
    @classmethod
    def _env_file_path(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.strip() or "\x00" in value:
            raise ValueError("must name a file (absolute, or relative to workdir)")
        if value.startswith("~"):
            raise ValueError(
                "'~' is not expanded (the file is read on each node); give an absolute path "
                "or one relative to workdir"
            )
        return value

    @model_validator(mode="after")
    def _rejoin_on_local_nodes(self) -> JobSpec:
        if self.rejoin is None or not self.rejoin.enabled:
            return self
        launcher = self.nodes[0].launcher
        if launcher != "local":
            raise ValueError(
                f"rejoin: survivors rejoin in place on local nodes only; these nodes use "
                f"launcher {launcher}, where a recovery restarts the whole generation "
                "(remove the rejoin section)"
            )
        return self

    @model_validator(mode="after")
    def _env_sources_disjoint(self) -> JobSpec:
        both = sorted(set(self.env) & set(self.pass_env))
        if both:
            raise ValueError(f"pass_env: {', '.join(both)} is also set in env; keep one of them")
        return self

    @model_validator(mode="after")
    def _nodes_consistent(self) -> JobSpec:
        every = [*self.nodes, *self.spares]
        names = [n.name for n in every]
        duplicates = repeated(names)
        if duplicates:
            raise ValueError(f"nodes/spares: node names must be unique; repeated: {duplicates}")
        if len({n.launcher for n in every}) > 1:
            raise ValueError(
                "nodes/spares: all nodes must use the same launcher (local, ssh or slurm)"
            )
        if self.slurm is not None and self.slurm.submits:
            if self.nodes != [NodeSpec()] or self.spares:  # by value: as dumped, too
                raise ValueError(
                    "nodes/spares: with slurm.nodes Lazarus takes them from the allocation "
                    "it submits; remove them (or name an existing allocation: slurm.job_id)"
                )
            wanted = self.slurm.nodes or 0
            if self.min_nodes is not None and self.min_nodes > wanted:
                raise ValueError(f"min_nodes: {self.min_nodes} is more than slurm.nodes {wanted}")
            return self
        slurm_nodes = every[0].launcher == "slurm"
        if slurm_nodes and self.slurm is None:
            raise ValueError(
                "slurm: nodes use launcher slurm but the job names no allocation; "
                "add slurm: {job_id: <the allocation's job id>}"
            )
        if self.slurm is not None and not slurm_nodes:
            raise ValueError(
                f"slurm: set, but the nodes use launcher {every[0].launcher}; "
                "set launcher: slurm on every node, or remove the slurm section"
            )
        if self.min_nodes is not None and self.min_nodes > len(self.nodes):
            raise ValueError(
                f"min_nodes: {self.min_nodes} is more than the {len(self.nodes)} nodes listed"
            )
        return self

    @property
    def world_size(self) -> int:
        return len(self.nodes) * self.nproc_per_node

    @property
    def job_id(self) -> str:
        return self.name

    @property
    def warm(self) -> WarmStartSpec | None:
        """The warm-start settings when warm starts are on (the section is present
        and not ``enabled: false``), else None."""
        return self.warm_start if self.warm_start is not None and self.warm_start.enabled else None

    @property
    def rejoins(self) -> RejoinSpec | None:
        """The rejoin settings when rejoin in place is on, else None."""
        return self.rejoin if self.rejoin is not None and self.rejoin.enabled else None

    def in_allocation(self, job_id: int, names: list[str]) -> JobSpec:
        """Submit mode, once the allocation runs (the first, or a resubmitted one): the
        same job in Slurm job ``job_id``, its first ``slurm.nodes`` nodes training and
        the next ``slurm.spares`` held. The submit options stay (``slurm.submitted``),
        so a resubmission asks for the same."""
        assert self.slurm is not None and self.slurm.nodes is not None
        wanted = self.slurm.nodes + self.slurm.spares
        if len(names) < wanted:
            raise ValueError(f"slurm: job {job_id} holds {len(names)} nodes, not {wanted}")
        nodes = [slurm_node(n) for n in names[:wanted]]
        slurm = self.slurm.granted(job_id)
        return self.model_copy(
            update={
                "nodes": nodes[: self.slurm.nodes],
                "spares": nodes[self.slurm.nodes :],
                "slurm": slurm,
            }
        )

    def resolved(self, base: Path) -> JobSpec:
        """Return a copy whose relative paths are anchored at ``base`` (the spec's folder)."""
        workdir = (base / self.workdir).resolve()
        return self.model_copy(
            update={
                "workdir": str(workdir),
                "checkpoint_dir": str((workdir / self.checkpoint_dir).resolve()),
                "run_dir": str((workdir / self.run_dir).resolve()),
                "env_from_file": (
                    None if self.env_from_file is None else str(workdir / self.env_from_file)
                ),
                "ssh": self.ssh.model_copy(
                    update={"known_hosts": str(Path(self.ssh.known_hosts).expanduser())}
                ),
                "nodes": [_resolve_node(n, base) for n in self.nodes],
                "spares": [_resolve_node(n, base) for n in self.spares],
                "checkpoints": self.checkpoints.resolved(workdir),
            }
        )


def slurm_node(name: str) -> NodeSpec:
    """A node of a Slurm allocation, by the name Slurm gives it."""
    return NodeSpec(name=name, launcher="slurm", host=name)


def _resolve_node(node: NodeSpec, base: Path) -> NodeSpec:
    if node.identity_file is None:
        return node
    return node.model_copy(
        update={"identity_file": str((base / Path(node.identity_file).expanduser()).resolve())}
    )


class SpecError(Exception):
    """A spec that cannot run. ``lines`` each read ``file: field: what is wrong``."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def _field_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts) or "(top level)"


def _message(err: dict[str, object]) -> str:
    kind = err.get("type")
    msg = str(err.get("msg", "invalid"))
    if kind == "extra_forbidden":
        return "unknown field; check the spelling against the documented spec"
    if kind == "missing":
        return "required field is missing"
    return msg.removeprefix("Value error, ")


STRAGGLER_PLAYBOOK_REFUSED = (
    "a slow node is not handled by a playbook ladder: the straggler cost model decides "
    "(swap onto a spare only when the gain beats the restart cost); configure it in the "
    "'straggler' section instead (straggler.swap: false only records and alerts, "
    "straggler.default_restart_cost_s sets the assumed restart cost)"
)
"""Why ``playbook.straggler`` is refused in a spec file. The model itself still accepts
the key, so the input of a job started before the refusal still decodes (and replays);
it was never read."""


def _refused_fields(data: dict[object, object]) -> list[tuple[str, str]]:
    """Fields a spec file may not set although the model accepts them (see above)."""
    playbook = data.get("playbook")
    if isinstance(playbook, dict) and "straggler" in playbook:
        return [("playbook.straggler", STRAGGLER_PLAYBOOK_REFUSED)]
    return []


def parse_spec(data: object, source: str, name_override: str | None = None) -> JobSpec:
    """Validate already-parsed YAML; ``source`` names the file in error lines."""
    if not isinstance(data, dict):
        raise SpecError(
            [f"{source}: (top level): expected a mapping of fields, got {type(data).__name__}"]
        )
    if name_override is not None:
        data = {**data, "name": name_override}
    lines = [f"{source}: {field}: {why}" for field, why in _refused_fields(data)]
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        lines += [f"{source}: {_field_path(e['loc'])}: {_message(dict(e))}" for e in exc.errors()]
        raise SpecError(lines) from None
    if lines:
        raise SpecError(lines)
    return spec


def load_spec(path: str | Path, name_override: str | None = None) -> JobSpec:
    """Load, validate and resolve a YAML job spec, or raise :class:`SpecError`."""
    spec_path = Path(path)
    try:
        text = spec_path.read_text()
    except OSError as exc:
        raise SpecError([f"{spec_path}: cannot read the file: {exc.strerror or exc}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(unknown line)"
        raise SpecError([f"{spec_path}: {where}: not valid YAML: {exc}"]) from None
    spec = parse_spec(data, str(spec_path), name_override)
    resolved = spec.resolved(spec_path.parent.resolve())
    workdir = Path(resolved.workdir)
    if not workdir.is_dir():
        raise SpecError([f"{spec_path}: workdir: {workdir} does not exist or is not a directory"])
    return resolved
