"""The job spec's policy sections: preflight, health, recovery (and its per-class
playbook), stragglers, checkpoints, warm start, rejoin in place, and the fleet
lease."""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, Strict, field_validator, model_validator

from lazarus.domain.spec_base import JOB_NAME_PATTERN, _Strict, repeated


class PreflightSpec(_Strict):
    """Checked on every node, in parallel, before each launch; a failing node is
    replaced from the spares and never launched on."""

    min_free_disk_gb: Annotated[float, Field(ge=0)] = 0.0
    health_command: list[str] | None = None
    """Optional check that must exit 0, e.g. ``[nvidia-smi, -q]``; its nvidia-smi
    output, when present, is parsed for GPU count, ECC and Xid errors."""
    timeout_s: Annotated[float, Field(gt=0, le=600)] = 30.0


class HangBudgetSpec(_Strict):
    """How long a live rank may be silent before it is hung, below ``hang_timeout_s``.

    A fixed timeout is too long for a 0.1 s step (every hang costs all of it) and too
    short for a minute-long save; the supervisor therefore learns each job's rhythm:
    the seconds between a rank's progress marks (heartbeats, or ``progress_regex``
    steps), across every rank. Once ``min_intervals`` of them are seen, a rank outside
    a declared slow phase is hung after ``max(floor_s, multiplier x the quantile-th
    interval, 1.5 x the longest interval of the last ten minutes)`` (with progress
    from ``progress_regex`` lines alone, ``log_floor_s`` instead of ``floor_s``), never more than
    ``hang_timeout_s``; before that, and inside a slow phase the rank helper declared
    (a checkpoint save, an evaluation), ``hang_timeout_s`` applies. See
    docs/guides/detection.md."""

    mode: Literal["learned", "pinned", "off"] = "learned"
    """``learned`` (the default): as above. ``pinned``: ``pinned_s`` for every rank
    outside a slow phase, from the first progress on. ``off``: ``hang_timeout_s`` only,
    as before issue 38."""
    pinned_s: Annotated[float, Field(ge=0.5, le=86_400.0)] | None = None
    """With ``mode: pinned``: the allowed silence (capped by ``hang_timeout_s``)."""
    floor_s: Annotated[float, Field(ge=0.5, le=86_400.0)] = 2.0
    """The learned budget is never below this: a loaded machine (or one garbage
    collection) can hold a healthy rank back a second or two."""
    multiplier: Annotated[float, Field(ge=1.0, le=1000.0)] = 4.0
    """How many times the quantile-th interval a rank may be silent."""
    quantile: Annotated[float, Field(gt=0.5, le=1.0)] = 0.99
    """Which quantile of the recent intervals sets the budget (0.99: one interval in a
    hundred may be slower, and is still within budget by the multiplier)."""
    log_floor_s: Annotated[float, Field(ge=0.5, le=86_400.0)] = 10.0
    """The learned budget's floor when progress comes only from ``progress_regex`` lines
    (a script that does not use ``lazarus.rank``): such a script cannot declare a slow
    phase, so its saves, evaluations and data-loader stalls are all undeclared pauses,
    and with ``floor_s`` alone the first of each would be called a hang. Pauses up to
    about this long are safe from the first one on; longer ones are learned after
    their first occurrence (the longest-interval term, and the back-off after a
    hang). Set it to ``floor_s`` for the tightest budget a plain script can have."""
    min_intervals: Annotated[int, Field(ge=5, le=100_000)] = 10
    """Intervals to see (after each rank's first few, its warm-up) before the learned
    budget applies; until then ``hang_timeout_s``."""

    @model_validator(mode="after")
    def _pinned_has_a_value(self) -> HangBudgetSpec:
        if self.mode == "pinned" and self.pinned_s is None:
            raise ValueError("mode: pinned needs pinned_s (the allowed silence, in seconds)")
        return self


class HealthSpec(_Strict):
    """How Lazarus decides a rank is unhealthy, in seconds."""

    hang_timeout_s: Annotated[float, Field(ge=2.0, le=86_400.0)] = 60.0
    """The longest a live rank may go without progress: the upper bound of the learned
    budget (``hang_budget``) and of every slow phase, and the whole allowance while the
    budget is still learning, or with ``hang_budget.mode: off``."""

    hang_budget: HangBudgetSpec = Field(default_factory=HangBudgetSpec)
    """The learned, per-job hang budget (issue 38): hangs found in seconds."""

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

    The spec validates ladders against it; ``workflows.playbook`` registers
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
    memory_replicas: bool = False
    """With the memory tier on a job of two or more nodes: each node's committed
    snapshot is also pushed, in the background, to one buddy (the next node in slot
    order, a ring), so a node loss resumes the spare from the buddy's replica instead
    of a disk checkpoint. RAM: ``memory_keep`` more copies of the state per node."""
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
    def _replicas_need_the_memory_tier(self) -> CheckpointsSpec:
        if self.memory_replicas and self.memory_every_steps is None:
            raise ValueError("memory_replicas: true needs the memory tier (set memory_every_steps)")
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

    Hangs, node losses (unless ``node_loss``), and anything the playbook answers
    other than a restart in place or a node replacement restart the whole generation;
    the incident says which path was taken."""

    enabled: bool = True
    timeout_s: Annotated[float, Field(ge=1.0, le=3600.0)] = 60.0
    """How long a survivor waits for the controller's rejoin request, and how long
    the controller waits for a survivor to act for the new generation before it
    stops the whole generation and starts it afresh."""
    node_loss: bool = False
    """Rejoin after a whole node is lost too: its ranks start on the spare, every other
    rank keeps its process. Off by default, because a host that dies closes no socket:
    its peers stay blocked in their collective until the process group's timeout
    (30 minutes by default in torch) before they can tear down and rejoin, while a
    whole-generation restart (warm from each node's zygote, from the memory tier or a
    buddy's replica) takes seconds. Turn it on when the script's collective timeout
    (``init_process_group(timeout=...)``) is well under ``timeout_s``, or when ranks
    abort their NCCL communicators on a watchdog of their own."""


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
