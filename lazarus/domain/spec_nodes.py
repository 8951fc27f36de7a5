"""Where a job runs: its nodes (``local``, ``ssh`` or ``slurm``), how SSH reaches
them, and the Slurm allocation that holds them (``slurm:``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from lazarus.domain.compact_form import CompactForm
from lazarus.domain.spec_base import _Strict
from lazarus.domain.transports import Transport, transport


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
    python: str | None = None
    """The node's own interpreter for Lazarus's node-side work: a Slurm node's task
    (``python -m lazarus.rank.slurm_task``), an ssh node's replica restore. It needs
    ``lazarus-rank`` (standard library only) and nothing of the controller. None: the
    job's ``ssh.python`` or ``slurm.python`` (default ``python3``, found on the
    ranks' PATH on the node)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Plain settings for this node's ranks, over the job's ``env`` (e.g. ``PATH``,
    ``NCCL_SOCKET_IFNAME``). Stored in workflow history like ``env``: the same names
    are refused (checked by the job spec)."""

    @field_validator("python")
    @classmethod
    def _python_is_a_program(cls, value: str | None) -> str | None:
        return python_problem(value)

    def node_python(self, default: str) -> str:
        """The interpreter for this node's node-side work (``python``, else ``default``)."""
        return self.python or default

    @property
    def transport(self) -> Transport:
        """What its launcher is (:mod:`lazarus.domain.transports`): code outside the
        node layer asks this, never the launcher's name."""
        return transport(self.launcher)


def python_problem(value: str | None) -> str | None:
    """``value`` unless it cannot name a program (empty, blanks, a newline)."""
    if value is not None and (not value.strip() or any(c.isspace() for c in value)):
        raise ValueError(
            f"{value!r} is not a program: give an interpreter's name (python3) or its "
            "absolute path on the node (/opt/venv/bin/python)"
        )
    return value


class SSHSpec(_Strict):
    known_hosts: str = "~/.ssh/known_hosts"
    accept_new_host_keys: bool = False
    """Trust-on-first-use: add unknown host keys to ``known_hosts``. Off by default;
    a changed key is refused even when this is on."""
    connect_timeout_s: Annotated[float, Field(gt=0, le=120)] = 5.0
    command_timeout_s: Annotated[float, Field(gt=0, le=600)] = 5.0
    """A status poll with no answer this long marks the node unreachable for that poll."""
    use_agent: bool = True
    config: str | None = "~/.ssh/config"
    """OpenSSH's client configuration, read for each ssh node's ``host`` as ``ssh``
    would: ``HostName``, ``User``, ``Port``, ``IdentityFile`` and ``ProxyJump``
    (one jump host or a chain, each reached with the same key rules and host-key
    checks). The node's own ``user``, ``port`` (other than 22) and
    ``identity_file`` win. A missing file is no error; None: none is read."""
    python: str = "python3"
    """The nodes' interpreter for Lazarus's node-side work (``nodes[].python`` wins),
    found on the ranks' PATH on the node; it needs only ``lazarus-rank``."""

    @field_validator("python")
    @classmethod
    def _python_is_a_program(cls, value: str) -> str:
        python_problem(value)
        return value


class ContainerSpec(_Strict):
    """The container each rank's Slurm task runs in (``slurm.container``). The run
    directory, ``checkpoint_dir`` and ``workdir`` must be at the same paths inside
    (``mounts``), and the image must hold ``slurm.python`` with ``lazarus-rank``."""

    runtime: Literal["pyxis", "apptainer"] = "pyxis"
    """``pyxis``: ``srun --container-image`` (pyxis + enroot; refused where this
    Slurm's ``srun --help`` lacks the option). ``apptainer``: each task is
    ``apptainer exec [--nv] [--bind M]... IMAGE python -m lazarus.rank.slurm_task``
    (``apptainer`` must be on the ranks' PATH on the node)."""
    image: str = Field(min_length=1)
    """pyxis: an image reference or a ``.sqsh`` file; apptainer: a ``.sif`` file or
    a ``docker://`` URI."""
    mounts: list[str] = Field(default_factory=list)
    """``SRC[:DST[:ro]]`` bind mounts (pyxis ``--container-mounts``, apptainer
    ``--bind``)."""
    options: list[str] = Field(default_factory=list)
    """More options for the runtime, as they are: pyxis ``srun`` options starting
    ``--container-`` (``--container-workdir=/w``), apptainer ``exec`` options
    (``--nv``, ``--cleanenv``). Anything else is refused."""

    @model_validator(mode="after")
    def _options_belong(self) -> ContainerSpec:
        for option in self.options:
            if not option.startswith("-"):
                raise ValueError(f"slurm.container.options: {option!r} is not an option")
            if self.runtime == "pyxis" and not option.startswith("--container-"):
                raise ValueError(
                    f"slurm.container.options: {option!r}: with runtime pyxis only srun's "
                    "--container-* options are passed (the rest of srun is Lazarus's)"
                )
        return self


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
    """Submit mode: more ``sbatch`` scheduling options, passed as they are
    (``--qos=high``, ``--gres=gpu:8``, ``-Cgpu``): written in full, values after ``=``
    or glued to a short option. An allow-list
    (``activities.nodes.slurm.submit.SCHEDULING_OPTIONS``: where, when and with how
    much the holder runs); any other option, such as one
    that chooses what the holder runs or its environment (``--container``,
    ``--export``, ``--wrap``), is refused when the allocation is submitted, naming it."""
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
    python: str = "python3"
    """The compute nodes' interpreter that runs each rank's task (``python -m
    lazarus.rank.slurm_task``): ``nodes[].python`` wins; found on the ranks' PATH
    (the worker's ``PATH``, as ``srun`` exports it, or ``env.PATH``). It needs only
    ``lazarus-rank``, never the controller's install."""
    container: ContainerSpec | None = None
    """Run each rank's task in a container (pyxis/enroot or Apptainer); None: on
    the node itself."""

    @field_validator("python")
    @classmethod
    def _python_is_a_program(cls, value: str) -> str:
        python_problem(value)
        return value

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


def slurm_node(name: str) -> NodeSpec:
    """A node of a Slurm allocation, by the name Slurm gives it."""
    return NodeSpec(name=name, launcher="slurm", host=name)


def _resolve_node(node: NodeSpec, base: Path) -> NodeSpec:
    if node.identity_file is None:
        return node
    return node.model_copy(
        update={"identity_file": str((base / Path(node.identity_file).expanduser()).resolve())}
    )
