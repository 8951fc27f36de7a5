"""Supervising a generation: long-running, heartbeating, and stateless across workers.

Everything the supervisor needs is on disk in the generation's run directory, so
an attempt started after a worker crash re-attaches with no loss: exit-status
files say what ended while nobody watched, and heartbeat files say how far each
rank got. What files cannot hold (when the controller first saw each rank's
current progress, when a node went quiet) travels in the activity heartbeat.

Every clock is the controller's own. A heartbeat's timestamp is written by the
node's clock, which may be seconds off: staleness is measured from the moment
the controller first saw each new heartbeat or log step (monotonic time), never
by subtracting a remote timestamp from the local clock.

The split is deliberate: :class:`GenerationObserver` does the I/O and
:func:`evaluate` is a pure function from one observation to an outcome, so the
detection rules are unit-tested without processes.

Scale (one activity supervises every node of a generation; ``python -m bench
scale`` measures it on simulated nodes):

- A poll round starts every ``poll_interval_s`` from the start of the last one,
  polls every node at once (at most :data:`MAX_POLL_THREADS` in flight, one per
  node) and waits for answers at most one interval. A node whose poll is still
  out is *waiting*: its last answer stands, its ranks are not judged for hangs,
  and its poll counts when its agent gives a verdict. So a silent node (an SSH
  poll blocks for ``ssh.command_timeout_s``) no longer stalls everyone else's
  crash detection, and a slow live node is judged exactly as before.
- A rank whose heartbeat record did not change since the last poll reuses its
  last status; the heartbeat details are rebuilt at most every
  :data:`DETAILS_EVERY_S`; node-loss checks group ranks by node once (they were
  quadratic).
- Above :data:`RANKS_IN_FULL` ranks, an outcome carries only the ranks that say
  something into history (:func:`for_history`).

Limits: everything runs in one Python process, so the GIL caps a worker at about
one core of supervision. Measured (8 ranks per node, 1 s steps, 0.5 s polls):
0.6-0.7 ms of CPU per node per second; 1,000 nodes take 0.7 cores with p99
detection under 2 s, 2,000 a full core and rounds overrun the interval. A larger
job needs its nodes split across several supervise activities (on several
workers): not built. Every poll is still a request and an
answer per node: a stream per node that reports only changes would cut the cost
of the nodes that have nothing to say. A silent node is declared lost no sooner
than ``node_timeout_s`` and two failed polls (two transport timeouts).
The heartbeat details hold one progress mark per rank (about 75 bytes): about
7,000 ranks pass Temporal's 512 KB warning, about 27,000 its 2 MB limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from temporalio import activity

from lazarus.activities.diagnosis import (
    TAIL_BYTES,
    diagnose_crash,
    diagnose_vanished,
    killed_by_sigkill,
    last_lines,
)
from lazarus.activities.heartbeat import in_thread_heartbeating
from lazarus.activities.kernel_evidence import KernelSources, OomWatch
from lazarus.activities.nodes.agent import NodeAgent, NodeStatus, RankRecord
from lazarus.activities.nodes.factory import agents
from lazarus.activities.nodes.rundir import GenerationDir, read_json
from lazarus.activities.observe import observe
from lazarus.activities.straggler_stats import ComputeWindow, find_straggler
from lazarus.domain.contracts import (
    FailureReport,
    ProgressMark,
    ProgressSignal,
    RankStatus,
    StragglerReport,
    SuperviseOutcome,
    SuperviseRequest,
    SupervisionProgress,
)
from lazarus.domain.environment import (
    HEARTBEAT_CHECKPOINT_SAVE_S,
    HEARTBEAT_GENERATION,
    HEARTBEAT_REJOIN,
)
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.phases import HEARTBEAT_FIELD
from lazarus.domain.recovery_timeline import latest_marks

Verdict = tuple[NodeStatus, float]
"""What one poll of a node said, and when (wall) it was asked."""

MAX_POLL_THREADS = 64
"""Polls out at once. Each node has at most one; a silent node holds its thread until
its agent's timeout, so this many silent nodes at once would delay the others."""

VANISHED_GRACE_S = 1.5
"""A dead rank gets this long for its wrapper to write the exit-status file: a
fallback only. The wrapper writes it milliseconds after the death, and a rank whose
record has arrived is reported at once (:func:`awaiting_exit_record`); the full grace
is waited only for a rank that vanished with its wrapper (its group killed from
outside), which never gets a record."""


MIN_FAILED_POLLS = 2
"""Consecutive failed polls before a node can be declared lost. One poll that timed
out proves nothing on a loaded controller (a 2 s SSH timeout fires on live hosts
when the CPU is saturated); a node is lost only when it stayed silent across polls
and, unless its peers are already crashing, for ``node_timeout_s``."""


@dataclass
class NodeObservation:
    reachable: bool
    unreachable_since: float | None = None
    error: str | None = None
    failed_polls: int = 0
    """Consecutive polls that could not reach the node (0 when the last one did)."""
    declared_lost: bool = False
    """The scheduler says the node is gone (:attr:`NodeStatus.declared_lost`): its
    word is final, so one poll is enough and ``node_timeout_s`` does not apply."""
    waiting: bool = False
    """Its poll is still out (slower than ``poll_interval_s``): this is its last
    answer, carried over."""


