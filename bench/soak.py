"""The chaos soak: the same seeded schedule of random faults, about one a minute,
against a long job under each system in turn; goodput, not a single recovery.

Faults are drawn (``random.Random(seed)``) from ``crash`` (SIGKILL a rank),
``hang`` (SIGSTOP a rank) and ``controller_crash`` (SIGKILL the Lazarus worker,
restarted after ``controller_down_s``; SIGKILL the torchrun agent). A fault
falls due at its time but waits until the job is training again, so each one
hits a running job. A real operator exists too: when the job makes no progress
for ``soak_operator_after_s`` the harness restarts it (torchrun: kill
everything, start torchrun again, which resumes from the newest checkpoint;
Lazarus: ``force_recover``, or ``resume`` if it asks for an operator) and the
incident counts as unhandled. That is generous to a system that needs one: a
person is rarely paged, logged in and done within a minute.

Reported per system, from the step trace (:class:`bench.measure.StepTrace`):

* ETTR: productive time (new steps beyond the high-water mark) / wall time.
* MTTR: mean fault-to-first-step-of-the-next-generation over incidents that
  needed a relaunch (crash, hang, and any that needed the operator).
* incidents, and unhandled incidents (those the operator had to fix).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import signal
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from bench.costs import table
from bench.harness import BenchContext, LazarusRun, TorchrunRun
from bench.measure import StepTrace
from bench.scenarios import kill_controller
from bench.soak_results import (
    FAULT_KINDS,
    SoakFault,
    SoakIncident,
    SoakResult,
    SoakSystemResult,
)
from bench.systems import LAZARUS_SETUPS, System
from infra import chaos
from lazarus.app.client import RequestRejected
from workflows.state import Phase

TRAINING_FRESH_S = 2.0
"""A fault is injected only into a job that made progress this recently..."""
STEADY_S = 3.0
"""...and whose current generation has been making progress for this long: a fault
that fell due during an outage does not hit the very first step after it."""
SOAK_TAIL_RECOVERY_S = 15.0
"""No fault this close to the end, beyond the operator's delay: room for a relaunch."""
TRACE_KEEP_S = 0.5
"""The JSON keeps at most one trace point per generation every this many seconds."""


def schedule(
    minutes: float, every_s: float, seed: int, tail_s: float = 0.0, world_size: int = 2
) -> list[SoakFault]:
    """Faults about ``every_s`` apart (jittered by up to a fifth either way), none in
    the last ``tail_s`` (the operator's delay plus a recovery), so that every fault
    is resolved, one way or the other, inside the soak. At least one fault."""
    rng = random.Random(seed)
    duration = minutes * 60.0
    faults: list[SoakFault] = []
    for i in range(int(duration / every_s) + 1):
        at_s = every_s * (i + 1) + rng.uniform(-0.2, 0.2) * every_s
        kind = rng.choice(FAULT_KINDS)
        rank = rng.randrange(world_size)
        if at_s > duration - tail_s:
            break
        faults.append(SoakFault(at_s=at_s, kind=kind, rank=rank))
    if not faults:
        faults.append(SoakFault(at_s=duration / 3, kind=rng.choice(FAULT_KINDS), rank=0))
    return faults


class SoakDriver:
    """What the soak needs from a system; one subclass per system (the peers' are in
    :mod:`bench.peers.soak`, registered in :data:`PEER_SOAKS`)."""

    system: System

    def trace(self) -> StepTrace:
        raise NotImplementedError

    def generation_step(self) -> tuple[int, int | None]:
        raise NotImplementedError

    async def inject(self, fault: SoakFault) -> None:
        raise NotImplementedError

    async def operator(self) -> str:
        """What a paged person does; returns what was done."""
        raise NotImplementedError

    def note(self, result: SoakSystemResult, until: float) -> str | None:
        """What the table should say about how this system's figures were counted."""
        return None


class _LazarusDriver(SoakDriver):
    def __init__(self, ctx: BenchContext, run: LazarusRun, system: System = "lazarus") -> None:
        self.ctx, self.run, self.system = ctx, run, system

    def trace(self) -> StepTrace:
        return self.run.trace()

    def generation_step(self) -> tuple[int, int | None]:
        return chaos.current_step(self.run.job.run_root)

    async def inject(self, fault: SoakFault) -> None:
        if fault.kind == "controller_crash":
            await kill_controller(self.ctx.stack, self.ctx.shape.worker_down_s)
            return
        sig = signal.SIGKILL if fault.kind == "crash" else signal.SIGSTOP
        chaos.signal_rank(self.run.job.run_root, rank=fault.rank, sig=sig)

    async def operator(self) -> str:
        control = self.run.job.control
        stack = self.ctx.stack
        if not stack.worker_running:
            stack.start_worker()
        status = await control.status()
        if status.phase in (Phase.NEEDS_OPERATOR, Phase.PAUSED):
            await control.resume()
            return f"resume ({status.phase.value})"
        try:
            await control.force_recover("soak operator")
        except RequestRejected as refused:  # e.g. a recovery already under way
            return f"force_recover refused ({status.phase.value}): {refused.reason}"
        return f"force_recover ({status.phase.value})"

    async def controller_ettr(self) -> float | None:
        return (await self.run.job.control.status()).ettr


