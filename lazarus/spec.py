"""The job spec: what a user writes in YAML, validated strictly before anything starts.

A bad spec must never start half a job, so :func:`load_spec` either returns a
fully resolved :class:`JobSpec` (every path absolute) or raises
:class:`SpecError`, whose lines read ``file: field: what is wrong`` so the user
can fix the exact field. The spec travels into the workflow as its input, which
lands in Temporal history: it must hold paths to secrets, never secrets.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from lazarus import environment as env_names

JOB_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"

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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class NodeSpec(_Strict):
    """One machine that hosts ranks. Only the local launcher exists so far."""

    name: str = Field(default="local", pattern=r"^[A-Za-z0-9._-]+$")
    launcher: Literal["local"] = "local"
    host: str = "127.0.0.1"


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
    stop_grace_s: Annotated[float, Field(ge=0, le=600)] = 10.0
    """SIGTERM, then this long, then SIGKILL for the whole process group."""

    @model_validator(mode="after")
    def _backoff_ordered(self) -> RecoverySpec:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("backoff_max_s must be >= backoff_initial_s")
        return self


class JobSpec(_Strict):
    """A training job. Paths are absolute once :func:`load_spec` has resolved them."""

    name: str = Field(pattern=JOB_NAME_PATTERN)
    command: list[str] = Field(min_length=1)
    workdir: str = "."
    env: dict[str, str] = Field(default_factory=dict)
    nodes: list[NodeSpec] = Field(default_factory=lambda: [NodeSpec()], min_length=1)
    nproc_per_node: Annotated[int, Field(ge=1, le=1024)] = 1
    checkpoint_dir: str
    run_dir: str = ".lazarus/runs"
    """Where each generation's pid, log, heartbeat and exit-status files live."""
    health: HealthSpec = Field(default_factory=HealthSpec)
    recovery: RecoverySpec = Field(default_factory=RecoverySpec)

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
            if key in RESERVED_ENV or key.startswith("LAZARUS_"):
                raise ValueError(f"{key} is set by Lazarus for every rank; remove it")
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
        return value

    @field_validator("nodes")
    @classmethod
    def _single_local_node(cls, value: list[NodeSpec]) -> list[NodeSpec]:
        if len(value) != 1:
            raise ValueError("only one local node is supported until the ssh launcher lands")
        return value

    @property
    def world_size(self) -> int:
        return len(self.nodes) * self.nproc_per_node

    @property
    def job_id(self) -> str:
        return self.name

    def resolved(self, base: Path) -> JobSpec:
        """Return a copy whose relative paths are anchored at ``base`` (the spec's folder)."""
        workdir = (base / self.workdir).resolve()
        return self.model_copy(
            update={
                "workdir": str(workdir),
                "checkpoint_dir": str((workdir / self.checkpoint_dir).resolve()),
                "run_dir": str((workdir / self.run_dir).resolve()),
            }
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


def parse_spec(data: object, source: str, name_override: str | None = None) -> JobSpec:
    """Validate already-parsed YAML; ``source`` names the file in error lines."""
    if not isinstance(data, dict):
        raise SpecError(
            [f"{source}: (top level): expected a mapping of fields, got {type(data).__name__}"]
        )
    if name_override is not None:
        data = {**data, "name": name_override}
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        lines = [f"{source}: {_field_path(e['loc'])}: {_message(dict(e))}" for e in exc.errors()]
        raise SpecError(lines) from None


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
