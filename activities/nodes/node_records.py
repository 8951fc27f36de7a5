"""The records a node's own side reads and answers: rank launches, carries, stops.

Kept apart from :mod:`activities.nodes.agent` (the interface, which needs the job's
spec) because the node-side entry points import them on a recovery's critical path:
``python -m activities.nodes.carry`` runs on an ssh node between a crash and the
survivors' rejoin, and each import there is interpreter start-up the job waits for
(the spec and the workflow contracts cost about a second on a loaded node)."""

from __future__ import annotations

import json
from typing import BinaryIO, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lazarus.domain.process_groups import UnkillableGroup


class NodeRecord(BaseModel):
    """Every record that crosses the node interface: closed and immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


RecordT = TypeVar("RecordT", bound=NodeRecord)


class RankLaunch(NodeRecord):
    """Everything a node needs to start one rank; the env is complete (torchrun + LAZARUS_*)."""

    rank: int
    command: list[str]
    env: dict[str, str]
    workdir: str
    env_file: str | None = None
    """``env_from_file`` for the node to read itself (ssh nodes): its values go under
    ``env``, and never leave the node."""


class StartedRank(NodeRecord):
    rank: int
    pid: int
    pgid: int
    start_ticks: int
    log_file: str
    adopted: bool = False
    """The rank was already running (a retried launch): nothing new was started."""
    warm: bool = False
    """Forked from the node's zygote (``warm_start``), not started by a fresh interpreter."""
    from_standby: bool = False
    """Warm, and handed to an idle pre-forked process: no fork on the critical path."""
    cold_reason: str | None = None
    """With ``warm_start`` on: why this rank was started cold."""
    started_at: float | None = None
    """When its process started (the pid file's ``started_at``), where the node says."""


class WarmStart(NodeRecord):
    """``warm_start`` for one launch on one node: where the run's zygotes live and
    what they preload."""

    run_root: str
    preload: list[str]
    standby: int


class WarmRankRequest(NodeRecord):
    rank: int = Field(ge=0)
    command: list[str] = Field(min_length=1)
    env: dict[str, str]
    """The rank's environment without the ``env_file`` values (read on the node)."""
    workdir: str


class NodeWarmRequest(NodeRecord):
    """Every rank of one node's launch, for ``python -m activities.nodes.warm``
    (one JSON object on its stdin)."""

    gen_dir: str
    node: str
    run_root: str
    preload: list[str]
    standby: int = Field(ge=0)
    env_file: str | None = None
    """``env_from_file``, read here on the node, below each rank's ``env``."""
    start_zygote: bool = True
    """False on Slurm: the node's agent starts the zygote as its own job step."""
    ranks: list[WarmRankRequest]
    prewarm: bool = False
    """Only start the node's zygote (:func:`prewarm_zygote`, not waiting for it to
    serve) with the environment of the one rank in ``ranks``, which is not started:
    a spare's. Answers one :class:`PrewarmAnswer` line."""


class CarryRequest(NodeRecord):
    """One node's part of a launch with ``rejoin`` (:meth:`NodeAgent.carry_survivors`):
    carry ``ranks`` of the previous generation into ``generation`` in their own
    process, and fence every other rank of the older generations on this node."""

    run_root: str
    """The run whose older generations are fenced (all but the carried groups)."""
    previous_gen_dir: str
    """The newest older generation: the survivors' pid files, and the control file
    they read their rejoin request from."""
    gen_dir: str
    """The new generation: the survivors' records are linked into it."""
    generation: int
    ranks: list[int]
    """This node's ranks to carry (the launcher gives each node its own slots)."""
    env: dict[int, dict[str, str | None]] = Field(default_factory=dict)
    """Per rank of ``ranks``, the rejoin variables of its new environment
    (:data:`lazarus.domain.environment.REJOIN_VARIABLES`; null: unset)."""
    node: str | None = None
    """Fence only the ranks this logical node launched (local nodes share one run
    directory); None: every rank of the run directory (a node of its own)."""
    kill_wait_s: float = 10.0
    lock_timeout_s: float = 10.0
    program: str = "python"
    """The ranks' interpreter (their command's program): a node that runs the carry
    in a process of its own (the shim's ``rejoin``) runs Lazarus with it."""
    workdir: str = "/"
    search_path: str = ""
    """The ranks' PATH, where ``program`` is found."""
    python_path: str = ""
    """The ranks' PYTHONPATH, from which Lazarus is imported."""
    start: NodeWarmRequest | None = None
    """Then, in the same process on the node, start these ranks warm, less those the
    carry carried (:func:`activities.nodes.warm_starts.answer_start`); none when the fencing
    left a group alive. One interpreter start and one round trip instead of two
    between a crash and the replacement's fork (``NodeAgent.carry_and_start``).
    Left out of the JSON when None, so a node with older code still reads the carry."""


class CarryResult(NodeRecord):
    carried: list[StartedRank] = Field(default_factory=list)
    """The survivors, carried into the new generation (their records linked there)."""
    refused: list[str] = Field(default_factory=list)
    """One line per asked-for rank that was not carried (it starts afresh): why."""
    unkillable: list[UnkillableGroup] = Field(default_factory=list)
    """Groups of older generations the fencing could not kill."""


class NodeStopResult(NodeRecord):
    node: str
    reachable: bool
    error: str | None = None
    signalled_groups: int = 0
    killed_groups: int = 0
    last_step: int | None = None
    generations: list[int] = Field(default_factory=list)
    unkillable: list[UnkillableGroup] = Field(default_factory=list)
    """Groups still alive ``kill_wait_s`` after SIGKILL: reported, never waited on forever."""


def field_problems(exc: ValidationError) -> str:
    """A bad node request's problems: field names and messages, never the values (a
    value may be a secret: the ranks' environments travel in these requests)."""
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg']}" for e in exc.errors()
    )


class NodeAnswers:
    """What a node-side verb (``rejoin``, ``warm``) answers: JSON lines on ``out``, each
    written and flushed whole, so a relay copies them as they come."""

    def __init__(self, verb: str, out: BinaryIO) -> None:
        self.verb, self.out = verb, out

    def say(self, line: str) -> None:
        self.out.write(line.encode() + b"\n")
        self.out.flush()

    def error(self, message: str) -> None:
        self.say(json.dumps({"error": f"{self.verb}: {message}"}))

    def request(self, model: type[RecordT], stdin: bytes) -> RecordT | None:
        """``stdin`` as ``model``, or None once the error naming its bad fields is said."""
        try:
            return model.model_validate_json(stdin)
        except ValidationError as exc:
            self.error(f"bad request on stdin: {field_problems(exc)}")
            return None