class _TorchrunDriver(SoakDriver):
    def __init__(self, run: TorchrunRun, system: System = "torchrun") -> None:
        self.run, self.system = run, system

    def trace(self) -> StepTrace:
        return self.run.job.snapshot()

    def generation_step(self) -> tuple[int, int | None]:
        return self.run.job.generation, self.run.job.current_step()

    async def inject(self, fault: SoakFault) -> None:
        if fault.kind == "controller_crash":
            if self.run.job.agent_running:
                await asyncio.to_thread(self.run.job.kill_agent)
            return
        sig = signal.SIGKILL if fault.kind == "crash" else signal.SIGSTOP
        self.run.job.signal_rank(fault.rank, sig)

    async def operator(self) -> str:
        await asyncio.to_thread(self.run.job.kill_processes)
        self.run.job.start()
        return "restarted torchrun"


PeerSoak = Callable[[BenchContext, int, float, int], AbstractAsyncContextManager[SoakDriver]]
"""Starts a peer's soak job (context, steps, step time, restart budget) and yields its
driver; everything it started is stopped on exit."""
PEER_SOAKS: dict[System, PeerSoak] = {}
"""The peers' soak jobs by system, filed by :mod:`bench.peers.soak` when imported
(:mod:`bench.catalog` imports it: the peers import this module, not the reverse)."""


