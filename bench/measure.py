"""Measuring a job from the outside: what the controller reports is checked, not trusted.

:class:`RunMonitor` samples the run directory in a background thread (rank processes
alive, each generation's heartbeats); :func:`count_history_events` counts a workflow's
events across its continue-as-new chain; :class:`StepTrace` is a job's progress as
(wall time, generation, step) points, from which recovery, steps lost and goodput are
computed by one piece of code for every system. The method:
docs/results/2026-12-bench-notebook.md, "How it measures".
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from pydantic import BaseModel
from temporalio.client import Client

from activities.nodes.rundir import generations_below, read_json
from infra import chaos
from lazarus.domain import environment as env_names

SAMPLE_INTERVAL_S = 0.05


@dataclass(frozen=True)
class ProgressSeen:
    """A heartbeat that reported a new step, and when."""

    generation: int
    rank: int
    step: int
    written_at: float
    """The rank's own timestamp in the heartbeat file."""
    seen_at: float
    """When the monitor first read it."""


class BackgroundSampler:
    """Calls :meth:`sample` every ``interval_s`` in a daemon thread while used as a
    context manager: the benches' and the chaos matrix's outside observers."""

    def __init__(self, interval_s: float, name: str) -> None:
        self.interval_s = interval_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._done.is_set():
            self.sample()
            self._done.wait(self.interval_s)

    def sample(self) -> None:
        raise NotImplementedError


