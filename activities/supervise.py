"""Supervising a generation: long-running, heartbeating, and stateless across workers.

Everything the supervisor needs is on disk in the generation's run directory, so
an attempt started after a worker crash re-attaches with no loss: exit-status
files say what ended while nobody watched, heartbeat files carry the time of the
last progress, and hang clocks therefore survive the hand-over.

The split is deliberate: :class:`GenerationObserver` does the I/O and
:func:`evaluate` is a pure function from one observation to an outcome, so the
detection rules are unit-tested without processes.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from temporalio import activity

from activities.contracts import (
    FailureReport,
    RankStatus,
    StragglerReport,
    SuperviseOutcome,
    SuperviseRequest,
    SupervisionProgress,
)
from activities.diagnosis import TAIL_BYTES, diagnose_crash, last_lines
from activities.nodes.agent import NodeAgent, NodeStatus, RankRecord
from activities.nodes.factory import agents, on_each
from activities.rundir import GenerationDir, read_json
from activities.straggler_stats import ComputeWindow, find_straggler
from lazarus.spec import NodeSpec

VANISHED_GRACE_S = 1.5
"""A dead rank gets this long for its wrapper to write the exit-status file."""


@dataclass
class NodeObservation:
    reachable: bool
    unreachable_since: float | None = None
    error: str | None = None


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
    """Per-rank (heartbeat time, compute seconds) samples inside the straggler window."""


class GenerationObserver:
    """Polls every node of one generation concurrently; remembers only what the
    nodes cannot tell (when a node went quiet, when a rank was first seen dead)."""

    def restore(self, memory: SupervisionProgress) -> None:
        self._unreachable_since.update(memory.unreachable_since)
        self._dead_since.update(memory.dead_since)

    def memory(self) -> tuple[dict[str, float], dict[int, float]]:
        return dict(self._unreachable_since), dict(self._dead_since)

    def __init__(self, request: SuperviseRequest, opened: list[NodeAgent]) -> None:
        self._request = request
        self._agents = opened
        self._gen = GenerationDir(Path(request.run_dir))
        regex = request.health.progress_regex
        self._progress_regex = re.compile(regex) if regex else None
        self._regex_steps: dict[int, tuple[int, float]] = {}
        self._dead_since: dict[int, float] = {}
        self._unreachable_since: dict[str, float] = {}
        self._first_seen = time.time()
        self._launch_time: float | None = None
        self._compute = ComputeWindow(request.straggler.window_s)
        per_node = request.nproc_per_node
        self._ranks_of = {
            agent.node.name: list(range(i * per_node, (i + 1) * per_node))
            for i, agent in enumerate(opened)
        }

    def _launched_at(self) -> float:
        """Read once: launch.json never changes after the launch completes."""
        if self._launch_time is None:
            launch = read_json(self._gen.launch_file)
            if launch is None:
                return self._first_seen
            self._launch_time = float(launch["launched_at"])
        return self._launch_time

    def _step_from_log(self, agent: NodeAgent, rank: int, now: float) -> tuple[int, float] | None:
        assert self._progress_regex is not None
        text = agent.log_tail(str(self._gen.path), rank, 16 * 1024)
        last_step: int | None = None
        for match in self._progress_regex.finditer(text):
            found = match.groupdict().get("step") or match.group(1)
            if found is not None and found.isdigit():
                last_step = int(found)
        previous = self._regex_steps.get(rank)
        if last_step is not None and (previous is None or last_step != previous[0]):
            self._regex_steps[rank] = (last_step, now)
        return self._regex_steps.get(rank)

    def _poll(self, agent: NodeAgent) -> NodeStatus:
        return agent.poll(str(self._gen.path), self._ranks_of[agent.node.name])

    def observe(self) -> Observation:
        asked_at = time.time()  # a silent node went quiet when we asked, not when we gave up
        statuses = on_each(self._agents, self._poll)
        now = time.time()
        ranks: list[RankStatus] = []
        nodes: dict[str, NodeObservation] = {}
        for agent, status in zip(self._agents, statuses, strict=True):
            name = agent.node.name
            if status.reachable:
                self._unreachable_since.pop(name, None)
            else:
                self._unreachable_since.setdefault(name, asked_at)
            nodes[name] = NodeObservation(
                reachable=status.reachable,
                unreachable_since=self._unreachable_since.get(name),
                error=status.error,
            )
            by_rank = {record.rank: record for record in status.ranks}
            for rank in self._ranks_of[name]:
                ranks.append(
                    self._rank_status(agent, rank, by_rank.get(rank), status.reachable, now)
                )
        return Observation(
            now=now,
            launched_at=self._launched_at(),
            ranks=ranks,
            dead_since=dict(self._dead_since),
            nodes=nodes,
            multi_node=len(self._agents) > 1 or any(a.node.launcher == "ssh" for a in self._agents),
            compute=self._compute.recent(now),
        )

    def _rank_status(
        self, agent: NodeAgent, rank: int, record: RankRecord | None, reachable: bool, now: float
    ) -> RankStatus:
        if record is None:
            # The node did not answer: we know nothing new about the rank and must not
            # call it dead for that (node loss has its own clock), so it counts as alive.
            return RankStatus(rank=rank, node=agent.node.name, pid=0, alive=not reachable)
        step: int | None = None
        progress_at: float | None = None
        heartbeat = record.heartbeat
        compute_s: float | None = None
        if heartbeat is not None and "step" in heartbeat:
            step, progress_at = int(heartbeat["step"]), float(heartbeat["time"])
            raw_compute = heartbeat.get("compute_s")
            if isinstance(raw_compute, (int, float)) and raw_compute > 0:
                compute_s = float(raw_compute)
                self._compute.add(rank, progress_at, compute_s)
        elif self._progress_regex is not None:
            seen = self._step_from_log(agent, rank, now)
            if seen is not None:
                step, progress_at = seen
        if record.pid is not None and not record.alive and record.exit is None:
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
        )

    def evidence_for(self, rank: int) -> str:
        """The log tail of one rank (one extra round trip, only when something failed)."""
        per_node = self._request.nproc_per_node
        agent = self._agents[rank // per_node]
        try:
            return agent.log_tail(str(self._gen.path), rank, TAIL_BYTES)
        except Exception as exc:
            return f"(log of rank {rank} unavailable: {exc})"


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
        failure_class="unknown",  # classified from the log tail by with_evidence()
        rank=root.rank,
        node=root.node,
        exit_code=root.exit_code,
        signal=root.signal,
        fault_at=root.ended_at or obs.now,
        detected_at=obs.now,
        step_at_failure=_max_step(obs.ranks),
        collateral_ranks=sorted(r.rank for r in failed if r.rank != root.rank),
    )


def _vanishing(obs: Observation) -> bool:
    """Some rank is dead with no exit status yet: its wrapper may still be writing it."""
    return any(obs.now - since < VANISHED_GRACE_S for since in obs.dead_since.values())


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
        failure_class="unknown",
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
    every one of its ranks vanished without an exit status."""
    found: list[tuple[float, str, str]] = []
    for name, node in obs.nodes.items():
        if not node.reachable and node.unreachable_since is not None:
            silent = obs.now - node.unreachable_since
            if crashed or silent >= request.node_timeout_s:
                found.append(
                    (
                        node.unreachable_since,
                        name,
                        f"node {name} unreachable for {silent:.1f} s: {node.error}",
                    )
                )
        elif obs.multi_node:
            mine = [r for r in obs.ranks if r.node == name]
            dead = [obs.dead_since.get(r.rank) for r in mine]
            if mine and all(d is not None and obs.now - d >= VANISHED_GRACE_S for d in dead):
                since = min(d for d in dead if d is not None)
                found.append(
                    (since, name, f"every rank on node {name} vanished without exit status")
                )
    if not found:
        return None
    since, name, why = min(found)
    node_ranks = [r.rank for r in obs.ranks if r.node == name]
    return FailureReport(
        kind="node_lost",
        failure_class="node_lost",
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


def _hang(request: SuperviseRequest, obs: Observation) -> FailureReport | None:
    health = request.health
    stalled: list[tuple[RankStatus, float]] = []
    for status in obs.ranks:
        node = obs.nodes.get(status.node)
        if not status.alive or (node is not None and not node.reachable):
            continue
        if status.last_progress_at is None:
            if obs.now - obs.launched_at > health.startup_timeout_s:
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
    return FailureReport(
        kind="hang",
        failure_class="hang",
        rank=culprit.rank,
        node=culprit.node,
        evidence=[
            f"rank {culprit.rank} made no progress for {silent:.1f} s "
            f"(last step {culprit.step}, process {state}); hang_timeout_s={health.hang_timeout_s}"
        ],
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
    if crash is not None and _vanishing(obs):
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


def with_evidence(failure: FailureReport, log_text: str) -> FailureReport:
    """Attach the decisive log lines (and, for a crash, the failure class)."""
    if failure.kind == "crash":
        diagnosis = diagnose_crash(log_text, failure.exit_code, failure.signal)
        return failure.model_copy(
            update={"failure_class": diagnosis.failure_class, "evidence": diagnosis.evidence}
        )
    return failure.model_copy(update={"evidence": [*failure.evidence, *last_lines(log_text, 5)]})


def _first_step_at(request: SuperviseRequest, obs: Observation) -> float | None:
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
    }
    failure = _failure(request, obs)
    if failure is not None:
        return SuperviseOutcome(kind="failed", failure=failure, **base)
    if all(r.exit_code == 0 for r in obs.ranks):
        return SuperviseOutcome(kind="succeeded", **base)
    if request.report_first_step:
        first = _first_step_at(request, obs)
        if first is not None:
            return SuperviseOutcome(kind="first_step", first_step_at=first, **base)
    straggler = _straggler(request, obs)
    if straggler is not None:
        return SuperviseOutcome(kind="straggler", straggler=straggler, **base)
    if obs.now - started_at >= request.report_after_s:
        return SuperviseOutcome(kind="progress", **base)
    return None


class StepRate:
    """Seconds per step over the supervisor's window, for ETTR and restart-cost estimates."""

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
            if self._first is None or newest[0] < self._first[0]:
                self._first = newest
            self._last = newest
        if self._first and self._last and self._last[0] > self._first[0]:
            return (self._last[1] - self._first[1]) / (self._last[0] - self._first[0])
        return None


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
    meanwhile, or Temporal would think this worker died."""
    task = asyncio.create_task(asyncio.to_thread(observer.observe))
    while True:
        done, _ = await asyncio.wait({task}, timeout=1.0)
        if done:
            return task.result()
        if last is not None:
            activity.heartbeat(last)


@activity.defn(name="supervise")
async def supervise(request: SuperviseRequest) -> SuperviseOutcome:
    """Watch one generation until it fails, finishes, or has progress worth reporting."""
    nodes = request.nodes or [NodeSpec()]
    with agents(nodes, request.ssh) as opened:
        observer = GenerationObserver(request, opened)
        last = _previous_memory()
        if last is not None and last.generation == request.generation:
            observer.restore(last)
        rate = StepRate()
        started_at = time.time()
        while True:
            obs = await _observe_heartbeating(observer, last)
            seconds_per_step = rate.update(obs.ranks)
            outcome = evaluate(request, obs, started_at, seconds_per_step)
            if outcome is not None:
                if outcome.failure is not None:
                    log_text = await asyncio.to_thread(observer.evidence_for, outcome.failure.rank)
                    outcome = outcome.model_copy(
                        update={"failure": with_evidence(outcome.failure, log_text)}
                    )
                return outcome
            unreachable_since, dead_since = observer.memory()
            last = SupervisionProgress(
                generation=request.generation,
                step=_max_step(obs.ranks),
                alive=sum(1 for r in obs.ranks if r.alive),
                world_size=request.world_size,
                seconds_per_step=seconds_per_step,
                observed_at=obs.now,
                unreachable_since=unreachable_since,
                dead_since=dead_since,
            )
            activity.heartbeat(last)
            await asyncio.sleep(request.health.poll_interval_s)