@dataclass
class Observation:
    now: float
    launched_at: float
    ranks: list[RankStatus]
    logs: dict[int, str] = field(default_factory=dict)
    """Log tails by rank, fetched only for ranks that need evidence."""
    dead_since: dict[int, float] = field(default_factory=dict)
    """Ranks seen dead without an exit-status file, and since when."""
    nodes: dict[str, NodeObservation] = field(default_factory=dict)
    multi_node: bool = False
    compute: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    """Per-rank (controller time the heartbeat was seen, compute seconds) samples
    inside the straggler window."""
    progress_signal: ProgressSignal | None = None
    """``none``: no progress signal, hang detection is off. None: not known yet, or a
    hand-made observation: hang detection as usual."""
    signal_seen_at: float | None = None
    """When the first progress of any rank was seen. A rank with none yet gets a full
    ``hang_timeout_s`` after it before it counts as stalled, when progress appears
    only near or after ``startup_timeout_s``."""
    rank_phases: dict[int, dict[str, float]] = field(default_factory=dict)
    """Per rank, the phase marks of its newest heartbeat (:mod:`lazarus.domain.phases`):
    where a restart's time went on the rank side. Empty without the rank helper."""
    preempted: tuple[float, str] | None = None
    """Slurm is taking the allocation away: when (wall clock), and the evidence line
    (:meth:`lazarus.activities.nodes.agent.NodeAgent.preemption_notice`)."""
    checkpoint_save_s: float | None = None
    """The slowest rank's recent blocking save time (its heartbeat's), None before any."""


class Clock(Protocol):
    """The controller's clocks: wall time for records, monotonic time for ages
    (injectable, so tests move time by hand)."""

    def wall(self) -> float: ...

    def mono(self) -> float: ...


class SystemClock:
    def wall(self) -> float:
        return time.time()

    def mono(self) -> float:
        return time.monotonic()


