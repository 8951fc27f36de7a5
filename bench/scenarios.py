"""The recovery scenarios, registered by name in :data:`SCENARIOS`.

Each scenario starts one example job (see :mod:`bench.jobs`), does one thing to
it, waits for the result and returns an :class:`~bench.harness.Outcome`. To add
one, write ``async def my_scenario(ctx, repeat) -> Outcome`` and decorate it with
``@scenario("name", "one line saying what it does")``; ``python -m bench
recovery --scenarios name`` then runs it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from collections.abc import Awaitable, Callable

from bench.harness import BenchContext, Outcome, Scenario
from bench.measure import RunMonitor
from lazarus import chaos
from workflows.state import Incident

ScenarioFn = Callable[[BenchContext, int], Awaitable[Outcome]]

SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str, summary: str) -> Callable[[ScenarioFn], ScenarioFn]:
    def register(fn: ScenarioFn) -> ScenarioFn:
        if name in SCENARIOS:
            raise ValueError(f"scenario {name!r} is registered twice")
        SCENARIOS[name] = Scenario(name=name, summary=summary, run=fn)
        return fn

    return register


def _only_incident(incidents: list[Incident]) -> Incident | None:
    return incidents[0] if incidents else None


@scenario("clean", "no fault: the baseline for history size and weights")
async def clean(ctx: BenchContext, repeat: int) -> Outcome:
    async with ctx.job("clean", repeat) as job:
        status = await job.result()
        return await job.common_outcome(status)


@scenario("crash", "SIGKILL rank 1 at the fault step; Lazarus relaunches from the checkpoint")
async def crash(ctx: BenchContext, repeat: int) -> Outcome:
    async with ctx.job("crash", repeat) as job:
        await job.reach_step(ctx.shape.fault_step)
        fault = chaos.signal_rank(job.run_root, rank=1, sig=signal.SIGKILL)
        status = await job.result()
        outcome = await job.common_outcome(status)
        incident = _only_incident(status.incidents)
        outcome.details["fault"] = dataclasses.asdict(fault)
        outcome.metrics |= {
            "fault_step": fault.step,
            "named_rank_ok": incident is not None and incident.rank == fault.rank,
            "detection_s": incident.detection_s if incident else None,
            "recovery_s": incident.recovery_s if incident else None,
            "steps_lost": incident.steps_lost if incident else None,
            "resumed_from_step": incident.resumed_from_step if incident else None,
        }
        outcome.metrics |= _outside_recovery(job.monitor, fault, incident)
        return outcome


@scenario("hang", "SIGSTOP rank 0 at the fault step; found by the hang timeout and relaunched")
async def hang(ctx: BenchContext, repeat: int) -> Outcome:
    async with ctx.job("hang", repeat) as job:
        await job.reach_step(ctx.shape.fault_step)
        fault = chaos.signal_rank(job.run_root, rank=0, sig=signal.SIGSTOP)
        status = await job.result()
        outcome = await job.common_outcome(status)
        incident = _only_incident(status.incidents)
        outcome.details["fault"] = dataclasses.asdict(fault)
        outcome.metrics |= {
            "fault_step": fault.step,
            "hang_timeout_s": job.spec.health.hang_timeout_s,
            "named_rank_ok": incident is not None and incident.rank == fault.rank,
            "detection_s": incident.detection_s if incident else None,
            "detection_from_injection_s": (incident.detected_at - fault.at) if incident else None,
            "recovery_s": incident.recovery_s if incident else None,
            "steps_lost": incident.steps_lost if incident else None,
        }
        outcome.metrics |= _outside_recovery(job.monitor, fault, incident)
        return outcome


@scenario(
    "worker_kill",
    "SIGKILL the controller worker at the fault step, restart it after a pause; "
    "ranks must not notice",
)
async def worker_kill(ctx: BenchContext, repeat: int) -> Outcome:
    stack = ctx.stack
    async with ctx.job("worker_kill", repeat) as job:
        fault_step = await job.reach_step(ctx.shape.fault_step)
        killed_at = time.time()
        stack.kill_worker(signal.SIGKILL)
        _, before = chaos.current_step(job.run_root)
        await asyncio.sleep(ctx.shape.worker_down_s)
        _, during = chaos.current_step(job.run_root)
        stack.start_worker()
        restarted_at = time.time()
        status = await job.result()
        outcome = await job.common_outcome(status)
        outcome.details |= {"worker_killed_at": killed_at, "worker_restarted_at": restarted_at}
        outcome.metrics |= {
            "fault_step": fault_step,
            "worker_down_s": restarted_at - killed_at,
            "steps_while_worker_down": (
                during - before if during is not None and before is not None else None
            ),
            "steps_lost": sum(i.steps_lost or 0 for i in status.incidents),
            "duplicate_ranks": job.monitor.max_live_ranks > job.spec.world_size,
        }
        return outcome


def _outside_recovery(
    monitor: RunMonitor, fault: chaos.InjectedFault, incident: Incident | None
) -> dict[str, float | None]:
    """Fault injection to the first heartbeat of the next generation past its resume
    step, from the run directory alone: by the rank's own clock, and when we saw it."""
    resumed = 0
    if incident is not None and incident.resumed_from_step is not None:
        resumed = incident.resumed_from_step
    first = monitor.first_progress(fault.generation + 1, resumed)
    return {
        "recovery_outside_s": first.written_at - fault.at if first else None,
        "recovery_outside_seen_s": first.seen_at - fault.at if first else None,
    }
