"""The job spec: what a user writes in YAML, validated strictly before anything starts.

A bad spec must never start half a job, so :func:`load_spec` either returns a
fully resolved :class:`JobSpec` (every path absolute) or raises
:class:`SpecError`, whose lines read ``file: field: what is wrong`` so the user
can fix the exact field. The spec travels into the workflow as its input, which
lands in Temporal history: it must hold paths to secrets, never secrets.

The section models live in :mod:`lazarus.domain.spec_nodes` (where the job runs) and
:mod:`lazarus.domain.spec_sections` (the policy sections), on the shared base of
:mod:`lazarus.domain.spec_base`; this module re-exports them (``__all__``), so
``from lazarus.domain.spec import HealthSpec`` is what it always was.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from lazarus.domain import environment as env_names
from lazarus.domain.config_errors import (
    LineOf,
    described,
    error_lines,
    field_line,
    flow_list,
    no_lines,
    with_line,
    yaml_lines,
)
from lazarus.domain.failure_classes import PLAYBOOK_CLASSES
from lazarus.domain.spec_base import JOB_NAME_PATTERN, _Strict, job_name_problem, repeated
from lazarus.domain.spec_nodes import (
    PREEMPT_MARKER_PREFIX,
    NodeSpec,
    SlurmSpec,
    SSHSpec,
    _resolve_node,
    slurm_node,
)
from lazarus.domain.spec_sections import (
    MAX_STANDBY,
    MODULE_NAME_PATTERN,
    S3_BUCKET_PATTERN,
    CheckpointsSpec,
    ClassPolicy,
    FleetLeaseSpec,
    HangBudgetSpec,
    HealthSpec,
    PreflightSpec,
    RecoverySpec,
    RejoinSpec,
    StragglerSpec,
    StrategyName,
    WarmStartSpec,
)

__all__ = [
    "DEFAULT_CHECKPOINT_DIR",
    "ENV_NAME_PATTERN",
    "JOB_ID_PLACEHOLDER",
    "JOB_NAME_PATTERN",
    "MAX_STANDBY",
    "MODULE_NAME_PATTERN",
    "PREEMPT_MARKER_PREFIX",
    "RESERVED_ENV",
    "S3_BUCKET_PATTERN",
    "SECRET_NAME_PATTERN",
    "STRAGGLER_PLAYBOOK_REFUSED",
    "CheckpointsSpec",
    "ClassPolicy",
    "FleetLeaseSpec",
    "HangBudgetSpec",
    "HealthSpec",
    "JobSpec",
    "NodeSpec",
    "PreflightSpec",
    "RecoverySpec",
    "RejoinSpec",
    "SSHSpec",
    "SlurmSpec",
    "SpecError",
    "StragglerSpec",
    "StrategyName",
    "WarmStartSpec",
    "checks_workdir_here",
    "load_spec",
    "parse_spec",
    "repeated",
    "secret_env_message",
    "slurm_node",
    "yaml_lines",
]

JOB_ID_PLACEHOLDER = "{job_id}"
DEFAULT_CHECKPOINT_DIR = "checkpoints/{job_id}"
"""Relative to ``workdir``: checkpoints are per job unless a spec says otherwise."""

RESERVED_ENV = frozenset(
    {
        env_names.RANK,
        env_names.LOCAL_RANK,
        env_names.WORLD_SIZE,
        env_names.LOCAL_WORLD_SIZE,
        env_names.GROUP_RANK,
        env_names.GROUP_WORLD_SIZE,
        env_names.ROLE_NAME,
        env_names.ROLE_RANK,
        env_names.ROLE_WORLD_SIZE,
        env_names.MASTER_ADDR,
        env_names.MASTER_PORT,
        env_names.RESTART_COUNT,
        env_names.MAX_RESTARTS,
        env_names.RUN_ID,
        env_names.USE_AGENT_STORE,
    }
)
"""Variables the launcher owns (every one torchrun's agent sets with a fixed meaning);
a spec that set them would break rendezvous or fencing, or lie to a framework about
its launch. ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` and ``OMP_NUM_THREADS`` are not here:
torchrun keeps a user's value for them, and so does Lazarus."""

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


def _spec_env_problem(name: str) -> str | None:
    """What is wrong with ``name`` in a spec's ``env`` (the job's or a node's), or None."""
    problem = _env_name_problem(name)
    if problem is None and SECRET_NAME_PATTERN.search(name):
        return secret_env_message(name)
    return problem


def _env_name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a variable a spec supplies, or None."""
    if name in RESERVED_ENV or name.startswith("LAZARUS_"):
        return f"{name} is set by Lazarus for every rank; remove it"
    if not ENV_NAME_PATTERN.fullmatch(name):
        return f"{name!r} is not a valid environment variable name"
    return None


class JobSpec(_Strict):
    """A training job. Paths are absolute once :func:`load_spec` has resolved them."""

    name: str = Field(pattern=JOB_NAME_PATTERN)
    command: list[str] = Field(min_length=1)
    """The program and its arguments as a YAML list, ``[python, train.py, --steps,
    "300"]``: not one string, and numbers quoted. On local nodes ``lazarus start``
    refuses a program it cannot find; one missing on every node fails the job (fix
    ``command``) and quarantines no node."""
    workdir: str = "."
    """Where the ranks run, relative to the spec's folder. Checked on the CLI's
    machine only when every node is local; ssh and Slurm nodes check it themselves
    (the preflight), since the code may exist only there."""
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
    """A node silent this long since its last answer is dead (its ranks may still run: it
    is fenced)."""
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
            problem = _spec_env_problem(key)
            if problem is not None:
                raise ValueError(problem)
        return value

    @field_validator("nodes", "spares")
    @classmethod
    def _node_env_not_reserved(cls, value: list[NodeSpec]) -> list[NodeSpec]:
        for node in value:
            for key in node.env:
                problem = _spec_env_problem(key)
                if problem is not None:
                    raise ValueError(f"node {node.name}: env: {problem}")
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
    def _rejoin_where_nodes_carry(self) -> JobSpec:
        """Every launcher's nodes carry survivors (``NodeAgent.carry_survivors``), but
        on Slurm only ranks forked from the node's zygote: a cold rank runs in its
        generation's job step, which the next generation's launch cancels (the fencing
        that guarantees an older generation is gone), so it cannot outlive it; a forked
        rank runs in the zygote's step, which lives as long as the run."""
        if self.rejoin is None or not self.rejoin.enabled:
            return self
        if self.nodes[0].transport.scheduled and self.warm is None:
            raise ValueError(
                "rejoin: on Slurm nodes a survivor must be a rank forked from its node's "
                "zygote, which needs warm_start: a cold rank runs in its generation's job "
                "step, which the next launch cancels, so it cannot rejoin; add a "
                "warm_start section (or remove the rejoin section)"
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
        slurm_nodes = every[0].transport.scheduled
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


class SpecError(Exception):
    """A spec that cannot run. ``lines`` each read ``file: field: what is wrong``."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


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
    """Fields a spec file may not set although the model accepts them (see above, and
    :func:`~lazarus.domain.spec_base.job_name_problem`)."""
    refused: list[tuple[str, str]] = []
    name = data.get("name")
    problem = job_name_problem(name) if isinstance(name, str) else None
    if problem is not None:
        refused.append(("name", problem))
    playbook = data.get("playbook")
    if isinstance(playbook, dict) and "straggler" in playbook:
        refused.append(("playbook.straggler", STRAGGLER_PLAYBOOK_REFUSED))
    return refused


TORCHRUN_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})
_TORCHRUN_FLAGS = frozenset({"--standalone", "--no_python", "--no-python", "--run_path",
                             "--run-path", "-m", "--module"})  # fmt: skip
"""torchrun's options that take no value (every other option takes one)."""
_TORCHRUN_SETTINGS = {
    "nproc_per_node": "nproc_per_node: {}",
    "max_restarts": "recovery.max_restarts: {}",
    "nnodes": "one entry under nodes per node ({})",
}


def _torchrun_args(command: list[str]) -> list[str] | None:
    """torchrun's arguments when ``command`` runs torchrun (``torchrun ...``, ``python -m
    torch.distributed.run ...``, the older ``torch.distributed.launch``), else None."""
    if Path(command[0]).name == "torchrun":
        return command[1:]
    if len(command) > 2 and command[1] == "-m" and command[2] in TORCHRUN_MODULES:
        return command[3:]
    return None


def _torchrun_fix(command: list[str]) -> str | None:
    """Why a command that runs torchrun is refused, and the spec that replaces it: Lazarus
    is the launcher, so torchrun inside each rank would start ranks of ranks."""
    args = _torchrun_args(command)
    if args is None:
        return None
    settings: list[str] = []
    dropped: list[str] = []
    module = False
    i = 0
    while i < len(args) and args[i].startswith("-"):
        option, has_value, value = args[i].partition("=")
        if option in ("-m", "--module"):
            module = True
        elif option not in _TORCHRUN_FLAGS and not has_value and i + 1 < len(args):
            i += 1
            value = args[i]
        name = option.lstrip("-").replace("-", "_")
        if name in _TORCHRUN_SETTINGS and value:
            settings.append(_TORCHRUN_SETTINGS[name].format(value))
        elif option not in ("-m", "--module"):
            dropped.append(option)
        i += 1
    script = ["python", "-m", *args[i:]] if module else ["python", *args[i:]]
    fix = f"command: {flow_list(script)}"
    fix += "".join(f"; {setting}" for setting in settings)
    if dropped:
        fix += f" ({', '.join(dropped)}: set by Lazarus, leave them out)"
    return (
        "runs torchrun, but Lazarus is the launcher: it starts every rank itself with "
        "torchrun's environment, so torchrun here would start ranks inside each rank; "
        f"drop torchrun and write {fix}"
    )


def _refusal_lines(data: dict[object, object], source: str, line_of: LineOf) -> list[str]:
    """:func:`_refused_fields` plus a command that runs torchrun, each ``source: field:
    why (line N)``."""
    refused = _refused_fields(data)
    command = data.get("command")
    if isinstance(command, list) and command and all(isinstance(a, str) for a in command):
        fix = _torchrun_fix(command)
        if fix is not None:
            refused.append(("command", fix))
    return [
        f"{source}: {field}: {why}{with_line(field_line(field, line_of))}" for field, why in refused
    ]


def _except_name(line_of: LineOf) -> LineOf:
    """``line_of`` without the file's ``name``, which ``--name`` replaced."""
    return lambda loc: None if loc == ("name",) else line_of(loc)


def parse_spec(
    data: object, source: str, name_override: str | None = None, line_of: LineOf = no_lines
) -> JobSpec:
    """Validate already-parsed YAML; ``source`` names the file in error lines, and
    ``line_of`` (:func:`yaml_lines`) ends each with the line its field came from, so
    a line still reads ``file: field: what is wrong`` first. A bad ``name_override``
    (``--name``) is blamed on ``--name``, not on the file."""
    if not isinstance(data, dict):
        what = "the file is empty" if data is None else f"got {described(data)}"
        raise SpecError([f"{source}: (top level): expected a mapping of fields; {what}"])
    if name_override is not None:
        data = {**data, "name": name_override}
        line_of = _except_name(line_of)
    lines = _refusal_lines(data, source, line_of)
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        lines += error_lines(exc, source, JobSpec, line_of)
    if name_override is not None:
        lines = [line.replace(f"{source}: name: ", "--name: ", 1) for line in lines]
    if lines:
        raise SpecError(lines)
    return spec


def checks_workdir_here(spec: JobSpec) -> bool:
    """Whether this machine can check ``workdir``: only when every node is this machine
    (local nodes, neither a fleet nor a Slurm allocation). An ssh or Slurm job's code
    may exist only on its nodes; the preflight checks it there, on each node."""
    return (
        spec.fleet is None
        and spec.slurm is None
        and all(node.transport.runs_here for node in (*spec.nodes, *spec.spares))
    )


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
        detail = str(exc).replace('"<unicode string>"', str(spec_path))
        raise SpecError([f"{spec_path}: {where}: not valid YAML: {detail}"]) from None
    spec = parse_spec(data, str(spec_path), name_override, yaml_lines(text))
    resolved = spec.resolved(spec_path.parent.resolve())
    workdir = Path(resolved.workdir)
    if checks_workdir_here(resolved) and not workdir.is_dir():
        line = with_line(yaml_lines(text)(("workdir",)))
        raise SpecError(
            [f"{spec_path}: workdir: {workdir} does not exist or is not a directory{line}"]
        )
    return resolved
