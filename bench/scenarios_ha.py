"""More than one controller: how fast a surviving worker takes a job's supervision over.

Production runs two or more workers against one Temporal cluster. The figure that
matters is the gap in supervision when the worker running it dies: nothing watches
the ranks until a survivor's ``supervise`` attempt runs. It is bounded by the spec's
``health.supervisor_heartbeat_timeout_s`` (Temporal's heartbeat timeout on that
activity) plus the retry's first backoff (1 s) and a poll; a shorter timeout shortens
the gap and costs more heartbeat calls to the server, one per 0.8 x timeout per
running supervise (the SDK's heartbeat throttle). ``worker_takeover`` measures both
at the spec's default timeout, ``worker_takeover_fast`` at a short one, so the trade
is read off one table. Lazarus only: a torchrun agent has no second controller.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time

from temporalio.client import WorkflowHandle

from bench.harness import BenchContext, Metric
from bench.registry import Scenario, runs, scenario
from bench.scenarios import finish
from bench.systems import Measured, System
from bench.takeover import kill_supervising_worker, second_stack, supervision_hold
from lazarus.domain.spec import HealthSpec

NO_SECOND_CONTROLLER = (
    "not possible: torchrun's agent is the only controller of its node; nothing takes "
    "over when it dies (see controller_crash)"
)
_NOT_TORCHRUN: dict[System, str] = dict.fromkeys(
    ("torchrun", "torchrun_default"), NO_SECOND_CONTROLLER
)
FAST_HEARTBEAT_TIMEOUT_S = 4.0
"""``worker_takeover_fast``: the timeout the end-to-end tests use."""
HEARTBEAT_SAMPLES = 3
"""Heartbeats of the supervise activity sampled (server-side) before the kill."""

_DOC = """
    1. start a second worker process beside the stack's (same server, task queue and
       host queue); launch the example (its steps slowed so the takeover happens mid-run);
       wait until it reports ``shape.fault_step``;
    2. sample the supervise activity's heartbeats as the server records them
       (``heartbeat_interval_s``);
    3. SIGKILL the worker running ``supervise`` (Temporal's pending activity names it);
    4. wait until the survivor's supervise attempt starts (``takeover_s``) and beats
       (``takeover_first_heartbeat_s``);
    5. restart the killed worker, stop the second one at the end; wait for the job's
       end, weights against the reference: the job must not have noticed.
"""

TAKEOVER = scenario(
    "worker_takeover",
    "SIGKILL the worker holding supervision while a second worker runs; time until the "
    f"survivor supervises (heartbeat timeout {HealthSpec().supervisor_heartbeat_timeout_s:g} s, "
    "the default).\n" + _DOC,
    not_possible=_NOT_TORCHRUN,
)
TAKEOVER_FAST = scenario(
    "worker_takeover_fast",
    "worker_takeover with supervisor_heartbeat_timeout_s "
    f"{FAST_HEARTBEAT_TIMEOUT_S:g} s: a shorter gap for more heartbeat calls.\n" + _DOC,
    not_possible=_NOT_TORCHRUN,
)


async def heartbeat_interval(
    handle: WorkflowHandle[object, object], samples: int, timeout_s: float
) -> float | None:
    """The median gap between the supervise heartbeats the server recorded, or None."""
    seen: list[float] = []
    deadline = time.monotonic() + timeout_s
    while len(seen) <= samples and time.monotonic() < deadline:
        hold = await supervision_hold(handle)
        beat = hold.last_heartbeat_at if hold is not None else None
        if beat is not None and (not seen or beat > seen[-1]):
            seen.append(beat)
        await asyncio.sleep(0.05)
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    return statistics.median(gaps) if gaps else None


def _takeover_runner(sc: Scenario, timeout_s: float) -> None:
    @runs(sc, "lazarus")
    async def takeover_lazarus(ctx: BenchContext, repeat: int) -> Measured:
        shape = ctx.shape
        # Room after the fault step for the heartbeat sample, the takeover and some more.
        needed_s = (HEARTBEAT_SAMPLES + 2) * timeout_s + 10.0
        step_time = max(shape.step_time_s, needed_s / max(1, shape.steps - shape.fault_step))
        health = shape.health_section(supervisor_heartbeat_timeout_s=timeout_s)
        other = second_stack(ctx.stack, ctx.workdir / f"{sc.name}-{repeat}-second-worker")
        ctx.resources.append(other)
        other.start_worker()
        try:
            async with ctx.lazarus(
                sc.name,
                repeat,
                extra_args=["--step-time", f"{step_time:g}"],
                step_time_s=step_time,
                spec_extra={"health": health},
            ) as run:
                step = await run.job.reach_step(shape.fault_step)
                handle = run.job.handle
                interval = await heartbeat_interval(
                    handle, HEARTBEAT_SAMPLES, (HEARTBEAT_SAMPLES + 1) * timeout_s
                )
                taken = await kill_supervising_worker(handle, [ctx.stack, other])
                if not ctx.stack.worker_running:
                    ctx.stack.start_worker()  # later scenarios need the stack's own worker
                status, metrics, details = await finish(run)
        finally:
            other.stop()
            if not ctx.stack.worker_running:
                ctx.stack.start_worker()
        details |= {
            "killed_worker": taken.killed_identity,
            "survivor": taken.survivor_identity,
            "killed_at": taken.killed_at,
            "survivor_attempt": taken.attempt,
            "step_time_s": step_time,
        }
        measured: dict[str, Metric] = {
            "fault_step": step,
            "supervisor_heartbeat_timeout_s": timeout_s,
            "takeover_s": taken.started_after_s,
            "takeover_first_heartbeat_s": taken.first_heartbeat_after_s,
            "heartbeat_interval_s": interval,
            "heartbeats_per_min": 60.0 / interval if interval else None,
            "training_survived": bool(metrics["completed"]) and bool(metrics["weights_ok"]),
            "steps_lost": sum(i.steps_lost or 0 for i in status.incidents),
        }
        return Measured(metrics | measured, details)


_takeover_runner(TAKEOVER, HealthSpec().supervisor_heartbeat_timeout_s)
_takeover_runner(TAKEOVER_FAST, FAST_HEARTBEAT_TIMEOUT_S)
