"""A job's progress as (wall time, generation, step) points, and what follows from it.

Both systems are judged from the same kind of record, taken from outside the
controller: under torchrun, the ranks' timestamped ``step <n>`` lines; under
Lazarus, the ranks' heartbeat files. Recovery time, steps lost and goodput are
then computed by one piece of code for both, so a difference in the numbers is a
difference in the systems, not in how they were measured.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

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

    def relative(self) -> list[tuple[float, int]]:
        """(seconds since launch, step), for plots."""
        return [(p.t - self.started_at, p.step) for p in self.sorted_points()]


def max_logged_step(log_files: list[Path]) -> int | None:
    """The highest ``step <n>`` any of these rank logs printed: exact, where a
    heartbeat (written at most every 0.2 s) may miss the last step before a kill."""
    best: int | None = None
    for path in log_files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            match = STEP_LINE.match(line)
            if match:
                step = int(match.group(1))
                best = step if best is None else max(best, step)
    return best
