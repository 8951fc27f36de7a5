"""The node-agent interface and the records that cross it.

Every method is blocking (activities call them from a thread pool) and
idempotent, and each of ``poll``, ``start_ranks`` and ``stop`` costs one round
trip to the node, so supervising N nodes costs N concurrent round trips per poll.

Paths are the node's own: the run directory of a generation lives on the node
that runs its ranks (for the local agent, this machine).
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from typing import Any, Literal

from pydantic import Field

from activities.nodes.node_records import (
    CarryRequest,
    CarryResult,
    NodeRecord,
    NodeStopResult,
    RankLaunch,
    StartedRank,
    WarmStart,
)
from activities.nodes.rundir import GenerationDir
from lazarus.domain.process_groups import UnkillableGroup
from lazarus.domain.spec import JobSpec, NodeSpec
from lazarus.rank.hang_evidence import EvidenceTarget, HangEvidence

log = logging.getLogger(__name__)


class RankRecord(NodeRecord):
    """What one poll saw of one rank, raw: the supervisor interprets it."""

    rank: int
    pid: int | None = None
    """None when the rank has no pid file (never started here)."""
    alive: bool = False
    stopped: bool = False
    """In state T: SIGSTOPped or traced."""
    exit: dict[str, Any] | None = None
    """The exit-status record: {"exit_code": int, "signal": str | None, "ended_at": float}."""
    heartbeat: dict[str, Any] | None = None
    """The rank helper's heartbeat record: {"step": int, "time": float, ...}."""


class NodeStatus(NodeRecord):
    node: str
    reachable: bool
    error: str | None = None
    """Why the node could not be polled (connection refused, host key mismatch, ...)."""
    declared_lost: bool = False
    """The scheduler itself says the node is gone (Slurm: DOWN, DRAIN, FAIL,
    NOT_RESPONDING): node loss at once, without waiting ``node_timeout_s``."""
    ranks: list[RankRecord] = Field(default_factory=list)
    observed_at: float
    round_trip_s: float = 0.0


class LogChunk(NodeRecord):
    """Bytes of a rank's log from an offset (:meth:`NodeAgent.log_read`): a reader that
    asks again from ``offset + len(data)`` gets the rest, and a follower the lines
    written since, without losing or repeating any."""

    data: bytes = b""
    size: int | None = None
    """The file's size when it was read (it may have grown since); None: there is no
    such log on the node (not started there, or another node ran the rank)."""
    mtime: float | None = None
    """When the file was last written (seconds since the epoch), where the node says."""


class PreflightRequest(NodeRecord):
    interpreter: str
    """The training command's program (e.g. ``python``): it must exist on the node."""
    workdir: str
    disk_path: str
    """Where checkpoints go; its free space is measured."""
    min_free_disk_gb: float = 0.0
    health_command: list[str] | None = None
    timeout_s: float = 30.0
    search_path: str | None = None
    """The PATH the ranks will get: the interpreter must be found on it, not on the
    login shell's PATH."""


class GpuHealth(NodeRecord):
    count: int
    ecc_errors: int = 0
    xid_errors: int = 0
    details: list[str] = Field(default_factory=list)


class PreflightResult(NodeRecord):
    node: str
    ok: bool
    problems: list[str] = Field(default_factory=list)
    """One line each, naming the check and what to do."""
    free_disk_gb: float | None = None
    gpus: GpuHealth | None = None
    round_trip_s: float = 0.0
    program_missing: bool = False
    """The command's program was not found on the node (one of ``problems``)."""


class MemorySnapshot(NodeRecord):
    """One committed step directory of a node's memory tier, as the node reports it:
    raw facts, judged by the checkpoint search alike for every node."""

    step: int
    path: str
    manifest: dict[str, Any] | None = None
    """The parsed manifest; None when it is missing or unreadable."""
    sizes: dict[str, int] = Field(default_factory=dict)
    """Every regular file under the step directory: relative path -> bytes."""


