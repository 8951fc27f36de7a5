"""What a client asks a worker to do for it, and the answers: typed calls for the work
that needs the nodes, the checkpoint store or the worker's own environment.

The CLI is a client (issue 40, part 2): it never runs activity code. What it used to run
in its own process goes to a worker as one short workflow
(:class:`workflows.worker_call.WorkerCallWorkflow`, a step in its history) that runs one
activity and returns its answer:

- :class:`StartCheckRequest`: what ``lazarus start`` checks before the job exists (a
  local program, ssh nodes, a Slurm allocation), ``--fresh``'s set-aside, the resume
  point it announces, and for ``--dry-run`` the plan of each node and rank as the worker
  that would launch them makes it;
- :class:`ListCheckpointsRequest`: ``lazarus checkpoints``;
- :class:`VerifyCheckpointsRequest`: ``lazarus verify``;
- :class:`ReadLogRequest` and :class:`RanksEndedRequest`: ``lazarus logs`` of a rank on
  an ssh or Slurm node, read by offset through the node's agent on the worker.

The checks run where the launch will run, with the worker's PATH, ssh configuration,
Slurm client and store credentials, so what they say holds for the launch. Pure models:
the worker makes them, the app renders them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from lazarus.domain.checkpoint_views import CheckpointListing, ResumePlan, SetAside
from lazarus.domain.contracts import CheckpointVerification
from lazarus.domain.spec import JobSpec
from lazarus.domain.spec_nodes import NodeSpec, SlurmSpec, SSHSpec

WORKER_CALL_WORKFLOW = "LazarusWorkerCall"
"""The workflow type of a client's call (ids ``lazarus-call-<kind>-<random>``)."""
WORKER_CALL_ID_PREFIX = "lazarus-call-"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodePlan(_Model):
    """One node of the first generation, as the launch will use it (``--dry-run``)."""

    name: str
    launcher: str
    address: str
    """What the other nodes reach it by (``MASTER_ADDR`` when it is the first)."""
    login: str | None = None
    """ssh: ``user@host:port``, with ``via`` the jump hosts (``ProxyJump``)."""
    python: str | None = None
    """The node's own interpreter for Lazarus's node-side work (ssh, Slurm)."""
    ranks: list[int] = Field(default_factory=list)
    runs: list[str] = Field(default_factory=list)
    """The command line the node runs for its ranks (Slurm: the step's ``srun``)."""
    note: str = ""


class StartCheckRequest(_Model):
    """``lazarus start``'s checks, run by a worker before the job's workflow exists."""

    kind: Literal["start_checks"] = "start_checks"
    spec: JobSpec
    spec_file: str
    """How the user named the spec: every problem line starts with it."""
    check_nodes: bool = True
    """Check the program (local nodes) and reach every ssh node; ``--no-check-nodes``."""
    fresh: bool = False
    """``--fresh``: set the checkpoints aside (not on a dry run: it says what it would do)."""
    dry_run: bool = False
    """Plan only: contact no node and no scheduler, move nothing, and return the plan."""


class StartCheckResult(_Model):
    kind: Literal["start_checks"] = "start_checks"
    problems: list[str] = Field(default_factory=list)
    """Bad input, one line each naming the spec file and field: the start is refused
    (exit code 2), nothing was moved or started."""
    refusal: str | None = None
    """``--fresh`` cannot keep its promise (the durable tier would still resume the job)."""
    warnings: list[str] = Field(default_factory=list)
    """Worth saying, not refusing for (a spare that cannot be reached)."""
    set_aside: list[SetAside] = Field(default_factory=list)
    resume: ResumePlan | None = None
    """Where the first launch would resume; None with ``--fresh`` or when unreadable."""
    resume_unreadable: str | None = None
    """Why the checkpoint directory could not be inspected (the notice is advice only)."""
    ranks: list[dict[str, str]] = Field(default_factory=list)
    """Dry run: each rank's environment as the launcher sets it (placeholders in <...>)."""
    nodes: list[NodePlan] = Field(default_factory=list)
    submit: list[str] | None = None
    """Dry run, Slurm submit mode: the holder's ``sbatch`` line."""


class ListCheckpointsRequest(_Model):
    kind: Literal["list_checkpoints"] = "list_checkpoints"
    checkpoint_dir: str | None = None
    durable_uri: str | None = None
    endpoint_url: str | None = None
    hashes: bool = False


class ListCheckpointsResult(_Model):
    kind: Literal["list_checkpoints"] = "list_checkpoints"
    rows: list[CheckpointListing] = Field(default_factory=list)
    input_error: str | None = None
    """A path or URI that names nothing usable (exit code 2)."""
    store_error: str | None = None
    """The durable store could not be read (exit code 2)."""


class VerifyCheckpointsRequest(_Model):
    kind: Literal["verify_checkpoints"] = "verify_checkpoints"
    target: str
    endpoint_url: str | None = None
    sizes_only: bool = False
    world_size: int | None = None


class VerifyCheckpointsResult(_Model):
    kind: Literal["verify_checkpoints"] = "verify_checkpoints"
    results: list[CheckpointVerification] = Field(default_factory=list)
    input_error: str | None = None
    store_error: str | None = None


class _OnNode(_Model):
    node: NodeSpec
    """The node, as the job's spec names it (how the worker reaches it)."""
    ssh: SSHSpec
    slurm: SlurmSpec | None = None
    gen_dir: str
    """The generation's folder on the node."""


class ReadLogRequest(_OnNode):
    """At most ``max_bytes`` of ``rank-<rank>.log`` from byte ``offset``."""

    kind: Literal["read_log"] = "read_log"
    rank: int
    offset: int = 0
    max_bytes: int


class ReadLogResult(_Model):
    model_config = ConfigDict(
        extra="forbid", frozen=True, ser_json_bytes="base64", val_json_bytes="base64"
    )

    kind: Literal["read_log"] = "read_log"
    data: bytes = b""
    size: int | None = None
    """None: no such log on the node."""
    mtime: float | None = None
    error: str | None = None
    """The node could not be read (unreachable, refused): one line."""


class RanksEndedRequest(_OnNode):
    """Whether every one of ``ranks`` has ended on the node (``logs --follow``)."""

    kind: Literal["ranks_ended"] = "ranks_ended"
    ranks: list[int]


class RanksEndedResult(_Model):
    kind: Literal["ranks_ended"] = "ranks_ended"
    ended: bool = False
    error: str | None = None
    """The node stopped answering."""


WorkerRequest = Annotated[
    StartCheckRequest
    | ListCheckpointsRequest
    | VerifyCheckpointsRequest
    | ReadLogRequest
    | RanksEndedRequest,
    Field(discriminator="kind"),
]
WorkerAnswer = Annotated[
    StartCheckResult
    | ListCheckpointsResult
    | VerifyCheckpointsResult
    | ReadLogResult
    | RanksEndedResult,
    Field(discriminator="kind"),
]


class WorkerCall(_Model):
    """The call workflow's input: one request."""

    request: WorkerRequest


class WorkerReply(_Model):
    """The call workflow's result: the answer of the request's activity."""

    answer: WorkerAnswer