class RunMonitor(BackgroundSampler):
    """Samples a job's run directory every 50 ms until stopped (use it as a context manager)."""

    def __init__(self, job_run_root: Path, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        super().__init__(interval_s, name="bench-monitor")
        self.job_run_root = job_run_root
        self.live_counts: list[int] = []
        self.progress: list[ProgressSeen] = []
        self._last_step: dict[tuple[int, int], int] = {}

    def sample(self) -> None:
        self.live_counts.append(len(chaos.live_rank_processes(self.job_run_root)))
        now = time.time()
        for gen in generations_below(self.job_run_root):
            for hb_file in gen.path.glob("rank-*.heartbeat.json"):
                record = read_json(hb_file)
                if record is None or "step" not in record or record.get(env_names.HEARTBEAT_REJOIN):
                    # A survivor rejoining in place writes the new generation's file at
                    # once ("joining", its step the resume step, nothing trained yet):
                    # that is not training again, and must not end a recovery's clock.
                    continue
                rank = int(hb_file.name.split(".")[0].removeprefix("rank-"))
                key = (gen.generation, rank)
                step = int(record["step"])
                if self._last_step.get(key) != step:
                    self._last_step[key] = step
                    self.progress.append(
                        ProgressSeen(gen.generation, rank, step, float(record["time"]), now)
                    )

    @property
    def max_live_ranks(self) -> int:
        return max(self.live_counts, default=0)

    def first_progress(self, generation: int, after_step: int) -> ProgressSeen | None:
        """The earliest heartbeat of ``generation`` past ``after_step`` (by the rank's clock)."""
        seen = [p for p in self.progress if p.generation == generation and p.step > after_step]
        return min(seen, key=lambda p: p.written_at) if seen else None


@dataclass(frozen=True)
class HistorySize:
    events: int
    runs: int


async def count_history_events(client: Client, workflow_id: str, first_run_id: str) -> HistorySize:
    """Events across the whole continue-as-new chain, following each run to the next."""
    events = 0
    runs = 0
    run_id: str | None = first_run_id
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        events += len(history.events)
        runs += 1
        last = history.events[-1] if history.events else None
        run_id = None
        if last is not None and last.HasField(
            "workflow_execution_continued_as_new_event_attributes"
        ):
            run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return HistorySize(events=events, runs=runs)


@dataclass(frozen=True)
class Step:
    """One activity or timer of a workflow: what it was and when it ran (epoch s)."""

    name: str
    started_at: float
    ended_at: float | None
    outcome: str
    """completed, failed, timed_out, canceled, fired (a timer), or open."""


_CLOSED = {
    "activity_task_completed_event_attributes": "completed",
    "activity_task_failed_event_attributes": "failed",
    "activity_task_timed_out_event_attributes": "timed_out",
    "activity_task_canceled_event_attributes": "canceled",
}


async def workflow_timeline(
    client: Client, workflow_id: str, run_id: str, fault_at: float, before_s: float = 5.0
) -> list[dict[str, object]]:
    """The activities and timers of one workflow run from ``before_s`` before the fault,
    in seconds from it: where the seconds of a recovery went, by the server's clock."""
    return [
        {
            "name": st.name,
            "from_s": round(st.started_at - fault_at, 3),
            "to_s": round(st.ended_at - fault_at, 3) if st.ended_at else None,
            "outcome": st.outcome,
        }
        for st in await workflow_steps(client, workflow_id, run_id)
        if (st.ended_at or st.started_at) >= fault_at - before_s
    ]


async def workflow_steps(client: Client, workflow_id: str, run_id: str) -> list[Step]:
    """Every activity and timer of one workflow run, in the order they were scheduled."""
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    opened: dict[int, tuple[str, float]] = {}
    closed: dict[int, tuple[float, str]] = {}
    for event in history.events:
        at = event.event_time.seconds + event.event_time.nanos / 1e9
        kind = event.WhichOneof("attributes")
        if kind == "activity_task_scheduled_event_attributes":
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            opened[event.event_id] = (name, at)
        elif kind == "timer_started_event_attributes":
            opened[event.event_id] = ("timer", at)
        elif kind == "timer_fired_event_attributes":
            closed[event.timer_fired_event_attributes.started_event_id] = (at, "fired")
        elif kind == "timer_canceled_event_attributes":
            closed[event.timer_canceled_event_attributes.started_event_id] = (at, "canceled")
        elif kind in _CLOSED:
            scheduled = int(getattr(event, kind).scheduled_event_id)
            closed[scheduled] = (at, _CLOSED[kind])
    steps = []
    for event_id, (name, at) in sorted(opened.items()):
        end = closed.get(event_id)
        steps.append(Step(name, at, end[0] if end else None, end[1] if end else "open"))
    return steps


# --------------------------------------------------------------------------- step traces

STEP_LINE = re.compile(r"^step (\d+) loss")


class TracePoint(BaseModel):
    """A rank completed ``step`` at ``t`` (epoch seconds) in ``generation`` (1 = first launch)."""

    t: float
    generation: int
    step: int


class StepTrace(BaseModel):
    """Every progress point of one job, in the order seen."""

    started_at: float
    """When the job was launched: the origin of every relative time."""
    points: list[TracePoint] = []

    def add(self, t: float, generation: int, step: int) -> None:
        self.points.append(TracePoint(t=t, generation=generation, step=step))

    def sorted_points(self) -> list[TracePoint]:
        return sorted(self.points, key=lambda p: p.t)

    def max_step(self, before: float | None = None) -> int | None:
        steps = [p.step for p in self.points if before is None or p.t <= before]
        return max(steps, default=None)

    def generation_at(self, t: float) -> int:
        """The newest generation that had reported progress by ``t`` (0: none yet)."""
        return max((p.generation for p in self.points if p.t <= t), default=0)

    def first_of_later_generation(self, generation: int, after: float) -> TracePoint | None:
        """The first step of any generation newer than ``generation``, after ``after``."""
        later = [p for p in self.points if p.generation > generation and p.t >= after]
        return min(later, key=lambda p: p.t) if later else None

    def time_reaching(self, step: int, after: float = 0.0) -> float | None:
        """When the job first reported ``step`` or beyond (after ``after``)."""
        times = [p.t for p in self.points if p.step >= step and p.t >= after]
        return min(times, default=None)

    def rate(self, low: int, high: int) -> float | None:
        """Steps per second from first reaching ``low`` to first reaching ``high``."""
        t_low, t_high = self.time_reaching(low), self.time_reaching(high)
        if t_low is None or t_high is None or t_high <= t_low:
            return None
        return (high - low) / (t_high - t_low)

    def productive_seconds(self, until: float | None = None) -> float:
        """Time spent making new progress: each step beyond the high-water mark is
        credited with the time since the previous point of its own generation.
        Outages (from a fault to a generation's first step), work redone after a
        resume and start-up are not productive; this is what ETTR divides by wall time."""
        productive = 0.0
        high_water = 0
        last: dict[int, TracePoint] = {}
        for point in self.sorted_points():
            if until is not None and point.t > until:
                break
            previous = last.get(point.generation)
            last[point.generation] = point
            if previous is None or point.step <= previous.step:
                high_water = max(high_water, point.step)
                continue
            new_steps = point.step - max(high_water, previous.step)
            if new_steps > 0:
                productive += (point.t - previous.t) * new_steps / (point.step - previous.step)
            high_water = max(high_water, point.step)
        return productive


def steady_window(steps: int) -> tuple[int, int]:
    """The steps a job's steady rate or CPU is sampled between, 1/6 and 5/6 of its
    steps: after start-up and rendezvous, before the end."""
    return max(1, steps // 6), steps * 5 // 6


LEAVES_GENERATION = re.compile(r"^lazarus\.rank: rank \d+ leaves generation \d+ ")
"""The line a rank rejoining in place prints as it leaves its generation: what its log
holds after it belongs to later generations (the log stays the process's own)."""


def max_logged_step(log_files: list[Path]) -> int | None:
    """The highest ``step <n>`` any of these rank logs printed in their generation:
    exact, where a heartbeat (written at most every 0.2 s) may miss the last step
    before a kill. A survivor that rejoined in place goes on in the same log; only
    the lines before it left count."""
    best: int | None = None
    for path in log_files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if LEAVES_GENERATION.match(line):
                break
            match = STEP_LINE.match(line)
            if match:
                step = int(match.group(1))
                best = step if best is None else max(best, step)
    return best