class RestoreEnd(NodeRecord):
    """One end of a replica's restore node to node (:mod:`lazarus.rank.replica_restore`
    runs it on the node): ``receive`` on the node that lacks the step, ``send`` on the
    buddy that holds it. Built by the activity and handed to the node on stdin; the
    key never reaches the workflow's history, argv or a file."""

    verb: Literal["send", "receive"]
    address: str
    """``host:port`` the receiving end listens on (derived from the key)."""
    path: str
    """Logical step directory: the replica to send, or the step to fill."""
    step: int
    job_id: str | None
    timeout_s: float
    """The whole copy's bound, from its size (:func:`lazarus.rank.transfer.deadline_for`)."""
    key_hex: str = Field(repr=False)
    python: str = "python3"
    """The node's interpreter (found on ``search_path``), which imports ``lazarus.rank``."""
    search_path: str = "/usr/local/bin:/usr/bin:/bin"
    python_path: str = ""
    workdir: str = "/"

    def request_json(self) -> str:
        """What the node's module reads on stdin."""
        return json.dumps(
            {
                "key": self.key_hex,
                "address": self.address,
                "path": self.path,
                "step": self.step,
                "job_id": self.job_id,
                "timeout_s": self.timeout_s,
            }
        )

    def answer(self, output: str) -> dict[str, Any]:
        """The module's answer among the node's output lines (the last JSON object
        that carries one), or an error naming what the node printed instead."""
        for line in reversed(output.splitlines()):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict) and value.keys() & {"sent", "received", "error"}:
                return value
        tail = " | ".join(output.strip().splitlines()[-3:])
        return {"error": f"replica restore ({self.verb}): no answer ({tail or 'no output'})"}


class DrainResult(NodeRecord):
    """What a scheduler did when asked to take a node out of its scheduling (or give it
    back): ``scontrol update nodename=X state=drain`` on Slurm, the only scheduler with
    drains today, so the evidence names it. A refusal (no admin rights) is recorded in
    ``error``, never raised."""

    node: str
    drained: bool
    reason: str
    error: str | None = None
    left: str | None = None
    """Why the node was left as it is: someone else drained it (their reason stands)."""

    def evidence(self) -> str:
        """The incident's evidence line: what was drained, or why not (ignored)."""
        if self.drained:
            return f"drained node {self.node} in Slurm: reason={self.reason!r}"
        if self.left is not None:
            return f"node {self.node} left as it is in Slurm: {self.left}"
        return f"could not drain node {self.node} in Slurm (ignored): {self.error}"


HANG_EVIDENCE_TIMEOUT_S = 5.0
"""The longest a node's :meth:`NodeAgent.hang_evidence` may take, round trip and the
node's interpreter included: its reads are bounded at 1.5 s (a stack) and 1 s (the
flight recorder), run at once, and the hang's stop waits for them."""


class AllocationRefused(RuntimeError):
    """The scheduler refused to grant or change the allocation the nodes live in (see
    :mod:`activities.nodes.allocation`). Its answer will not change by asking
    again at once: callers treat it as final, not as a transient failure. Each
    scheduler's refusals subclass it, so their names still tell which step refused."""


class NodeUnreachable(Exception):
    """The node cannot be reached now (a network problem: maybe transient)."""


class NodeRefused(Exception):
    """The node must not be used as configured (unknown or changed host key, bad
    identity file, authentication refused): retrying will not help."""


class RankStartFailed(Exception):
    """The rank's program could not be started at all (not a crash: a bad command)."""


class ShimError(RuntimeError):
    """The node answered, but the operation failed there (a stopped generation, a
    missing workdir, a group that survived SIGKILL). Neither a network problem nor
    a misconfigured node: the message says what to fix. Raised by the shim that ssh
    and Slurm nodes run (:mod:`activities.nodes.shim_agent`)."""


