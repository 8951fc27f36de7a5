"""The peers in the chaos soak (:mod:`bench.soak`): the same seeded schedule of
crashes, hangs and controller losses, and the same operator, as Lazarus and torchrun.

``nvrx`` is driven as torchrun (SIGKILL / SIGSTOP a rank, SIGKILL the launcher);
``nvrx_inprocess``'s faults hit the process holding the rank (no controller to crash);
``torchft``'s hit group ``rank``'s trainer, and a controller crash kills the
Lighthouse. A member job's generation is the operator's restarts plus each member's
own; torchft's trace counts a step once every group committed it (the job at full
world size). What each fault is and why: docs/results/2026-12-peers.md, the soak.
"""

from __future__ import annotations

import bisect
import dataclasses
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

from bench.harness import BenchContext
from bench.measure import StepTrace
from bench.peers.jobs import Member, MemberJob, MemberPoint
from bench.peers.scenarios import (
    inprocess_members,
    member_job,
    nvrx_launcher,
    require,
    torchft_members,
)
from bench.peers.settings import NVRX_DIST, TORCHFT_DIST, TorchftSettings
from bench.soak import PEER_SOAKS, SoakDriver, _TorchrunDriver
from bench.soak_results import SoakFault, SoakSystemResult
from bench.systems import System

EPOCH = 1_000_000
"""Generations per operator restart: a restart's generations sort after all before."""


def soak_context(ctx: BenchContext, steps: int, step_time_s: float) -> BenchContext:
    """``ctx`` with the soak's job length and step time in its shape."""
    view = ctx.under("torchrun")
    shape = dataclasses.replace(ctx.shape, steps=steps, step_time_s=step_time_s)
    view.config = dataclasses.replace(ctx.config, shape=shape)
    return view


class MemberDriver(SoakDriver):
    """A peer made of several processes (:class:`MemberJob`), driven from outside."""

    def __init__(
        self,
        system: System,
        job: MemberJob,
        members: Callable[[], list[Member]],
        victim: Callable[[MemberJob, SoakFault], str],
        controller: str | None,
        full_world: int | None = None,
    ) -> None:
        """``full_world``: the members that must each commit a step for it to count
        (torchft's replica groups); None: every committed step counts."""
        self.system = system
        self.job = job
        self.members = members
        self.victim = victim
        self.controller = controller
        self.restarts: list[float] = []
        self.full_world = full_world
        self._committers: dict[tuple[int, int], set[str]] = {}
        """What :meth:`generation_step` has counted so far (see :meth:`counted`)."""
        self._seen = 0
        self._newest: MemberPoint | None = None

    def generation_at(self, t: float) -> int:
        latest: dict[str, int] = {}
        for at, member, generation in list(self.job.ups):
            if at <= t:
                latest[member] = generation
        return bisect.bisect_right(self.restarts, t) * EPOCH + sum(latest.values())

    def counted(
        self,
        points: list[MemberPoint],
        committers: dict[tuple[int, int], set[str]],
        full_world: bool = True,
    ) -> Iterator[MemberPoint]:
        """The points that count, in order: committed ones, and with ``full_world``
        only the one completing a step's set of committers (``committers``: (operator
        epoch, step) -> the members that committed it, so far; updated)."""
        needed = self.full_world if full_world else None
        for point in points:
            if not point.committed:
                continue
            epoch = bisect.bisect_right(self.restarts, point.t)
            committed_by = committers.setdefault((epoch, point.step), set())
            committed_by.add(point.member)
            if needed is None or len(committed_by) == needed:
                yield point

    def trace(self, full_world: bool = True) -> StepTrace:
        trace = StepTrace(started_at=self.job.started_at)
        for point in self.counted(self.job.snapshot(), {}, full_world):
            trace.add(point.t, self.generation_at(point.t), point.step)
        return trace

    def note(self, result: SoakSystemResult, until: float) -> str | None:
        if self.full_world is None:
            return None
        survivors = self.trace(full_world=False)
        ettr = survivors.productive_seconds(until=until) / result.wall_s
        return (
            f"a step counts once all {self.full_world} replica groups committed it (full "
            f"world size); counting the survivors' steps alone too, ETTR {ettr:.1%}"
        )

    def generation_step(self) -> tuple[int, int | None]:
        """The newest counted step (for torchft: at full world size, so a fault is
        injected only into the whole job, and the operator steps in when the job has
        not been whole for ``soak_operator_after_s``)."""
        points = self.job.snapshot()  # appended in time order: only the new ones
        for point in self.counted(points[self._seen :], self._committers):
            self._newest = point
        self._seen = len(points)
        since = self.restarts[-1] if self.restarts else 0.0
        newest = self._newest
        step = newest.step if newest is not None and newest.t >= since else None
        return self.generation_at(time.time()), step

    async def inject(self, fault: SoakFault) -> None:
        if fault.kind == "controller_crash":
            if self.controller is None:
                raise LookupError(f"{self.system} has no controller apart from its ranks")
            self.job.signal_member(self.controller, signal.SIGKILL)
            return
        sig = signal.SIGKILL if fault.kind == "crash" else signal.SIGSTOP
        self.job.signal_member(self.victim(self.job, fault), sig)

    async def operator(self) -> str:
        self.restarts.append(time.time())
        self.job.restart(self.members())
        return f"restarted {self.system}"


def _live_rank(job: MemberJob, fault: SoakFault) -> str:
    """The in-process member holding the fault's rank among the live ones."""
    live = [m.name for m in job.members if job.returncode(m.name) is None]
    if not live:
        raise LookupError("no live process")
    return live[fault.rank % len(live)]


@asynccontextmanager
async def nvrx_soak(
    ctx: BenchContext, steps: int, step_time_s: float, max_restarts: int
) -> AsyncIterator[SoakDriver]:
    async with nvrx_launcher(
        soak_context(ctx, steps, step_time_s), "soak", 0, max_restarts=max_restarts
    ) as run:
        yield _TorchrunDriver(run, "nvrx")


@asynccontextmanager
async def nvrx_inprocess_soak(
    ctx: BenchContext, steps: int, step_time_s: float, max_restarts: int
) -> AsyncIterator[SoakDriver]:
    """``max_restarts``: the Wrapper restarts in process without a count to spend."""
    require(NVRX_DIST)
    view = soak_context(ctx, steps, step_time_s)
    paths = view._paths("nvrx-inprocess", "soak", 0)
    async with member_job(view, "nvrx_inprocess", inprocess_members(view, paths), paths) as job:
        yield MemberDriver(
            "nvrx_inprocess", job, lambda: inprocess_members(view, paths), _live_rank, None
        )


@asynccontextmanager
async def torchft_soak(
    ctx: BenchContext, steps: int, step_time_s: float, max_restarts: int
) -> AsyncIterator[SoakDriver]:
    require(TORCHFT_DIST)
    view = soak_context(ctx, steps, step_time_s)
    paths = view._paths("torchft", "soak", 0)

    def members() -> list[Member]:
        return torchft_members(view, paths, max_restarts=max_restarts)

    async with member_job(view, "torchft", members(), paths) as job:
        yield MemberDriver(
            "torchft",
            job,
            members,
            lambda _, fault: f"group{fault.rank}",
            "lighthouse",
            full_world=TorchftSettings.for_shape(view.shape).groups,
        )


PEER_SOAKS.update(
    {"nvrx": nvrx_soak, "nvrx_inprocess": nvrx_inprocess_soak, "torchft": torchft_soak}
)
