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
    SuperviseOutcome,
    SuperviseRequest,
    SupervisionProgress,
)
from activities.diagnosis import diagnose_crash, log_tail
from activities.procfs import is_alive, is_stopped
from activities.rundir import GenerationDir, read_json

VANISHED_GRACE_S = 1.5
"""A dead rank gets this long for its wrapper to write the exit-status file."""


@dataclass
class Observation:
    now: float
    launched_at: float
    ranks: list[RankStatus]
    logs: dict[int, str] = field(default_factory=dict)
    """Log paths by rank, for evidence."""
    dead_since: dict[int, float] = field(default_factory=dict)
    """Ranks seen dead without an exit-status file, and since when."""


class GenerationObserver:
    """Reads one generation's run directory; remembers only what files cannot tell."""

    def __init__(self, request: SuperviseRequest) -> None:
        self._request = request
        self._gen = GenerationDir(Path(request.run_dir))
        regex = request.health.progress_regex
        self._progress_regex = re.compile(regex) if regex else None
        self._log_offsets: dict[int, int] = {}
        self._regex_steps: dict[int, tuple[int, float]] = {}
        self._dead_since: dict[int, float] = {}
        self._first_seen = time.time()

    def _launched_at(self) -> float:
        launch = read_json(self._gen.launch_file)
        if launch is not None:
            return float(launch["launched_at"])
        return self._first_seen

    def _scan_log_for_steps(self, rank: int, now: float) -> tuple[int, float] | None:
        assert self._progress_regex is not None
        path = self._gen.log_file(rank)
        offset = self._log_offsets.get(rank, 0)
        try:
            with open(path, "rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
        except FileNotFoundError:
            return self._regex_steps.get(rank)
        # Only consume whole lines, so a step number split across reads is not misparsed.
        cut = chunk.rfind(b"\n") + 1
        self._log_offsets[rank] = offset + cut
        last_step: int | None = None
        for match in self._progress_regex.finditer(chunk[:cut].decode(errors="replace")):
            text = match.groupdict().get("step") or match.group(1)
            if text is not None and text.isdigit():
                last_step = int(text)
        previous = self._regex_steps.get(rank)
        if last_step is not None and (previous is None or last_step != previous[0]):
            self._regex_steps[rank] = (last_step, now)
        return self._regex_steps.get(rank)

    def observe(self) -> Observation:
        now = time.time()
        statuses: list[RankStatus] = []
        for rank in range(self._request.world_size):
            pid_record = read_json(self._gen.pid_file(rank))
            exit_record = read_json(self._gen.exit_file(rank))
            heartbeat = read_json(self._gen.heartbeat_file(rank))
            pid = int(pid_record["pid"]) if pid_record else 0
            alive = bool(pid_record) and is_alive(pid, int(pid_record["start_ticks"]))  # type: ignore[index]
            step: int | None = None
            progress_at: float | None = None
            if heartbeat is not None and "step" in heartbeat:
                step, progress_at = int(heartbeat["step"]), float(heartbeat["time"])
            elif self._progress_regex is not None:
                seen = self._scan_log_for_steps(rank, now)
                if seen is not None:
                    step, progress_at = seen
            if pid_record and not alive and exit_record is None:
                self._dead_since.setdefault(rank, now)
            statuses.append(
                RankStatus(
                    rank=rank,
                    pid=pid,
                    alive=alive,
                    stopped_by_signal=alive and is_stopped(pid),
                    exit_code=exit_record.get("exit_code") if exit_record else None,
                    signal=exit_record.get("signal") if exit_record else None,
                    ended_at=exit_record.get("ended_at") if exit_record else None,
                    step=step,
                    last_progress_at=progress_at,
                )
            )
        return Observation(
            now=now,
            launched_at=self._launched_at(),
            ranks=statuses,
            logs={r: str(self._gen.log_file(r)) for r in range(self._request.world_size)},
            dead_since=dict(self._dead_since),
        )


def _max_step(ranks: list[RankStatus]) -> int | None:
    steps = [r.step for r in ranks if r.step is not None]
    return max(steps) if steps else None


def _crash(request: SuperviseRequest, obs: Observation) -> FailureReport | None:
    failed = [r for r in obs.ranks if r.exit_code is not None and r.exit_code != 0]
    if not failed:
        return None
    # The first rank to fail is the root cause; the rest died with it in the collective.
    root = min(failed, key=lambda r: (r.ended_at or obs.now, r.rank))
    diagnosis = diagnose_crash(obs.logs.get(root.rank), root.exit_code, root.signal)
    return FailureReport(
        kind="crash",
        failure_class=diagnosis.failure_class,
        rank=root.rank,
        exit_code=root.exit_code,
        signal=root.signal,
        evidence=diagnosis.evidence,
        fault_at=root.ended_at or obs.now,
        detected_at=obs.now,
        step_at_failure=_max_step(obs.ranks),
        collateral_ranks=sorted(r.rank for r in failed if r.rank != root.rank),
    )


def _earliest(*reports: FailureReport | None) -> FailureReport | None:
    """A rank that vanished before another crashed is the root cause, not collateral."""
    found = [r for r in reports if r is not None]
    return min(found, key=lambda r: r.fault_at) if found else None


def _vanished(obs: Observation) -> FailureReport | None:
    # Past the grace, or at once when another rank has already crashed after it died.
    crashed_at = min(
        (r.ended_at for r in obs.ranks if r.exit_code not in (None, 0) and r.ended_at), default=None
    )
    gone = [
        (since, rank)
        for rank, since in obs.dead_since.items()
        if obs.ranks[rank].exit_code is None
        and (
            obs.now - since >= VANISHED_GRACE_S or (crashed_at is not None and since <= crashed_at)
        )
    ]
    if not gone:
        return None
    since, rank = min(gone)
    return FailureReport(
        kind="vanished",
        failure_class="unknown",
        rank=rank,
        evidence=[
            f"rank {rank} is gone and its wrapper recorded no exit status: "
            "its whole process group was killed from outside"
        ],
        fault_at=since,
        detected_at=obs.now,
        step_at_failure=_max_step(obs.ranks),
    )


def _hang(request: SuperviseRequest, obs: Observation) -> FailureReport | None:
    health = request.health
    stalled: list[tuple[RankStatus, float]] = []
    for status in obs.ranks:
        if not status.alive:
            continue
        if status.last_progress_at is None:
            if obs.now - obs.launched_at > health.startup_timeout_s:
                stalled.append((status, obs.launched_at))
        elif obs.now - status.last_progress_at > health.hang_timeout_s:
            stalled.append((status, status.last_progress_at))
    if not stalled:
        return None
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
    evidence = [
        f"rank {culprit.rank} made no progress for {silent:.1f} s "
        f"(last step {culprit.step}, process {state}); hang_timeout_s={health.hang_timeout_s}"
    ]
    evidence += log_tail(obs.logs.get(culprit.rank), lines=5)
    return FailureReport(
        kind="hang",
        failure_class="hang",
        rank=culprit.rank,
        evidence=evidence,
        fault_at=since,
        detected_at=obs.now,
        step_at_failure=_max_step(obs.ranks),
        collateral_ranks=sorted(s.rank for s, _ in stalled if s.rank != culprit.rank),
    )


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
    failure = _earliest(_crash(request, obs), _vanished(obs)) or _hang(request, obs)
    if failure is not None:
        return SuperviseOutcome(kind="failed", failure=failure, **base)
    if all(r.exit_code == 0 for r in obs.ranks):
        return SuperviseOutcome(kind="succeeded", **base)
    if request.report_first_step:
        first = _first_step_at(request, obs)
        if first is not None:
            return SuperviseOutcome(kind="first_step", first_step_at=first, **base)
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


@activity.defn(name="supervise")
async def supervise(request: SuperviseRequest) -> SuperviseOutcome:
    """Watch one generation until it fails, finishes, or has progress worth reporting."""
    observer = GenerationObserver(request)
    rate = StepRate()
    started_at = time.time()
    while True:
        obs = await asyncio.to_thread(observer.observe)
        seconds_per_step = rate.update(obs.ranks)
        outcome = evaluate(request, obs, started_at, seconds_per_step)
        if outcome is not None:
            return outcome
        activity.heartbeat(
            SupervisionProgress(
                generation=request.generation,
                step=_max_step(obs.ranks),
                alive=sum(1 for r in obs.ranks if r.alive),
                world_size=request.world_size,
                seconds_per_step=seconds_per_step,
                observed_at=obs.now,
            )
        )
        await asyncio.sleep(request.health.poll_interval_s)