class NodeAgent(ABC):
    def __init__(self, node: NodeSpec) -> None:
        self.node = node

    def node_python(self) -> str:
        """The node's own interpreter for Lazarus's node-side work (``nodes[].python``,
        else the launcher's job-wide setting, default ``python3``): it needs only
        ``lazarus-rank``."""
        return self.node.node_python("python3")

    @property
    def runs_here(self) -> bool:
        """The node is this machine (``local``: :mod:`lazarus.domain.transports`): its
        ranks' pids, files, kernel and clock are the worker's own."""
        return self.node.transport.runs_here

    @abstractmethod
    def start_ranks(self, gen_dir: str, ranks: list[RankLaunch]) -> list[StartedRank]:
        """Start each rank detached (setsid; never a child of the controller) unless its
        pid file already exists, in which case adopt it. Creates ``gen_dir``."""

    shares_clock: bool = False
    """The node's wall clock is the controller's own (its ranks run on this machine):
    a heartbeat's timestamp may then date the rank's progress, within the polls that
    bracket it (:meth:`GenerationObserver._progressed`). False for other machines,
    whose clocks may be off by any amount: there, progress dates from when a poll saw
    it."""

    warm_unsupported: str = "warm start is not supported by this node's launcher"
    """Why :meth:`start_ranks_warm` starts every rank cold on agents that cannot fork."""

    def start_ranks_warm(
        self, gen_dir: str, ranks: list[RankLaunch], warm: WarmStart
    ) -> list[StartedRank]:
        """Like :meth:`start_ranks`, forking each rank from the node's zygote where it
        can, and otherwise starting it cold with ``cold_reason`` set. This default
        starts every rank cold: agents that can fork override it."""
        return [
            rank if rank.adopted else rank.model_copy(update={"cold_reason": self.warm_unsupported})
            for rank in self.start_ranks(gen_dir, ranks)
        ]

    prewarm_unsupported: str = "this node's launcher does not prewarm spares"
    """What :meth:`prewarm` answers on agents that start no zygote ahead of a launch."""

    def prewarm(self, launch: RankLaunch, warm: WarmStart) -> str | None:
        """A spare's zygote for the run, started ahead of any launch on it, so the
        launch that swaps the spare in after a node loss forks its ranks instead of
        waiting for a fresh interpreter to import ``warm.preload`` (issue 28).

        ``launch`` is a rank as this node would start it (its environment, less the
        per-rank variables, is the zygote's:
        :func:`activities.nodes.warm_starts.zygote_environment`).
        Starts the zygote unless one of the run is alive there and returns at once,
        without waiting for it to serve; bounded by one round trip. Returns None when
        it runs (started now or before), otherwise why not, in words: a failure only
        means that the spare's first launch starts the zygote itself, as without
        prewarming. Never raises for network trouble.

        This default starts nothing and answers :attr:`prewarm_unsupported`."""
        return self.prewarm_unsupported

    rejoin_unsupported: str = "survivors cannot rejoin in place on this node's launcher"
    """Why :meth:`carry_survivors` carries nothing on agents that cannot."""

    def carry_survivors(self, request: CarryRequest) -> CarryResult:
        """``rejoin``: check each of ``request.ranks`` on this node (alive, its start
        ticks ours, no exit record), fence every other group of the run's older
        generations here, link the survivors' records into the new generation and
        write their rejoin request where they read it. One round trip, idempotent (a
        retried launch carries the same survivors). Raises :class:`NodeUnreachable`
        when the node cannot be reached: nothing was fenced, so nothing may start.

        This default carries nothing: it fences every older generation on this node
        (:meth:`stop`) and refuses each rank with :attr:`rejoin_unsupported`, so the
        ranks start afresh and no process of theirs is left to act twice."""
        stopped = self.stop(request.run_root, request.generation, 0.0, request.kill_wait_s)
        if not stopped.reachable:
            raise NodeUnreachable(stopped.error or f"node {self.node.name} is unreachable")
        return CarryResult(
            refused=[f"rank {r}: {self.rejoin_unsupported}" for r in request.ranks],
            unkillable=stopped.unkillable,
        )

    def carry_and_start(
        self, request: CarryRequest, gen_dir: str, launches: list[RankLaunch], warm: WarmStart
    ) -> tuple[CarryResult, dict[int, StartedRank]]:
        """:meth:`carry_survivors`, then, where the node can do both at once, start
        ``launches`` warm (those of them it did not carry): the carry's answer and the
        ranks it started, by rank. The launcher starts whatever is not in that map
        the usual way, after its own checks, so an agent that cannot combine the two
        (this default: nothing started) or a node that could not start a rank loses
        nothing but the time saved. Nothing starts on a node whose fencing left a
        group alive. Same fencing-first order as a carry and then a start."""
        return self.carry_survivors(request), {}

    # --- Before a launch starts ranks --------------------------------------------------
    # The launcher asks every node's agent alike (or, for what is this machine's, the
    # first node's: a job's nodes share one launcher, the spec checks); each transport
    # answers for its own nodes.

    def fence_here(
        self,
        older: list[GenerationDir],
        others: list[GenerationDir],
        keep: frozenset[int],
        kill_wait_s: float,
        lock_timeout_s: float,
    ) -> list[UnkillableGroup]:
        """The launch's net behind the workflow's own ``stop``, before anything starts:
        whatever this machine's run directory says still runs of the run's ``older``
        generations (but the groups ``keep``: survivors carried in place) and of the
        job's ``others`` runs is killed, start ticks checked. Returns the groups of
        ``older`` that would not die (those of other runs are only logged). Asked of
        one node's agent per launch: the run directory read is this machine's.

        This default fences nothing here: nodes whose ranks run in a scheduler's steps
        fence by step instead (:meth:`fence_older_generations`). The local agent and
        the shim's (ssh nodes: their run directory holds no pid files here unless a
        node shares the controller's filesystem) run
        :func:`activities.nodes.fencing.fence_this_machine`."""
        return []

    def fence_earlier_runs(self, runs: dict[str, list[str]], kill_wait_s: float) -> str | None:
        """The job's earlier runs (run root -> its memory-tier directories) on this
        node: their ranks stopped, their zygotes (which would fork for nobody) ended and
        their memory tier removed, before the first launch of a new run. Returns why
        the node could not be reached, or None. This default reaches the node through
        :meth:`stop` and :meth:`end_run` (a node of its own, whose run directory is
        its own); the local agent's are this machine's, which :meth:`fence_here` and
        the launcher's zygote sweep have fenced already."""
        for run_root, memory_dirs in runs.items():
            result = self.stop(run_root, None, 0.0, kill_wait_s)
            if not result.reachable:
                return result.error or f"node {self.node.name} is unreachable"
            for group in result.unkillable:
                log.warning("fencing: %s", group.reason)
            try:
                self.end_run(run_root, memory_dirs)
            except NodeUnreachable as exc:
                return str(exc)
        return None

    def fence_older_generations(
        self, run_root: str, generation: int, kill_wait_s: float
    ) -> NodeStopResult | None:
        """A launch of ``generation`` that carries no survivors: the run's older
        generations fenced on this node, where :meth:`fence_here` cannot (their pid
        files mean nothing on this machine). None: nothing to do here, :meth:`fence_here`
        did it (this default). Slurm nodes cancel the older steps they took part in."""
        return None

    def prepare_launch(self, spec: JobSpec, carried: bool) -> str | None:
        """Before the first rank of a launch starts, once per launch (asked of the
        first node's agent): what the node's side needs, or why the launch must be
        refused (its command's program cannot be found). ``carried``: survivors were
        carried in place, and may still be writing. This default does nothing: a node
        of its own finds the program when it starts a rank."""
        return None

    @abstractmethod
    def poll(self, gen_dir: str, ranks: list[int]) -> NodeStatus:
        """One round trip: liveness, exit records and heartbeats of these ranks.
        Never raises for network trouble: returns ``reachable=False`` with the error."""

    @abstractmethod
    def stop(
        self,
        run_root: str,
        keep_generation: int | None,
        grace_s: float,
        kill_wait_s: float = 10.0,
    ) -> NodeStopResult:
        """SIGTERM+SIGCONT every live rank group of this node in every generation under
        ``run_root`` except ``keep_generation``, wait ``grace_s``, SIGKILL the rest, mark
        each generation stopped. A group still alive ``kill_wait_s`` after SIGKILL is
        returned in ``unkillable``, not retried. Only groups whose pid file's start
        ticks match are signalled: a reused pid or pgid is someone else's. Never raises
        for network trouble (``reachable=False``)."""

    @abstractmethod
    def end_run(self, run_root: str, memory_dirs: list[str]) -> None:
        """The run is over: stop this node's zygote of ``run_root`` (and of the runs
        below it, given a job directory; ranks they forked are not touched: stop them
        first) and remove the memory-tier directories ``memory_dirs`` (only under
        :data:`lazarus.domain.memory_tier.MEMORY_ROOT`). Idempotent. Raises
        :class:`NodeUnreachable` when the node cannot be reached."""

    @abstractmethod
    def log_tail(self, gen_dir: str, rank: int, max_bytes: int = 65536) -> str: ...

    def log_read(self, gen_dir: str, rank: int, offset: int, max_bytes: int) -> LogChunk:
        """At most ``max_bytes`` of ``rank-<rank>.log`` from byte ``offset``, with the
        file's size and time: one round trip, so a log of any size is read whole (or
        followed) a chunk at a time (``lazarus logs``). Raises :class:`NodeUnreachable`
        or :class:`NodeRefused` when the node cannot answer."""
        raise NotImplementedError(f"{type(self).__name__} cannot read logs by offset")

    @abstractmethod
    def preflight(self, request: PreflightRequest) -> PreflightResult: ...

    @abstractmethod
    def write_file(self, path: str, content: str) -> None:
        """Write atomically on the node (control files)."""

    def memory_snapshots(self, root: str) -> list[MemorySnapshot]:
        """The committed step directories under ``root`` (a run's memory tier) on this
        node, oldest first; empty when ``root`` does not exist. One round trip; raises
        :class:`NodeUnreachable` or :class:`NodeRefused` when the node cannot answer."""
        raise NotImplementedError(f"{type(self).__name__} cannot list memory snapshots")

    def memory_snapshots_in(self, roots: list[str]) -> list[list[MemorySnapshot]]:
        """:meth:`memory_snapshots` of each of ``roots``, in order, in one round trip
        where the transport can: a rank crash's resume search lists each node's own
        snapshots and the replicas it holds, and on SSH nodes a second round was 0.1 s
        of that crash's recovery. Raises as :meth:`memory_snapshots` when any root
        cannot be listed (the caller then lists them one by one, to tell which)."""
        return [self.memory_snapshots(root) for root in roots]

    def restore_end(self, end: RestoreEnd) -> dict[str, Any]:
        """Run one end of a replica restore on this node and return its one-line
        answer (``{"sent"|"received": ...}`` or ``{"error": ...}``). Blocks for at most
        ``end.timeout_s`` plus a start; the state flows between the two nodes, never
        through this process. Raises :class:`NodeUnreachable` when the node cannot be
        reached."""
        raise NotImplementedError(f"{type(self).__name__} cannot restore replicas")

    def hang_evidence(self, gen_dir: str, targets: list[EvidenceTarget]) -> HangEvidence:
        """A hung generation's evidence from this node's live ranks, read where they
        run (:mod:`lazarus.rank.hang_evidence`): the Python stacks of the targets marked
        ``stack`` and every target's flight-recorder dump, compacted. Bounded by
        :data:`HANG_EVIDENCE_TIMEOUT_S` (the stop waits for it) and never raises: a node
        that cannot answer gives one line saying why. This default reads nothing."""
        return HangEvidence(
            stacks=[f"rank stacks: not read on node {self.node.name} (its agent cannot)"]
        )

    def exit_fds(self) -> list[int]:
        """Descriptors that become readable when a rank this agent polled, or the
        process that records its exit, has ended (see :mod:`activities.nodes.exit_watch`):
        the supervisor wakes on them instead of waiting for its next round. Empty where
        there are no such notices (ranks on another machine): rounds only."""
        return []

    def exits_seen(self, fds: list[int]) -> None:  # noqa: B027 - only agents with notices
        """These descriptors of :meth:`exit_fds` fired; they are not offered again."""

    # --- The node's scheduler ------------------------------------------------------------
    # Only nodes a batch scheduler hands out (Slurm) have one. These defaults are the
    # answer for every other node: nothing to tell, nothing to ask. Callers ask every
    # agent alike, so the transport is chosen once, by the factory.

    def drain(self, failure_class: str, job: str) -> DrainResult | None:
        """Take the node out of its scheduler's scheduling, with a reason an admin can
        read, so the scheduler gives it to nobody else either. None: no scheduler."""
        return None

    def drain_if_lost(self, failure_class: str, job: str) -> DrainResult | None:
        """:meth:`drain`, but only when the scheduler itself says the node is lost (a
        launch or preflight that could not reach it): a blip is not drained. None when
        nothing was drained or there is no scheduler."""
        return None

    def undrain(self) -> DrainResult | None:
        """Give a node Lazarus drained back to its scheduler (``lazarus return``).
        None: no scheduler."""
        return None

    def preemption_notice(
        self, marker: str | None, handled_at: float | None
    ) -> tuple[float, str] | None:
        """Why the allocation this node lives in is going away, with when (wall clock),
        or None. Every node of a job shares one allocation, so asking one agent answers
        for all. ``marker`` is the holder's notice file, ``handled_at`` when the last
        notice was handled. None: no scheduler, or nothing is going away."""
        return None

    def close(self) -> None:  # noqa: B027 - optional for agents without connections
        """Release connections; agents are reused within one activity."""