class GenerationObserver:
    """Polls every node of one generation concurrently; remembers only what the
    nodes cannot tell (when a node went quiet, when a rank was first seen dead,
    when each rank's current progress was first seen)."""

    def restore(self, memory: SupervisionProgress) -> None:
        self._unreachable_since.update(memory.unreachable_since)
        self._dead_since.update(memory.dead_since)
        wall, mono = self._clock.wall(), self._clock.mono()
        for rank, mark in memory.progress_marks.items():
            # Back to this process's monotonic clock; a mark "in the future" (another
            # controller's clock ahead of ours) counts as seen now.
            self._marks[rank] = (mark.marker, mono - max(0.0, wall - mark.seen_at))

    def heartbeat_details(
        self, obs: Observation, seconds_per_step: float | None
    ) -> SupervisionProgress:
        """The activity heartbeat: the live view, plus the memory a retried attempt
        restores (node-loss, vanished-rank and hang clocks survive a worker crash)."""
        wall, mono = self._clock.wall(), self._clock.mono()
        return SupervisionProgress(
            generation=self._request.generation,
            step=_max_step(obs.ranks),
            alive=sum(1 for r in obs.ranks if r.alive),
            world_size=self._request.world_size,
            seconds_per_step=seconds_per_step,
            observed_at=obs.now,
            unreachable_since=dict(self._unreachable_since),
            dead_since=dict(self._dead_since),
            progress_marks={
                rank: ProgressMark(marker=marker, seen_at=wall - (mono - seen))
                for rank, (marker, seen) in self._marks.items()
            },
            progress_signal=obs.progress_signal,
        )

    def __init__(
        self,
        request: SuperviseRequest,
        opened: list[NodeAgent],
        clock: Clock | None = None,
        kernel: KernelSources | None = None,
    ) -> None:
        self._request = request
        self._agents = opened
        self._clock = clock or SystemClock()
        self._gen = GenerationDir(Path(request.run_dir))
        regex = request.health.progress_regex
        self._progress_regex = re.compile(regex) if regex else None
        self._regex_steps: dict[int, int] = {}
        self._marks: dict[int, tuple[str, float]] = {}
        """rank -> (progress marker, controller monotonic time it was first seen)."""
        self._rank_phases: dict[int, dict[str, float]] = {}
        """rank -> the phase marks of its newest heartbeat (kept while its node is silent)."""
        self._heartbeat_seen = False
        self._save_s: dict[int, float] = {}
        """rank -> its heartbeat's ``checkpoint_save_s`` (kept while its node is silent)."""
        self._signal_seen: float | None = None
        """Monotonic time the first progress of any rank was seen."""
        self._oom = OomWatch(kernel)
        self._dead_since: dict[int, float] = {}
        self._unreachable_since: dict[str, float] = {}
        self._failed_polls: dict[str, int] = {}
        self._first_seen = self._clock.wall()
        self._launch_time: float | None = None
        self._compute = ComputeWindow(request.straggler.window_s)
        per_node = request.nproc_per_node
        self._ranks_of = {
            agent.node.name: list(range(i * per_node, (i + 1) * per_node))
            for i, agent in enumerate(opened)
        }
        self._pool: ThreadPoolExecutor | None = None
        self._last_records: dict[int, RankRecord] = {}
        """rank -> its last heartbeat-carrying record, to skip re-reading an unchanged one."""
        self._in_flight: dict[str, Future[list[Verdict]]] = {}
        """node -> its poll still out."""
        self._closed = threading.Event()
        # Before its first answer a node counts as answering, its ranks alive.
        self._last_node = {agent.node.name: NodeObservation(reachable=True) for agent in opened}
        self._last_ranks = {
            rank: RankStatus(rank=rank, node=name, pid=0, alive=True)
            for name, node_ranks in self._ranks_of.items()
            for rank in node_ranks
        }

    def _launched_at(self) -> float:
        """Read once: launch.json never changes after the launch completes."""
        if self._launch_time is None:
            launch = read_json(self._gen.launch_file)
            if launch is None:
                return self._first_seen
            self._launch_time = float(launch["launched_at"])
        return self._launch_time

    def _step_from_log(self, agent: NodeAgent, rank: int) -> int | None:
        """The newest step the rank's log tail shows (the last one seen if the tail
        holds none any more)."""
        assert self._progress_regex is not None
        text = agent.log_tail(str(self._gen.path), rank, 16 * 1024)
        for match in self._progress_regex.finditer(text):
            found = match.groupdict().get("step") or match.group(1)
            if found is not None and found.isdigit():
                self._regex_steps[rank] = int(found)
        return self._regex_steps.get(rank)

    def _progressed(self, rank: int, marker: str, now: float, mono: float) -> tuple[bool, float]:
        """Whether ``marker`` is new progress for the rank, and when (controller wall
        time, derived from the monotonic clock) its current progress was first seen."""
        known = self._marks.get(rank)
        changed = known is None or known[0] != marker
        if changed:
            self._marks[rank] = (marker, mono)
        if self._signal_seen is None:
            self._signal_seen = mono
        return changed, now - (mono - self._marks[rank][1])

    def _progress_signal(self, now: float, launched_at: float) -> ProgressSignal | None:
        if self._heartbeat_seen:
            return "heartbeat"
        if self._progress_regex is not None:
            return "log"
        if self._request.rejoining:  # carried ranks use the rank helper: heartbeats will come
            return None
        if now - launched_at > self._request.health.startup_timeout_s:
            return "none"
        return None

    def _poll(self, agent: NodeAgent) -> NodeStatus:
        return agent.poll(str(self._gen.path), self._ranks_of[agent.node.name])

    def _verdicts(self, agent: NodeAgent) -> list[Verdict]:
        """Poll one node; a poll that blocked a whole interval and came back
        unreachable (a silent node: the agent waited out its timeout) is asked again
        at once, up to :data:`MIN_FAILED_POLLS` verdicts, so that the second failure
        does not wait for a round to notice the first. A quick failure (connection
        refused) is not repeated here: the next round asks again."""
        interval = self._request.health.poll_interval_s
        verdicts: list[Verdict] = []
        while True:
            # A silent node went quiet when we asked, not when we gave up.
            asked_at, started = self._clock.wall(), time.monotonic()
            status = self._poll(agent)
            verdicts.append((status, asked_at))
            blocked = time.monotonic() - started >= interval
            if status.reachable or not blocked or len(verdicts) >= MIN_FAILED_POLLS:
                return verdicts
            if self._closed.is_set():
                return verdicts

    def _answers(self) -> list[list[Verdict] | None]:
        """One round: each node's verdicts (answers, or unreachable, with when each
        was asked), or None for a node whose poll is still out (no news). A round
        waits for them at most one ``poll_interval_s``: a silent node (an SSH poll
        blocks until its command timeout) no longer holds up what every other node
        says, so a crash elsewhere is seen at the usual pace. Its poll is not
        abandoned: it counts, as before, when the node's agent gives its verdict, so
        a slow but live node is judged exactly as it was when rounds waited for it."""
        if len(self._agents) <= 1:  # one node: nothing to hold up, one poll a round
            asked_at = self._clock.wall()
            return [[(self._poll(agent), asked_at)] for agent in self._agents]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=min(MAX_POLL_THREADS, len(self._agents)),
                thread_name_prefix="supervise-poll",
            )
        for agent in self._agents:
            if agent.node.name not in self._in_flight:
                self._in_flight[agent.node.name] = self._pool.submit(self._verdicts, agent)
        wait(list(self._in_flight.values()), timeout=self._request.health.poll_interval_s)
        answers: list[list[Verdict] | None] = []
        for agent in self._agents:
            future = self._in_flight[agent.node.name]
            if future.done():
                del self._in_flight[agent.node.name]
                answers.append(future.result())
            else:
                answers.append(None)
        return answers

    def close(self) -> None:
        """Stop polling: polls still out finish in their threads, unread."""
        self._closed.set()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._in_flight.clear()

    def observe(self) -> Observation:
        answers = self._answers()
        now, mono = self._clock.wall(), self._clock.mono()
        ranks: list[RankStatus] = []
        nodes: dict[str, NodeObservation] = {}
        for agent, answer in zip(self._agents, answers, strict=True):
            name = agent.node.name
            if answer is None:
                # No news: what the node said last still stands; its ranks are not
                # judged for hangs until it answers (see _hang).
                nodes[name] = replace(self._last_node[name], waiting=True)
                ranks.extend(self._last_ranks[rank] for rank in self._ranks_of[name])
                continue
            for status, asked_at in answer:
                if status.reachable:
                    self._unreachable_since.pop(name, None)
                    self._failed_polls.pop(name, None)
                else:
                    self._unreachable_since.setdefault(name, asked_at)
                    self._failed_polls[name] = self._failed_polls.get(name, 0) + 1
            status = answer[-1][0]
            nodes[name] = self._last_node[name] = NodeObservation(
                reachable=status.reachable,
                unreachable_since=self._unreachable_since.get(name),
                error=status.error,
                failed_polls=self._failed_polls.get(name, 0),
                declared_lost=status.declared_lost,
            )
            by_rank = {record.rank: record for record in status.ranks}
            for rank in self._ranks_of[name]:
                record = by_rank.get(rank)
                if record is not None and record.heartbeat is not None:
                    if self._last_records.get(rank) == record:
                        # Nothing new from this rank: the same status, at no cost (most
                        # ranks between two steps; the bulk of a large job's polls).
                        ranks.append(self._last_ranks[rank])
                        continue
                    self._last_records[rank] = record
                else:
                    self._last_records.pop(rank, None)
                ranks.append(self._rank_status(agent, rank, record, status.reachable, now, mono))
                self._last_ranks[rank] = ranks[-1]
        launched_at = self._launched_at()
        preempted = self._preemption()
        return Observation(
            preempted=preempted,
            now=now,
            launched_at=launched_at,
            ranks=ranks,
            dead_since=dict(self._dead_since),
            nodes=nodes,
            multi_node=len(self._agents) > 1 or any(a.node.launcher == "ssh" for a in self._agents),
            compute=self._compute.recent(now),
            progress_signal=self._progress_signal(now, launched_at),
            signal_seen_at=None if self._signal_seen is None else now - (mono - self._signal_seen),
            rank_phases={rank: dict(marks) for rank, marks in self._rank_phases.items()},
            checkpoint_save_s=max(self._save_s.values(), default=None),
        )

    def _preemption(self) -> tuple[float, str] | None:
        """Asked after the nodes: an allocation that ended killed the ranks, and its
        end must win over the crashes it caused."""
        request = self._request
        if request.access.slurm is None or not self._agents:
            return None
        # Every node of a job lives in the one allocation: one agent speaks for all.
        return self._agents[0].preemption_notice(request.preempt_marker, request.preempt_handled_at)

    def _rank_status(
        self,
        agent: NodeAgent,
        rank: int,
        record: RankRecord | None,
        reachable: bool,
        now: float,
        mono: float,
    ) -> RankStatus:
        if record is None:
            # The node did not answer: we know nothing new about the rank and must not
            # call it dead for that (node loss has its own clock), so it counts as alive.
            return RankStatus(rank=rank, node=agent.node.name, pid=0, alive=not reachable)
        step: int | None = None
        progress_at: float | None = None
        heartbeat = record.heartbeat
        compute_s: float | None = None
        if heartbeat is not None:
            self._heartbeat_seen = True
            marks = phase_marks(heartbeat)
            if marks:
                self._rank_phases[rank] = marks
            save_s = heartbeat.get(HEARTBEAT_CHECKPOINT_SAVE_S)
            if isinstance(save_s, (int, float)) and save_s >= 0 and math.isfinite(save_s):
                self._save_s[rank] = float(save_s)
        acts_for = heartbeat.get(HEARTBEAT_GENERATION) if heartbeat is not None else None
        joining = heartbeat is not None and heartbeat.get(HEARTBEAT_REJOIN) is not None
        if heartbeat is not None and "step" in heartbeat and joining:
            step = int(heartbeat["step"])  # rejoined, not stepped yet: no progress
        elif heartbeat is not None and "step" in heartbeat:
            step = int(heartbeat["step"])
            # The node's timestamp only identifies the write; its value is never compared.
            marker = "hb:" + _marker_of(step, heartbeat.get("time"))
            changed, progress_at = self._progressed(rank, marker, now, mono)
            raw_compute = heartbeat.get("compute_s")
            if isinstance(raw_compute, (int, float)) and raw_compute > 0:
                compute_s = float(raw_compute)
                if changed:
                    self._compute.add(rank, progress_at, compute_s)
        elif self._progress_regex is not None:
            step = self._step_from_log(agent, rank)
            if step is not None:
                _, progress_at = self._progressed(rank, f"log:{step}", now, mono)
        if record.alive and record.pid is not None and agent.node.launcher == "local":
            self._oom.watch(rank, record.pid)
        if record.exit is not None:
            # Its recorder spoke: a crash with an exit status, not a vanished rank. A
            # poll that caught the rank between its death and that write must not keep
            # it "vanishing" (that held every report back VANISHED_GRACE_S: issue 26).
            self._dead_since.pop(rank, None)
        elif record.pid is not None and not record.alive:
            self._dead_since.setdefault(rank, now)
        exit_record = record.exit or {}
        return RankStatus(
            rank=rank,
            node=agent.node.name,
            pid=record.pid or 0,
            alive=record.alive,
            stopped_by_signal=record.stopped,
            exit_code=exit_record.get("exit_code"),
            signal=exit_record.get("signal"),
            ended_at=exit_record.get("ended_at"),
            step=step,
            last_progress_at=progress_at,
            compute_s=compute_s,
            generation=acts_for if isinstance(acts_for, int) else None,
        )

    def evidence_for(self, rank: int) -> str:
        """The log tail of one rank (one extra round trip, only when something failed).

        Not fetched from a node that did not answer the last poll: a host already
        declared dead (or going) would only make the recovery wait out the connect
        timeout for a log it cannot send; the node's silence is the evidence."""
        per_node = self._request.nproc_per_node
        agent = self._agents[rank // per_node]
        if agent.node.name in self._unreachable_since:
            return ""
        try:
            return agent.log_tail(str(self._gen.path), rank, TAIL_BYTES)
        except Exception as exc:
            return f"(log of rank {rank} unavailable: {exc})"

    def kernel_evidence_for(self, rank: int, pid: int) -> list[str] | None:
        """The kernel's OOM records for a SIGKILLed rank; None when its node's kernel
        is not visible from here (ranks on other machines)."""
        agent = self._agents[rank // self._request.nproc_per_node]
        if agent.node.launcher != "local" or pid <= 0:
            return None
        return self._oom.evidence(rank, pid)


def _marker_of(step: int, written_at: object) -> str:
    """``json.dumps([step, written_at])`` (the marker format heartbeat details carry
    across worker versions), without the encoder for the usual number."""
    if type(written_at) is float and math.isfinite(written_at):
        return f"[{step}, {written_at!r}]"
    return json.dumps([step, written_at])


def phase_marks(heartbeat: dict[str, object]) -> dict[str, float]:
    """The phase marks a heartbeat carries (``{name: unix_time}``), keeping only
    well-formed ones: the heartbeat is the training script's file, and a malformed
    entry must cost its mark, never the supervision."""
    raw = heartbeat.get(HEARTBEAT_FIELD)
    if not isinstance(raw, dict):
        return {}
    return {
        name: float(at)
        for name, at in raw.items()
        if isinstance(name, str)
        and isinstance(at, int | float)
        and not isinstance(at, bool)
        and math.isfinite(at)
    }


def _max_step(ranks: list[RankStatus]) -> int | None:
    steps = [r.step for r in ranks if r.step is not None]
    return max(steps) if steps else None


def _crash(request: SuperviseRequest, obs: Observation) -> FailureReport | None:
    failed = [r for r in obs.ranks if r.exit_code is not None and r.exit_code != 0]
    if not failed:
        return None
    # The first rank to fail is the root cause; the rest died with it in the collective.
    root = min(failed, key=lambda r: (r.ended_at or obs.now, r.rank))
    return FailureReport(
        kind="crash",
        failure_class=FailureClass.UNKNOWN,  # classified from the log tail by with_evidence()
        rank=root.rank,
        node=root.node,
        exit_code=root.exit_code,
        signal=root.signal,
        fault_at=root.ended_at or obs.now,
        detected_at=obs.now,
        step_at_failure=_max_step(obs.ranks),
        collateral_ranks=sorted(r.rank for r in failed if r.rank != root.rank),
    )


def awaiting_exit_record(obs: Observation) -> bool:
    """Some rank is dead with no exit status yet: its wrapper may still be writing it
    (it does, milliseconds after the death). Only ranks still without one count: a
    rank whose record has arrived since is a crash to report now, and waiting out the
    grace for it delayed every crash caught in that window by 1.5 s (issue 26)."""
    return any(
        obs.now - since < VANISHED_GRACE_S and obs.ranks[rank].exit_code is None
        for rank, since in obs.dead_since.items()
    )


def _vanished(obs: Observation) -> FailureReport | None:
    gone = sorted(
        (since, rank)
        for rank, since in obs.dead_since.items()
        if obs.now - since >= VANISHED_GRACE_S and obs.ranks[rank].exit_code is None
    )
    if not gone:
        return None
    since, rank = gone[0]
    return FailureReport(
        kind="vanished",
        failure_class=FailureClass.KILLED,  # or oom_host, with the kernel's record: with_evidence()
        rank=rank,
        node=obs.ranks[rank].node,
        evidence=[
            f"rank {rank} is gone and its wrapper recorded no exit status: "
            "its whole process group was killed from outside"
        ],
        fault_at=since,
        detected_at=obs.now,
        step_at_failure=_max_step(obs.ranks),
        collateral_ranks=sorted(r for _, r in gone[1:]),
    )


def _node_lost(request: SuperviseRequest, obs: Observation, crashed: bool) -> FailureReport | None:
    """A node is dead when it is unreachable for node_timeout_s (at once if ranks are
    already crashing: they lost their peers there), or when, in a multi-node job,
    every one of its ranks vanished without an exit status. Either way it must have
    failed :data:`MIN_FAILED_POLLS` polls in a row: a single slow answer from a live
    host on a loaded controller must not quarantine it (defect 19, issue 10)."""
    found: list[tuple[float, str, str]] = []
    # Grouped once: scanning every rank for every node is quadratic (1,000 nodes: 1M
    # comparisons a poll).
    ranks_of: dict[str, list[RankStatus]] = {}
    for status in obs.ranks:
        ranks_of.setdefault(status.node, []).append(status)
    for name, node in obs.nodes.items():
        if not node.reachable and node.unreachable_since is not None:
            silent = obs.now - node.unreachable_since
            if node.declared_lost:
                found.append((node.unreachable_since, name, f"{node.error}"))
                continue
            confirmed = node.failed_polls >= MIN_FAILED_POLLS
            if confirmed and (crashed or silent >= request.node_timeout_s):
                found.append(
                    (
                        node.unreachable_since,
                        name,
                        f"node {name} unreachable for {silent:.1f} s: {node.error}",
                    )
                )
        elif obs.multi_node:
            mine = ranks_of.get(name, [])
            dead = [obs.dead_since.get(r.rank) for r in mine]
            if mine and all(d is not None and obs.now - d >= VANISHED_GRACE_S for d in dead):
                since = min(d for d in dead if d is not None)
                found.append(
                    (since, name, f"every rank on node {name} vanished without exit status")
                )
    if not found:
        return None
    since, name, why = min(found)
    node_ranks = [r.rank for r in ranks_of.get(name, [])]
    return FailureReport(
        kind="node_lost",
        failure_class=FailureClass.NODE_LOST,
        rank=node_ranks[0] if node_ranks else 0,
        node=name,
        evidence=[why],
        fault_at=since,
        detected_at=obs.now,
        step_at_failure=_max_step(obs.ranks),
        collateral_ranks=sorted(
            r.rank for r in obs.ranks if r.node != name and r.exit_code not in (None, 0)
        ),
    )


def _rejoin_overdue(request: SuperviseRequest, obs: Observation, status: RankStatus) -> bool:
    """A rank carried over into this generation (``rejoin``) that has not said it acts
    for it (a heartbeat here, ``"generation"`` this one) ``rejoin_timeout_s`` after the
    launch: it never rejoined. One that did is judged by the startup and hang clocks."""
    return (
        status.rank in request.rejoining
        and request.rejoin_timeout_s is not None
        and status.last_progress_at is None
        and status.generation != request.generation
        and obs.now - obs.launched_at > request.rejoin_timeout_s
    )


def _hang(request: SuperviseRequest, obs: Observation) -> FailureReport | None:
    """Ranks alive but not progressing. Off when the job has no progress signal: a
    script with neither heartbeats nor ``progress_regex`` would otherwise be killed
    as hung ``startup_timeout_s`` after every launch."""
    if obs.progress_signal == "none":
        return None
    health = request.health
    stalled: list[tuple[RankStatus, float]] = []
    for status in obs.ranks:
        node = obs.nodes.get(status.node)
        if not status.alive or (node is not None and (not node.reachable or node.waiting)):
            continue
        if status.last_progress_at is None and _rejoin_overdue(request, obs, status):
            stalled.append((status, obs.launched_at))
        elif status.last_progress_at is None:
            late_signal = (
                obs.signal_seen_at is not None
                and obs.now - obs.signal_seen_at <= health.hang_timeout_s
            )
            if obs.now - obs.launched_at > health.startup_timeout_s and not late_signal:
                stalled.append((status, obs.launched_at))
        elif obs.now - status.last_progress_at > health.hang_timeout_s:
            stalled.append((status, status.last_progress_at))
    if not stalled:
        return None
    # A stopped process (state T) is the culprit even if its last heartbeat landed a
    # moment after its blocked peer's (heartbeats are throttled): it joins the suspects.
    suspects = {s.rank for s, _ in stalled}
    for status in obs.ranks:
        if status.alive and status.stopped_by_signal and status.rank not in suspects:
            since = status.last_progress_at or obs.launched_at
            stalled.append((status, since))
    # Name the rank that stopped first: a SIGSTOPped process is certain; otherwise the
    # lowest step, then the oldest progress. Its peers stall behind it in the collective.
    culprit, since = min(
        stalled,
        key=lambda item: (
            not item[0].stopped_by_signal,
            item[0].step if item[0].step is not None else -1,
            item[1],
        ),
    )
    state = "stopped (state T)" if culprit.stopped_by_signal else "running"
    silent = obs.now - since
    evidence = (
        f"rank {culprit.rank} kept its process for generation {request.generation} but did "
        f"not rejoin it within {request.rejoin_timeout_s} s (process {state}); "
        "the whole generation restarts"
        if _rejoin_overdue(request, obs, culprit)
        else f"rank {culprit.rank} made no progress for {silent:.1f} s "
        f"(last step {culprit.step}, process {state}); hang_timeout_s={health.hang_timeout_s}"
    )
    return FailureReport(
        kind="hang",
        failure_class=FailureClass.HANG,
        rank=culprit.rank,
        node=culprit.node,
        evidence=[evidence],
        # The job stopped progressing when its first rank went quiet.
        fault_at=min(quiet for _, quiet in stalled),
        detected_at=obs.now,
        step_at_failure=_max_step(obs.ranks),
        collateral_ranks=sorted(s.rank for s, _ in stalled if s.rank != culprit.rank),
    )


def _failure(request: SuperviseRequest, obs: Observation) -> FailureReport | None:
    """Root cause first: a lost node, then ranks killed from outside, then crashes
    (peers of a dead rank crash within milliseconds: they are collateral), then hangs."""
    crash = _crash(request, obs)
    hang = _hang(request, obs)
    # Ranks crashing or stalling while a node is silent lost their peers there.
    lost = _node_lost(request, obs, crashed=crash is not None or hang is not None)
    if lost is not None:
        return lost
    if crash is not None and awaiting_exit_record(obs):
        return None  # wait a moment: either an exit status arrives or the rank vanished
    return _vanished(obs) or crash or hang


def _straggler(request: SuperviseRequest, obs: Observation) -> StragglerReport | None:
    if not request.straggler.enabled:
        return None
    known = frozenset(r.rank for r in obs.ranks if r.node in request.known_stragglers)
    finding = find_straggler(obs.compute, request.straggler, ignore=known)
    if finding is None:
        return None
    return StragglerReport(
        rank=finding.rank,
        node=obs.ranks[finding.rank].node,
        slowdown=finding.slowdown,
        compute_s=finding.compute_s,
        peers_compute_s=finding.peers_compute_s,
        samples=finding.samples,
        slow_since=finding.slow_since,
        detected_at=obs.now,
    )


def needs_kernel_evidence(failure: FailureReport) -> bool:
    """Killed from outside: only the kernel can say whether it was the OOM killer."""
    return failure.kind == "vanished" or (
        failure.kind == "crash" and killed_by_sigkill(failure.exit_code, failure.signal)
    )


def with_evidence(
    failure: FailureReport, log_text: str, kernel_evidence: list[str] | None = None
) -> FailureReport:
    """Attach the decisive log lines (and, for a crash or a vanished rank, the failure
    class). ``kernel_evidence``: the kernel's OOM records for the rank's pid, [] when
    there are none, None when they could not be read (see :func:`diagnose_crash`)."""
    if failure.kind == "crash":
        diagnosis = diagnose_crash(log_text, failure.exit_code, failure.signal, kernel_evidence)
        return failure.model_copy(
            update={"failure_class": diagnosis.failure_class, "evidence": diagnosis.evidence}
        )
    if failure.kind == "vanished":
        diagnosis = diagnose_vanished(kernel_evidence)
        evidence = [*failure.evidence, *diagnosis.evidence, *last_lines(log_text, 5)]
        return failure.model_copy(
            update={"failure_class": diagnosis.failure_class, "evidence": evidence}
        )
    return failure.model_copy(update={"evidence": [*failure.evidence, *last_lines(log_text, 5)]})


def _first_step_at(request: SuperviseRequest, obs: Observation) -> float | None:
    """When the generation made its first step (closing a recovery). Without a
    progress signal no step is ever seen: the generation counts as recovered once
    every rank has outlived ``startup_timeout_s`` (that is when the signal is found
    to be ``none``), so a job that crashes now and then is not a crash loop."""
    if obs.progress_signal == "none":
        return obs.now
    floor = request.resume_step if request.resume_step is not None else -1
    times = [
        r.last_progress_at
        for r in obs.ranks
        if r.step is not None and r.step > floor and r.last_progress_at is not None
    ]
    return min(times) if times else None


def evaluate(
    request: SuperviseRequest,
    obs: Observation,
    started_at: float,
    seconds_per_step: float | None = None,
) -> SuperviseOutcome | None:
    """Decide whether this observation ends the supervision, and how. Pure."""
    base = {
        "generation": request.generation,
        "observed_at": obs.now,
        "step": _max_step(obs.ranks),
        "ranks": obs.ranks,
        "seconds_per_step": seconds_per_step,
        "progress_signal": obs.progress_signal,
        "checkpoint_save_s": obs.checkpoint_save_s,
    }
    if obs.preempted is not None:
        at, why = obs.preempted
        notice = FailureReport(
            kind="preempted",
            failure_class=FailureClass.PREEMPTED,
            rank=0,
            evidence=[why],
            fault_at=at,
            detected_at=obs.now,
            step_at_failure=_max_step(obs.ranks),
        )
        return SuperviseOutcome(kind="preempted", failure=notice, **base)
    failure = _failure(request, obs)
    if failure is not None:
        return SuperviseOutcome(kind="failed", failure=failure, **base)
    if all(r.exit_code == 0 for r in obs.ranks):
        return SuperviseOutcome(kind="succeeded", **base)
    if request.report_first_step:
        first = _first_step_at(request, obs)
        if first is not None:
            return SuperviseOutcome(
                kind="first_step",
                first_step_at=first,
                rank_phases=latest_marks(obs.rank_phases),
                **base,
            )
    straggler = _straggler(request, obs)
    if straggler is not None:
        return SuperviseOutcome(kind="straggler", straggler=straggler, **base)
    if obs.now - started_at >= request.report_after_s:
        return SuperviseOutcome(kind="progress", **base)
    return None


class StepRate:
    """Seconds per step over the supervisor's window, for ETTR and restart-cost estimates.

    The times are the ranks' wall clocks, which can step backwards (NTP, a VM resumed).
    A window whose time did not move forward says nothing: it gives None, never a
    zero or negative rate (the workflow divides by it), and a step back restarts the
    window at the newest mark, so the rate is measured again from there."""

    def __init__(self) -> None:
        self._first: tuple[int, float] | None = None
        self._last: tuple[int, float] | None = None

    def update(self, ranks: list[RankStatus]) -> float | None:
        steps = [
            (r.step, r.last_progress_at)
            for r in ranks
            if r.step is not None and r.last_progress_at is not None
        ]
        if steps:
            newest = max(steps)
            if self._first is None or newest[0] < self._first[0] or newest[1] < self._first[1]:
                self._first = newest
            self._last = newest
        if self._first and self._last and self._last[0] > self._first[0]:
            elapsed = self._last[1] - self._first[1]
            if elapsed > 0 and math.isfinite(elapsed):
                return elapsed / (self._last[0] - self._first[0])
        return None


def attach_evidence(observer: GenerationObserver, outcome: SuperviseOutcome) -> FailureReport:
    """The failure of ``outcome`` with its log lines, kernel records and final class
    (blocking: one or two round trips to the failed rank's node)."""
    failure = outcome.failure
    assert failure is not None
    log_text = observer.evidence_for(failure.rank)
    kernel: list[str] | None = None
    if needs_kernel_evidence(failure):
        pid = next((r.pid for r in outcome.ranks if r.rank == failure.rank), 0)
        kernel = observer.kernel_evidence_for(failure.rank, pid)
    return with_evidence(failure, log_text, kernel)


def drain_lost_node(opened: list[NodeAgent], failure: FailureReport, job_id: str) -> FailureReport:
    """A lost Slurm node is drained with a reason an admin can read, so Slurm gives
    it to nobody else either; the outcome (or the refusal: draining needs Slurm admin
    rights) goes into the failure's evidence and never fails the job. Idempotent, so
    a retried supervise that reports the loss again drains again harmlessly."""
    if failure.kind != "node_lost":
        return failure
    agent = next((a for a in opened if a.node.name == failure.node), None)
    done = None if agent is None else agent.drain(failure.failure_class.value, job_id)
    if done is None:  # no such node, or one without a scheduler
        return failure
    return failure.model_copy(update={"evidence": [*failure.evidence, done.evidence()]})


def _previous_memory() -> SupervisionProgress | None:
    details = activity.info().heartbeat_details
    if not details:
        return None
    try:
        return SupervisionProgress.model_validate(details[0])
    except ValueError:
        return None


async def _observe_heartbeating(
    observer: GenerationObserver, last: SupervisionProgress | None
) -> Observation:
    """A silent node makes one poll take up to the command timeout: keep heartbeating
    meanwhile, or Temporal would think this worker died. Before the first observation
    there is no memory to send: those beats carry no details."""
    return await in_thread_heartbeating(observer.observe, lambda: last)


@activity.defn(name="supervise")
async def supervise(request: SuperviseRequest) -> SuperviseOutcome:
    """Watch one generation until it fails, finishes, or has progress worth reporting."""
    with agents(request.access.or_this_machine()) as opened:
        observer = GenerationObserver(request, opened)
        try:
            return await _supervise_with(request, opened, observer)
        finally:
            observer.close()


async def _supervise_with(
    request: SuperviseRequest, opened: list[NodeAgent], observer: GenerationObserver
) -> SuperviseOutcome:
    last = _previous_memory()
    if last is not None and last.generation == request.generation:
        observer.restore(last)
    rate = StepRate()
    started_at = time.time()
    interval = request.health.poll_interval_s
    details_at = 0.0
    save_s_seen: float | None = None
    while True:
        round_started = time.monotonic()
        obs = await _observe_heartbeating(observer, last)
        observe("supervision_poll", time.monotonic() - round_started, job=request.job_id)
        if obs.checkpoint_save_s is not None and obs.checkpoint_save_s != save_s_seen:
            save_s_seen = obs.checkpoint_save_s
            observe("checkpoint_save", save_s_seen, job=request.job_id)
        seconds_per_step = rate.update(obs.ranks)
        outcome = evaluate(request, obs, started_at, seconds_per_step)
        if outcome is not None:
            if outcome.kind == "failed" and outcome.failure is not None:
                failure = await asyncio.to_thread(attach_evidence, observer, outcome)
                failure = await asyncio.to_thread(drain_lost_node, opened, failure, request.job_id)
                outcome = outcome.model_copy(update={"failure": failure})
            return for_history(outcome)
        if last is None or time.monotonic() - details_at >= DETAILS_EVERY_S:
            last = observer.heartbeat_details(obs, seconds_per_step)
            details_at = time.monotonic()
        activity.heartbeat(last)
        # A round every poll_interval_s from its start, not interval after its end: a
        # large job's round takes long enough to matter (tenths of a second at 1,000
        # nodes). A rank's end cuts the wait short (its pidfd, where the node is this
        # machine), and a dead rank whose exit record is still being written is asked
        # about again soon: detection waits for neither the round nor the grace.
        delay = interval - (time.monotonic() - round_started)
        if awaiting_exit_record(obs):
            delay = min(delay, EXIT_RECORD_POLL_S)
        await until_an_exit(opened, delay)


EXIT_RECORD_POLL_S = 0.05
"""How soon a rank seen dead without its exit record is asked about again (its
recorder writes it within milliseconds; its own exit also wakes the supervisor where
pidfds work). The record decides between a crash and a vanished rank."""


async def until_an_exit(opened: list[NodeAgent], delay: float) -> None:
    """Sleep ``delay`` seconds, or less: until a rank (or its recorder) of one of these
    nodes ends, when their agents give exit notices (:meth:`NodeAgent.exit_fds`).

    The event loop waits on the descriptors itself (``add_reader``): no thread, and a
    cancelled activity stops waiting at once. The descriptors that fired are handed
    back to their agents, which close them: a pidfd stays readable once its process
    has ended, and would otherwise end every later wait at once."""
    if delay <= 0:
        return
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()
    fired: dict[int, NodeAgent] = {}
    watched: list[tuple[int, NodeAgent]] = []

    def ended(fd: int, agent: NodeAgent) -> None:
        fired[fd] = agent
        woken.set()

    try:
        for agent in opened:
            for fd in agent.exit_fds():
                try:
                    loop.add_reader(fd, ended, fd, agent)
                except (NotImplementedError, OSError, ValueError):
                    continue  # a loop without add_reader: the round still comes
                watched.append((fd, agent))
        if not watched:
            await asyncio.sleep(delay)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), delay)
    finally:
        for fd, _ in watched:
            loop.remove_reader(fd)
        for agent in opened:
            mine = [fd for fd, owner in fired.items() if owner is agent]
            if mine:
                agent.exits_seen(mine)