async def run_soak(
    ctx: BenchContext,
    systems: Sequence[System],
    plot_path: Path | None,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    config = ctx.config
    plan = schedule(
        config.soak_minutes,
        config.soak_fault_every_s,
        config.seed,
        tail_s=config.soak_operator_after_s + SOAK_TAIL_RECOVERY_S,
    )
    progress(
        "compare: soak schedule: " + ", ".join(f"{f.at_s:.0f}s {f.kind}@{f.rank}" for f in plan)
    )
    duration = config.soak_minutes * 60.0
    steps = int(duration / config.soak_step_time_s * 3) + 100
    results: dict[str, SoakSystemResult] = {}
    for system in systems:
        progress(f"compare: soak under {system} for {config.soak_minutes:g} min ...")
        if system in LAZARUS_SETUPS:
            recovery = {**ctx.shape.recovery, "max_restarts": config.soak_max_restarts}
            async with ctx.under(system).lazarus(
                "soak",
                0,
                steps=steps,
                step_time_s=config.soak_step_time_s,
                spec_extra={"recovery": recovery},
            ) as lrun:
                lazarus = _LazarusDriver(ctx, lrun, system)
                result = await _soak(
                    lazarus, plan, duration, config.soak_operator_after_s, progress
                )
                result.controller_reported_ettr = await lazarus.controller_ettr()
        elif system == "torchrun":
            async with ctx.torchrun(
                "soak",
                0,
                steps=steps,
                max_restarts=config.soak_max_restarts,
                step_time_s=config.soak_step_time_s,
            ) as trun:
                driver = _TorchrunDriver(trun)
                result = await _soak(driver, plan, duration, config.soak_operator_after_s, progress)
        elif system in PEER_SOAKS:
            peer = PEER_SOAKS[system](ctx, steps, config.soak_step_time_s, config.soak_max_restarts)
            async with peer as peer_driver:
                result = await _soak(
                    peer_driver, plan, duration, config.soak_operator_after_s, progress
                )
                result.note = peer_driver.note(result, time.time())
        else:
            progress(f"compare: soak: {system} has no soak driver (skipped)")
            continue
        results[system] = result
        progress(
            f"compare: soak {system}: ETTR {result.ettr:.3f}, MTTR "
            f"{result.mttr_s if result.mttr_s is None else round(result.mttr_s, 1)} s, "
            f"{result.incident_count} incidents, {result.unhandled} unhandled"
        )
    soak = SoakResult(
        minutes=config.soak_minutes,
        seed=config.seed,
        fault_every_s=config.soak_fault_every_s,
        operator_after_s=config.soak_operator_after_s,
        step_time_s=config.soak_step_time_s,
        schedule=plan,
        systems=results,
    )
    if plot_path is not None and results:
        from bench import plot

        await asyncio.to_thread(plot.soak_plot, soak, plot_path)
        soak.plot = str(plot_path)
    return soak.model_dump()


async def _soak(
    driver: SoakDriver,
    plan: list[SoakFault],
    duration: float,
    operator_after_s: float,
    progress: Callable[[str], None],
) -> SoakSystemResult:
    started = time.time()
    incidents: list[SoakIncident] = []
    last_step: int | None = None
    last_progress = started
    steady_since: tuple[int, float] | None = None
    """(generation, when it first made progress)."""
    last_operator = started
    last_injected = 0.0
    min_gap = min((b.at_s - a.at_s for a, b in itertools.pairwise(plan)), default=0.0)
    pending = list(plan)

    def now_s() -> float:
        return time.time() - started

    while now_s() < duration:
        generation, step = driver.generation_step()
        if step is not None and step != last_step:
            last_step, last_progress = step, time.time()
            if steady_since is None or steady_since[0] != generation:
                steady_since = (generation, last_progress)
        # Start-up counts as a stall too, but the clock restarts with the operator's action.
        stalled = time.time() - max(last_progress, last_operator)
        if stalled > operator_after_s:
            action = await driver.operator()
            last_operator = time.time()
            incidents.append(
                SoakIncident(
                    kind="operator",
                    at_s=now_s(),
                    generation=generation,
                    step=step,
                    handled=False,
                    note=f"no progress for {stalled:.0f} s: {action}",
                )
            )
            progress(f"compare: soak {driver.system}: operator at {now_s():.0f} s: {action}")
        training = (
            step is not None
            and time.time() - last_progress < TRAINING_FRESH_S
            and steady_since is not None
            and steady_since[0] == generation
            and time.time() - steady_since[1] >= STEADY_S
        )
        # Faults that fell due during an outage wait, and then keep their spacing.
        spaced = time.time() - last_injected >= min_gap / 2
        if pending and now_s() >= pending[0].at_s and training and spaced:
            fault = pending.pop(0)
            at = now_s()
            last_injected = time.time()
            try:
                await driver.inject(fault)
            except (LookupError, ProcessLookupError) as exc:  # the rank died meanwhile
                progress(f"compare: soak {driver.system}: {fault.kind} not injected: {exc}")
                continue
            incidents.append(
                SoakIncident(
                    kind=fault.kind,
                    rank=None if fault.kind == "controller_crash" else fault.rank,
                    due_s=fault.at_s,
                    at_s=at,
                    generation=generation,
                    step=step,
                )
            )
            progress(f"compare: soak {driver.system}: {fault.kind} at {at:.0f} s (step {step})")
        await asyncio.sleep(0.1)
    end = started + duration
    trace = driver.trace()
    trace.started_at = started
    _assess(incidents, trace, started)
    recoveries = [i.recovery_s for i in incidents if i.recovery_s is not None]
    productive = trace.productive_seconds(until=end)
    return SoakSystemResult(
        system=driver.system,
        wall_s=duration,
        productive_s=productive,
        ettr=productive / duration,
        mttr_s=statistics.fmean(recoveries) if recoveries else None,
        incident_count=sum(1 for i in incidents if i.kind != "operator"),
        unhandled=sum(1 for i in incidents if i.kind != "operator" and not i.handled),
        operator_interventions=sum(1 for i in incidents if i.kind == "operator"),
        final_step=trace.max_step(before=end),
        incidents=incidents,
        trace=_thin(trace),
    )


def _assess(incidents: list[SoakIncident], trace: StepTrace, started: float) -> None:
    """Recovery time of each fault, and whether the operator had to step in before it."""
    operators = [i.at_s for i in incidents if i.kind == "operator"]
    faults = [i for i in incidents if i.kind != "operator"]
    for index, incident in enumerate(faults):
        next_at = faults[index + 1].at_s if index + 1 < len(faults) else None
        operated = [t for t in operators if t >= incident.at_s and (next_at is None or t < next_at)]
        if incident.kind == "controller_crash":
            incident.handled = not operated
            incident.note = "training went on" if not operated else "the operator restarted it"
            continue
        first = trace.first_of_later_generation(incident.generation, started + incident.at_s)
        if first is not None and (next_at is None or first.t - started < next_at):
            incident.recovery_s = first.t - started - incident.at_s
        if first is None:
            incident.handled = False
            incident.note = "no relaunched generation before the next fault or the end"
            continue
        incident.handled = not any(t < first.t - started for t in operated)


def _thin(trace: StepTrace) -> list[tuple[float, int, int]]:
    kept: list[tuple[float, int, int]] = []
    last: dict[int, float] = {}
    for p in trace.sorted_points():
        t = p.t - trace.started_at
        if t - last.get(p.generation, -1e9) >= TRACE_KEEP_S:
            kept.append((round(t, 3), p.generation, p.step))
            last[p.generation] = t
    return kept


def markdown(extra: dict[str, Any]) -> str:
    if "error" in extra:
        return f"soak: failed: {extra['error']}"
    soak = SoakResult.model_validate(extra)
    head = ["soak", "ETTR", "MTTR s", "incidents", "unhandled", "operator restarts", "final step"]
    rows: list[tuple[object, ...]] = []
    for name, r in soak.systems.items():
        mttr = None if r.mttr_s is None else f"{r.mttr_s:.1f}"
        counts = (r.incident_count, r.unhandled, r.operator_interventions, r.final_step)
        rows.append((name, f"{r.ettr:.1%}", mttr, *counts))
    lines = [
        f"Soak: {soak.minutes:g} min per system, seed {soak.seed}, "
        f"{len(soak.schedule)} faults ({', '.join(f.kind for f in soak.schedule)}), "
        f"operator after {soak.operator_after_s:.0f} s without progress",
        "",
        *table(head, rows),
    ]
    notes = [f"- {name}: {r.note}" for name, r in soak.systems.items() if r.note]
    if notes:
        lines.extend(["", *notes])
    if soak.plot:
        lines.append(f"\nplot: {soak.plot}")
    return "\n".join(lines)
