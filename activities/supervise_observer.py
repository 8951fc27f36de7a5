"""Observing a generation: polling every node of it, and remembering what the nodes
cannot tell (when a node went quiet, when a rank was first seen dead, when each
rank's current progress was first seen).

:class:`GenerationObserver` does the I/O; :func:`~activities.supervise_rules.evaluate`
judges what it saw. How it scales: the module docstring of
:mod:`activities.supervise`.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from activities.diagnosis import TAIL_BYTES
from activities.kernel_evidence import KernelSources, OomWatch
from activities.nodes.agent import NodeAgent, NodeStatus, RankRecord
from activities.nodes.rundir import GenerationDir, read_json, write_json_atomic
from activities.progress_cadence import BACKOFF_MEMORY_S, CadenceLearner, backoff_floor
from activities.straggler_stats import ComputeWindow
from activities.supervise_rules import (
    MIN_FAILED_POLLS,
    NodeObservation,
    Observation,
    SlowPhase,
    max_step,
)
from lazarus.domain.contracts import (
    ProgressMark,
    ProgressSignal,
    RankStatus,
    SuperviseRequest,
    SupervisionProgress,
)
from lazarus.domain.environment import (
    HEARTBEAT_CHECKPOINT_SAVE_S,
    HEARTBEAT_GAP_S,
    HEARTBEAT_GENERATION,
    HEARTBEAT_REJOIN,
)
from lazarus.domain.phases import HEARTBEAT_FIELD, SLOW_PHASE_FIELD

Verdict = tuple[NodeStatus, float, float]
"""What one poll of a node said, when (wall) it was asked and when its answer came."""

MIN_ROUND_WAIT_S = 0.01
"""A round cut short by a deadline still waits this long: a deadline met a hair after
the observation is declared by the next round, without polling in a tight loop."""

MAX_POLL_THREADS = 64
"""Polls out at once. Each node has at most one; a silent node holds its thread until
its agent's timeout, so this many silent nodes at once would delay the others."""


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
            step=max_step(obs.ranks),
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
            hang_budget=obs.hang_budget,
            slow_phases={rank: phase.name for rank, phase in obs.slow_phases.items()},
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
        # Searched over a log's tail of many lines: ``^`` and ``$`` anchor at each
        # line (a ``^step`` pattern matched only the tail's first line before, so the
        # step never advanced and a healthy rank was called hung).
        self._progress_regex = re.compile(regex, re.MULTILINE) if regex else None
        self._regex_steps: dict[int, int] = {}
        self._marks: dict[int, tuple[str, float]] = {}
        """rank -> (progress marker, controller monotonic time of that progress: when a
        poll first saw it, or, on a node that shares our clock, when the rank wrote it)."""
        self._last_asked_at: dict[str, float] = {}
        """node -> when (wall) the poll behind its last answer was asked: new progress in
        the next answer was written after it."""
        self._rank_phases: dict[int, dict[str, float]] = {}
        """rank -> the phase marks of its newest heartbeat (kept while its node is silent)."""
        self._heartbeat_seen = False
        self._save_s: dict[int, float] = {}
        """rank -> its heartbeat's ``checkpoint_save_s`` (kept while its node is silent)."""
        self._signal_seen: float | None = None
        """Monotonic time the first progress of any rank was seen."""
        self._cadence = CadenceLearner(request.health)
        """The job's progress intervals, and the hang budget they give (issue 38)."""
        self._slow_phases: dict[int, SlowPhase] = {}
        """rank -> the slow phase its newest heartbeat declares (kept while its node is silent)."""
        self._cadence_saved_at: float | None = None
        """Monotonic time the learner was last written to :data:`CADENCE_FILE` (None:
        not restored from it yet)."""
        self._phase_seen_at: float | None = None
        """Monotonic time a poll last saw some rank in a slow phase (or first saw it
        closed): an interval of any rank that spans it is the phase's, not the rhythm
        (its peers wait in a collective), and no hang clock starts before it."""
        self._phase_was_open = False
        self._backoff: list[tuple[float, float]] = []
        """(wall time, budget) of hangs the learned budget declared in earlier
        generations of this run (:data:`BACKOFF_FILE`)."""
        self._oom = OomWatch(kernel)
        self._dead_since: dict[int, float] = {}
        self._unreachable_since: dict[str, float] = {}
        """node -> when it went silent: its last answer (:func:`silent_since`)."""
        self._answered_at: dict[str, float] = {}
        """node -> when (wall) its last answer came back, in this attempt."""
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

    def _progressed(
        self,
        rank: int,
        marker: str,
        now: float,
        mono: float,
        written: tuple[float, float] | None = None,
        in_slow_phase: bool = False,
        gap_s: float | None = None,
    ) -> tuple[bool, float]:
        """Whether ``marker`` is new progress for the rank, and when (controller wall
        time, derived from the monotonic clock) its current progress was made.

        That is when this poll first saw it, unless ``written`` is given: (when the rank
        wrote it, when the previous answer of its node was asked), both wall times on
        the controller's own clock (a node that :attr:`~NodeAgent.shares_clock`). The
        progress is then dated at its write, kept inside the window the polls prove: no
        earlier than the previous ask (that answer did not show it) and no later than
        now. Seeing it one poll late made every hang detected up to one
        ``poll_interval_s`` past ``hang_timeout_s``; a wall-clock step moves the date
        by at most that window, never further."""
        known = self._marks.get(rank)
        changed = known is None or known[0] != marker
        if changed:
            at = mono
            if written is not None:
                written_at, previous_ask = written
                at = mono - (now - min(now, max(previous_ask, written_at)))
            self._marks[rank] = (marker, at)
            if known is not None:
                # Dated at its write, the rank's silence is judged on the gaps between its
                # writes: its own measure of the last one, where it gives it, is the sample.
                gap = gap_s if written is not None and gap_s is not None else None
                self._learn(rank, known[1], at, in_slow_phase, gap)
        if self._signal_seen is None:
            self._signal_seen = mono
        return changed, now - (mono - self._marks[rank][1])

    def _keep_cadence(self, wall: float, mono: float) -> None:
        """Restore the learner from an earlier supervision of this generation (first
        call), and write it back every :data:`CADENCE_SAVE_EVERY_S`. Best effort, on
        the controller's copy of the generation directory only: where that is
        missing or unwritable the learner simply starts afresh each supervision."""
        path = self._gen.path / CADENCE_FILE
        if self._cadence_saved_at is None:
            self._cadence_saved_at = mono
            with contextlib.suppress(OSError, ValueError):
                self._cadence.restore(read_json(path), mono, wall)
            with contextlib.suppress(OSError, ValueError):
                self._backoff = _backoff_records(read_json(self._gen.path.parent / BACKOFF_FILE))
            return
        if mono - self._cadence_saved_at < CADENCE_SAVE_EVERY_S or not self._gen.path.is_dir():
            return
        self._cadence_saved_at = mono
        with contextlib.suppress(OSError):
            write_json_atomic(path, self._cadence.to_document(mono, wall))

    def note_learned_hang(self, budget_s: float) -> None:
        """A hang the learned budget declared (not a slow phase's, not
        ``hang_timeout_s``'s): later generations of the run start from twice its budget
        (:func:`~activities.progress_cadence.backoff_floor`). Best effort, like the
        cadence file."""
        wall = self._clock.wall()
        kept = [(at, b) for at, b in self._backoff if wall - at <= BACKOFF_MEMORY_S]
        self._backoff = [*kept[-7:], (wall, budget_s)]
        with contextlib.suppress(OSError):
            if self._gen.path.parent.is_dir():
                write_json_atomic(
                    self._gen.path.parent / BACKOFF_FILE,
                    {"version": 1, "hangs": [list(pair) for pair in self._backoff]},
                )

    def _learn(
        self, rank: int, previous: float, at: float, in_slow_phase: bool, gap: float | None
    ) -> None:
        """Offer the interval between two progress marks of ``rank`` (monotonic times),
        or ``gap``, the rank's own measure of the silence before the newer one, to the
        cadence learner; one a poll saw some rank's slow phase inside is left out, as
        one that began or ended in a phase of the rank's own."""
        spans_phase = self._phase_seen_at is not None and self._phase_seen_at >= previous
        interval = at - previous if gap is None else gap
        self._cadence.add(rank, interval, at, in_slow_phase=in_slow_phase or spans_phase)

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
            verdicts.append((status, asked_at, self._clock.wall()))
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
            return [[(self._poll(agent), asked_at, self._clock.wall())] for agent in self._agents]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=min(MAX_POLL_THREADS, len(self._agents)),
                thread_name_prefix="supervise-poll",
            )
        for agent in self._agents:
            if agent.node.name not in self._in_flight:
                self._in_flight[agent.node.name] = self._pool.submit(self._verdicts, agent)
        wait(list(self._in_flight.values()), timeout=self.round_wait_s())
        answers: list[list[Verdict] | None] = []
        for agent in self._agents:
            future = self._in_flight[agent.node.name]
            if future.done():
                del self._in_flight[agent.node.name]
                answers.append(future.result())
            else:
                answers.append(None)
        return answers

    def due_in(self) -> float | None:
        """Seconds until the first silent node that failed enough polls has been
        silent for ``node_timeout_s`` (:func:`node_loss_due_in`), or None: the poll
        loop wakes then, so a lost node is declared at its deadline, not at the
        first round after it (up to a poll interval later)."""
        confirmed = {
            name: since
            for name, since in self._unreachable_since.items()
            if self._failed_polls.get(name, 0) >= MIN_FAILED_POLLS
        }
        return node_loss_due_in(confirmed, self._request.node_timeout_s, self._clock.wall())

    def round_wait_s(self) -> float:
        """How long a round waits for the polls out: one ``poll_interval_s``, or less
        when a silent node's deadline comes sooner (:meth:`due_in`)."""
        interval = self._request.health.poll_interval_s
        due = self.due_in()
        return interval if due is None else max(MIN_ROUND_WAIT_S, min(interval, due))

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
        self._keep_cadence(now, mono)
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
            for status, asked_at, answered_at in answer:
                if status.reachable:
                    self._unreachable_since.pop(name, None)
                    self._failed_polls.pop(name, None)
                    self._answered_at[name] = answered_at
                else:
                    since = silent_since(self._answered_at.get(name), asked_at)
                    self._unreachable_since.setdefault(name, since)
                    self._failed_polls[name] = self._failed_polls.get(name, 0) + 1
            status = answer[-1][0]
            previous = self._last_asked_at.get(name) if status.reachable else None
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
                ranks.append(
                    self._rank_status(agent, rank, record, status.reachable, now, mono, previous)
                )
                self._last_ranks[rank] = ranks[-1]
            if status.reachable:
                self._last_asked_at[name] = answer[-1][1]
        launched_at = self._launched_at()
        preempted = self._preemption()
        slow_phases = {
            rank: phase
            for rank, phase in self._slow_phases.items()
            if self._last_ranks[rank].alive and self._last_ranks[rank].exit_code is None
        }
        if slow_phases or self._phase_was_open:
            # Open now, or closed since the last poll: the end is no earlier than this.
            self._phase_seen_at = mono
        self._phase_was_open = bool(slow_phases)
        signal = self._progress_signal(now, launched_at)
        return Observation(
            preempted=preempted,
            now=now,
            launched_at=launched_at,
            ranks=ranks,
            dead_since=dict(self._dead_since),
            nodes=nodes,
            multi_node=len(self._agents) > 1
            or any(a.node.transport.own_host for a in self._agents),
            compute=self._compute.recent(now),
            progress_signal=signal,
            signal_seen_at=None if self._signal_seen is None else now - (mono - self._signal_seen),
            rank_phases={rank: dict(marks) for rank, marks in self._rank_phases.items()},
            checkpoint_save_s=max(self._save_s.values(), default=None),
            hang_budget=self._cadence.budget(
                mono, backoff_floor(self._backoff, now), log_progress=signal == "log"
            ),
            slow_phases=slow_phases,
            slow_phase_over_at=(
                None if self._phase_seen_at is None else now - (mono - self._phase_seen_at)
            ),
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
        previous_ask: float | None = None,
    ) -> RankStatus:
        if record is None:
            # The node did not answer: we know nothing new about the rank and must not
            # call it dead for that (node loss has its own clock), so it counts as alive.
            return RankStatus(rank=rank, node=agent.node.name, pid=0, alive=not reachable)
        step: int | None = None
        progress_at: float | None = None
        heartbeat = record.heartbeat
        compute_s: float | None = None
        in_slow_phase = False
        if heartbeat is not None:
            self._heartbeat_seen = True
            phase = slow_phase_of(heartbeat)
            # An interval that began or ends inside a phase of the rank's own is the phase's.
            in_slow_phase = phase is not None or rank in self._slow_phases
            if phase is None:
                self._slow_phases.pop(rank, None)
            else:
                self._slow_phases[rank] = phase
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
            written_at = heartbeat.get("time")
            marker = "hb:" + _marker_of(step, written_at)
            dated = (
                (float(written_at), previous_ask)
                if agent.shares_clock
                and previous_ask is not None
                and isinstance(written_at, (int, float))
                and not isinstance(written_at, bool)
                and math.isfinite(written_at)
                else None
            )
            raw_gap = heartbeat.get(HEARTBEAT_GAP_S)
            gap_s = (
                float(raw_gap)
                if isinstance(raw_gap, int | float)
                and not isinstance(raw_gap, bool)
                and math.isfinite(raw_gap)
                and raw_gap > 0
                else None
            )
            changed, progress_at = self._progressed(
                rank, marker, now, mono, dated, in_slow_phase, gap_s
            )
            raw_compute = heartbeat.get("compute_s")
            if isinstance(raw_compute, (int, float)) and raw_compute > 0:
                compute_s = float(raw_compute)
                if changed:
                    self._compute.add(rank, progress_at, compute_s)
        elif self._progress_regex is not None:
            step = self._step_from_log(agent, rank)
            if step is not None:
                _, progress_at = self._progressed(rank, f"log:{step}", now, mono)
        if record.alive and record.pid is not None and agent.runs_here:
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

    @property
    def generation_dir(self) -> Path:
        """The generation's run directory (on the controller's machine for local ranks)."""
        return self._gen.path

    def answering_agent(self, rank: int) -> NodeAgent | None:
        """The agent of the rank's node, unless that node did not answer the last poll
        (a hang's evidence is not asked of it: the stop would wait out its timeout)."""
        agent = self._agents[rank // self._request.nproc_per_node]
        return None if agent.node.name in self._unreachable_since else agent

    def kernel_evidence_for(self, rank: int, pid: int) -> list[str] | None:
        """The kernel's OOM records for a SIGKILLed rank; None when its node's kernel
        is not visible from here (ranks on other machines)."""
        agent = self._agents[rank // self._request.nproc_per_node]
        if not agent.runs_here or pid <= 0:
            return None
        return self._oom.evidence(rank, pid)


def silent_since(answered_at: float | None, asked_at: float) -> float:
    """When a node that failed a poll went silent: its last answer, as a keep-alive
    counts (torchrun's rendezvous declares a node dead ``interval x attempts`` after
    its last keep-alive), so ``node_timeout_s`` is the silence the node is allowed,
    whatever the poll cadence. The answer's arrival is the latest moment the node was
    known alive: never earlier than it was, so never a loss declared early. Without
    an answer in this attempt (a retried supervision, or a node silent from the
    start), the poll that failed was asked at ``asked_at``: silent since then, as
    before (issue 28: the first failed poll came up to one poll interval after the
    last answer, and the node was declared that much late)."""
    return asked_at if answered_at is None else min(answered_at, asked_at)


def node_loss_due_in(silent: dict[str, float], node_timeout_s: float, now: float) -> float | None:
    """Seconds from ``now`` until the first of the ``silent`` nodes (name -> silent
    since, wall) has been silent ``node_timeout_s``; 0 when one already has, None
    when none is silent."""
    if not silent:
        return None
    return max(0.0, min(silent.values()) + node_timeout_s - now)


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


CADENCE_FILE = "hang-budget.json"
"""In the controller's copy of the generation directory: what the hang budget learned
(:meth:`activities.progress_cadence.CadenceLearner.to_document`), for the next
supervision of the generation."""

BACKOFF_FILE = "hang-budget-backoff.json"
"""In the controller's copy of the run directory (beside the generations): the hangs
the learned budget declared, which raise later generations' budgets."""


def _backoff_records(document: object) -> list[tuple[float, float]]:
    """The (wall time, budget) pairs of :data:`BACKOFF_FILE`; [] for anything else."""
    if not isinstance(document, dict) or document.get("version") != 1:
        return []
    hangs = document.get("hangs")
    if not isinstance(hangs, list):
        return []
    return [
        (float(pair[0]), float(pair[1]))
        for pair in hangs
        if isinstance(pair, list)
        and len(pair) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in pair)
        and math.isfinite(pair[0])
        and math.isfinite(pair[1])
        and pair[1] > 0
    ]


CADENCE_SAVE_EVERY_S = 5.0
"""How often the learner is written back (one small file, fsynced)."""

MAX_PHASE_NAME = 64
"""A slow phase's name is cut to this many characters: it goes into the incident."""


def slow_phase_of(heartbeat: dict[str, object]) -> SlowPhase | None:
    """The slow phase a heartbeat declares (:data:`~lazarus.domain.phases.SLOW_PHASE_FIELD`),
    or None. The heartbeat is the training script's file: a malformed entry counts as
    no phase (the rank keeps the learned budget), never as an error."""
    raw = heartbeat.get(SLOW_PHASE_FIELD)
    if not isinstance(raw, dict):
        return None
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        return None
    budget = raw.get("budget_s")
    budget_s = (
        float(budget)
        if isinstance(budget, int | float)
        and not isinstance(budget, bool)
        and math.isfinite(budget)
        and budget > 0
        else None
    )
    return SlowPhase(name=name[:MAX_PHASE_NAME], budget_s=budget_s)