DETAILS_EVERY_S = 2.0
"""The heartbeat details (one progress mark per rank: 8,000 ranks cost a tenth of a
second to build) are rebuilt at most this often; beats in between repeat the last.
Temporal records a beat only every few seconds anyway (80% of the heartbeat
timeout), so the restore memory and the live view lag by at most this much."""

RANKS_IN_FULL = 256
"""Up to this many ranks, an outcome carries every rank's status into history; above,
only the ones that say something (see :func:`for_history`)."""


def for_history(outcome: SuperviseOutcome) -> SuperviseOutcome:
    """The outcome as it goes into workflow history. Every rank's status costs about
    200 bytes, in every outcome: 8,000 ranks made each progress report 1.6 MB, over
    Temporal's 2 MB payload limit at 16,000. A large job keeps the ranks that are
    not plainly running (ended, dead, stopped: all a failure names), rank 0, and the
    first live rank (the workflow asks whether any rank is alive); the live view of
    every rank stays in the activity's heartbeat details, out of history."""
    if len(outcome.ranks) <= RANKS_IN_FULL:
        return outcome
    first_alive = next((r.rank for r in outcome.ranks if r.alive), None)
    kept = [
        r
        for r in outcome.ranks
        if r.rank in (0, first_alive)
        or not r.alive
        or r.exit_code is not None
        or r.stopped_by_signal
    ]
    return outcome.model_copy(update={"ranks": kept})
