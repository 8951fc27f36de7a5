"""The single-node scenarios, each scripted once per system.

Every runner starts the example job (see :mod:`bench.jobs`) under its system
through :class:`~bench.harness.BenchContext`, injects its fault once the job
reports ``shape.fault_step``, and measures with the same helpers for both
systems (:func:`recovery_metrics`, :class:`~bench.measure.StepTrace`), so the
numbers line up column by column. Every metric name is defined in
:mod:`bench.metrics`. The multi-node scenarios are in
:mod:`bench.scenarios_multinode`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from dataclasses import dataclass

from activities.nodes.rundir import read_json
from bench.harness import BenchContext, LazarusRun, Metric, TorchrunRun, wait_until
from bench.jobs import JobShape, flags
from bench.measure import RunMonitor, StepTrace, steady_window
from bench.metrics import PHASE_METRICS
from bench.registry import runs, scenario
from bench.systems import Measured
from bench.torchrun import TorchrunSetup
from infra import chaos
from lazarus.app.local_stack import LocalStack
from lazarus.domain.recovery_timeline import RecoveryTimeline
from workflows.state import Incident, JobStatus, Phase

NO_PAUSE = (
    "not possible: torchrun has no pause; stopping the agent ends the job, and "
    "starting it again resumes from the last periodic checkpoint"
)


# --------------------------------------------------------------------------- shared


def recovery_metrics(
    trace: StepTrace,
    fault_at: float,
    fault_generation: int,
    max_step_before: int | None,
    resumed_from: int | None = None,
) -> dict[str, Metric]:
    """Fault to the next generation's first step, and the steps it redid."""
    first = trace.first_of_later_generation(fault_generation, fault_at)
    if first is None:
        return {
            "recovered": False,
            "recovery_outside_s": None,
            "steps_lost": None,
            "resumed_from_step": None,
        }
    resume = resumed_from if resumed_from is not None else first.step - 1
    before = max_step_before
    if before is None:
        before = trace.max_step(before=first.t)
    return {
        "recovered": True,
        "recovery_outside_s": first.t - fault_at,
        "steps_lost": (before - resume) if before is not None else None,
        "resumed_from_step": resume,
    }


def _seen_outside(monitor: RunMonitor, generation: int, fault_at: float) -> float | None:
    """When the monitor read the first heartbeat of a later generation (recovery_outside_seen_s)."""
    later = [p for p in monitor.progress if p.generation > generation and p.written_at >= fault_at]
    first = min(later, key=lambda p: p.written_at) if later else None
    return first.seen_at - fault_at if first is not None else None


def _first(incidents: list[Incident], since: float | None = None) -> Incident | None:
    """The first incident, or with ``since`` the first detected after it: the one the
    injected fault caused, not an earlier one (a loaded machine's false alarm would
    otherwise give every figure of the run from the wrong incident, negative ones)."""
    later = incidents if since is None else [i for i in incidents if i.detected_at >= since]
    return later[0] if later else None


def since(start: float | None, end: float | None) -> float | None:
    """Seconds from ``start`` to ``end``; None when either is unknown."""
    return end - start if start is not None and end is not None else None


async def finish(run: LazarusRun) -> tuple[JobStatus, dict[str, Metric], dict[str, object]]:
    """Wait for the Lazarus job; the figures every Lazarus run reports."""
    status = await run.job.result()
    ended = time.time()
    common = await run.job.common_outcome(status)
    metrics: dict[str, Metric] = {**common.metrics, "wall_s": ended - run.started_at}
    return status, metrics, dict(common.details)


def _lazarus_phases(
    incident: Incident | None, trace: StepTrace, fault_at: float
) -> dict[str, Metric]:
    """Where a Lazarus recovery's seconds went: fault to stopped, to relaunched, and
    relaunch to the first step (the new ranks' start-up: python, torch, rendezvous)."""
    if incident is None:
        return {}
    first = trace.first_of_later_generation(incident.generation, fault_at)
    loaded = incident.timeline.checkpoint_loaded_at if incident.timeline else None
    return {
        "stopped_after_s": since(fault_at, incident.stopped_at),
        "relaunched_after_s": since(fault_at, incident.relaunched_at),
        "relaunch_to_first_step_s": since(incident.relaunched_at, first.t if first else None),
        "state_loaded_outside_s": since(fault_at, loaded),
    }


def phase_metrics(timeline: RecoveryTimeline | None) -> dict[str, Metric]:
    """``phase_<name>_s`` for each phase the recovery reached: the seconds from the
    previous phase reached (:meth:`RecoveryTimeline.durations`); none without a
    timeline. The report's phase table prints their medians."""
    if timeline is None:
        return {}
    by_label = {label: name for name, label in PHASE_METRICS}
    return {by_label[d.phase]: d.seconds for d in timeline.durations()}


async def _rank_fault(
    ctx: BenchContext, repeat: int, name: str, rank: int, sig: signal.Signals
) -> Measured:
    """The Lazarus side of crash and hang: signal one rank at the fault step."""
    async with ctx.lazarus(name, repeat) as run:
        return await rank_fault(ctx, run, rank, sig)


async def rank_fault(
    ctx: BenchContext, run: LazarusRun, rank: int, sig: signal.Signals
) -> Measured:
    """Signal ``rank`` of a started Lazarus job once it reports the fault step, wait
    for the end, and measure the recovery (crash and hang here; the multi-node crash
    on ssh nodes)."""
    await run.job.reach_step(ctx.shape.fault_step)
    fault = chaos.signal_rank(run.job.run_root, rank=rank, sig=sig)
    status, metrics, details = await finish(run)
    trace = run.trace()
    incident = _first(status.incidents, since=fault.at)
    metrics |= {
        "fault_step": fault.step,
        "detected": incident is not None,
        "named_rank_ok": incident is not None and incident.rank == fault.rank,
        "detection_s": incident.detection_s if incident else None,
        "detection_from_injection_s": (incident.detected_at - fault.at) if incident else None,
        "recovery_s": incident.recovery_s if incident else None,
        **recovery_metrics(
            trace,
            fault.at,
            fault.generation,
            run.logged_max_step(fault.generation),
            incident.resumed_from_step if incident else None,
        ),
        "recovery_outside_seen_s": _seen_outside(run.job.monitor, fault.generation, fault.at),
        **_lazarus_phases(incident, trace, fault.at),
        **phase_metrics(incident.timeline if incident else None),
    }
    if sig == signal.SIGSTOP:
        metrics["hang_timeout_s"] = run.job.spec.health.hang_timeout_s
    details["fault"] = dataclasses.asdict(fault)
    return Measured(metrics, details)


async def torchrun_reach(ctx: BenchContext, run: TorchrunRun, step: int) -> int:
    timeout = ctx.shape.job_timeout_s
    if not await wait_until(lambda: (run.job.current_step() or 0) >= step, timeout):
        raise TimeoutError(
            f"torchrun: step {step} not reached in {timeout:.0f} s:\n{run.job.tail()}"
        )
    return run.job.current_step() or step


async def _torchrun_finish(
    ctx: BenchContext, run: TorchrunRun, steps: int | None = None
) -> dict[str, Metric]:
    ended = await run.wait_exit(ctx.shape.job_timeout_s)
    if ended is None:
        raise TimeoutError(f"torchrun did not finish in {ctx.shape.job_timeout_s:.0f} s")
    completed = run.job.agent.returncode == 0
    weights_ok = completed and await ctx.weights_ok(run.weights, steps)
    return torchrun_end(run, ended, completed, weights_ok, run.job.nproc)


async def torchrun_recovered(
    run: TorchrunRun, generation: int, fault_at: float, timeout_s: float
) -> bool:
    """Whether a generation after ``generation`` stepped within ``timeout_s`` of the fault."""
    trace = run.job.snapshot
    return await wait_until(
        lambda: trace().first_of_later_generation(generation, fault_at) is not None, timeout_s
    )


def torchrun_end(
    run: TorchrunRun, ended: float, completed: bool, weights_ok: bool, world_size: int
) -> dict[str, Metric]:
    """What every finished job under a torchrun-style agent reports, as
    :meth:`bench.harness.BenchJob.common_outcome` does for Lazarus."""
    return {
        "completed": completed,
        "weights_ok": weights_ok,
        "wall_s": ended - run.job.trace.started_at,
        "generations": run.job.generation,
        "max_live_ranks": run.job.max_live_ranks,
        "duplicate_ranks": run.job.max_live_ranks > world_size,
    }


def unrecovered(metrics: dict[str, Metric], run: TorchrunRun, bound_s: float) -> Measured:
    """A run under a torchrun-style agent that showed no restarted generation's step
    within ``bound_s``: not completed, and the agent's last lines to say why."""
    note = f"no step of a restarted generation within {bound_s:.0f} s"
    return Measured(
        {**metrics, "completed": False, "weights_ok": False}, {"tail": run.job.tail()}, note=note
    )


def torchrun_recovery(run: TorchrunRun, fault_at: float, generation: int) -> dict[str, Metric]:
    trace = run.job.snapshot()
    first = trace.first_of_later_generation(generation, fault_at)
    resumed = run.job.resumed_from.get(first.generation) if first is not None else None
    detected = run.job.agent_detection_after(fault_at)
    relaunched = None
    started: float | None = None
    if first is not None:
        restarted = [r for r in run.job.ranks if r.generation == first.generation]
        relaunched = min((r.seen_at for r in restarted), default=None)
        started = max((r.started_at for r in restarted), default=None)
    # What torchrun's output allows: fault (the injection), the agent noticing, the
    # last restarted worker's process start, the first new step.
    timeline = RecoveryTimeline(
        fault_at=fault_at,
        detected_at=detected,
        rank_started_at=started,
        first_step_at=first.t if first is not None else None,
    )
    return {
        "detected": detected is not None,
        "detection_from_injection_s": (detected - fault_at) if detected is not None else None,
        **recovery_metrics(trace, fault_at, generation, None, resumed),
        "relaunch_to_first_step_s": since(relaunched, first.t if first else None),
        **phase_metrics(timeline),
    }


# --------------------------------------------------------------------------- clean

CLEAN = scenario(
    "clean",
    """No fault: each system's baseline wall time, rate, history size and weights.

    1. launch the example (2 ranks, ``shape.steps`` steps);
    2. wait for it to finish; compare its weights with the fault-free reference.
    """,
)


def _rate(trace: StepTrace, shape: JobShape) -> dict[str, Metric]:
    """Steps per second over the middle of the job, and launch to first step."""
    return {
        "steps_per_s": trace.rate(*steady_window(shape.steps)),
        "launch_to_first_step_s": since(trace.started_at, trace.time_reaching(1)),
    }


@runs(CLEAN, "lazarus")
async def clean_lazarus(ctx: BenchContext, repeat: int) -> Measured:
    async with ctx.lazarus("clean", repeat) as run:
        _, metrics, details = await finish(run)
        metrics |= _rate(run.trace(), ctx.shape)
    return Measured(metrics, details)


@runs(CLEAN, "torchrun")
async def clean_torchrun(ctx: BenchContext, repeat: int) -> Measured:
    async with ctx.torchrun("clean", repeat) as run:
        metrics = await _torchrun_finish(ctx, run)
        metrics |= _rate(run.job.snapshot(), ctx.shape)
    return Measured(metrics)


# --------------------------------------------------------------------------- crash

CRASH = scenario(
    "crash",
    """SIGKILL rank 1 at the fault step; the controller relaunches from the checkpoint.

    1. launch the example; wait until it reports ``shape.fault_step``;
    2. SIGKILL rank 1 (the bench's clock: the injection);
    3. Lazarus: the wrapper sees the death, an incident opens, the survivor is
       stopped, a new generation resumes from the newest checkpoint. torchrun:
       the agent restarts every rank (``--max-restarts``); ``torchrun_default``
       gets a bounded wait for any step of the restarted generation;
    4. wait for the end; weights against the reference.
    """,
)


@runs(CRASH, "lazarus")
async def crash_lazarus(ctx: BenchContext, repeat: int) -> Measured:
    return await _rank_fault(ctx, repeat, "crash", rank=1, sig=signal.SIGKILL)


async def _crash_torchrun(ctx: BenchContext, repeat: int, setup: TorchrunSetup) -> Measured:
    # The best setup is expected to recover: it gets as long as a whole job. The
    # default setup often hangs after a restart: it gets a bounded wait.
    bound = ctx.config.torchrun_default_bound_s if setup == "default" else ctx.shape.job_timeout_s
    async with ctx.torchrun("crash", repeat, setup=setup) as run:
        return await crash_under_agent(ctx, run, bound)


async def crash_under_agent(ctx: BenchContext, run: TorchrunRun, bound: float) -> Measured:
    """SIGKILL rank 1 of a job under a torchrun-style agent (torchrun, NVRx's
    ``ft_launcher``) at the fault step; wait ``bound`` for a restarted generation's
    step, then for the end."""
    step = await torchrun_reach(ctx, run, ctx.shape.fault_step)
    generation = run.job.generation
    run.job.signal_rank(1, signal.SIGKILL)
    fault_at = time.time()
    if not await torchrun_recovered(run, generation, fault_at, bound):
        return unrecovered(
            {"fault_step": step, **torchrun_recovery(run, fault_at, generation)}, run, bound
        )
    metrics = await _torchrun_finish(ctx, run)
    metrics |= {"fault_step": step, **torchrun_recovery(run, fault_at, generation)}
    return Measured(metrics)


@runs(CRASH, "torchrun")
async def crash_torchrun(ctx: BenchContext, repeat: int) -> Measured:
    return await _crash_torchrun(ctx, repeat, "best")


@runs(CRASH, "torchrun_default")
async def crash_torchrun_default(ctx: BenchContext, repeat: int) -> Measured:
    return await _crash_torchrun(ctx, repeat, "default")


# --------------------------------------------------------------------------- hang

HANG = scenario(
    "hang",
    """SIGSTOP rank 0 at the fault step: alive and silent, as if stuck in a collective.

    1. launch the example; wait until it reports ``shape.fault_step``;
    2. SIGSTOP rank 0 (its peer blocks in the next collective);
    3. Lazarus: the hang timeout finds the stopped rank (named, not its blocked
       peer), stops the generation (SIGCONT included) and relaunches. torchrun:
       nothing notices short of the collective timeout; after
       ``torchrun_hang_bound_s`` the run is reported as not detected and stopped;
    4. wait for the end; weights against the reference.
    """,
)


@runs(HANG, "lazarus")
async def hang_lazarus(ctx: BenchContext, repeat: int) -> Measured:
    return await _rank_fault(ctx, repeat, "hang", rank=0, sig=signal.SIGSTOP)


@runs(HANG, "torchrun")
async def hang_torchrun(ctx: BenchContext, repeat: int) -> Measured:
    async with ctx.torchrun("hang", repeat) as run:
        return await hang_under_agent(
            ctx,
            run,
            ctx.config.torchrun_hang_bound_s,
            f"the collective timeout is {ctx.config.pg_timeout_s:.0f} s",
        )


async def hang_under_agent(ctx: BenchContext, run: TorchrunRun, bound: float, why: str) -> Measured:
    """SIGSTOP rank 0 of a job under a torchrun-style agent at the fault step; if
    nothing notices within ``bound``, say so (``why``: what would notice, and when)."""
    step = await torchrun_reach(ctx, run, ctx.shape.fault_step)
    generation = run.job.generation
    run.job.signal_rank(0, signal.SIGSTOP)
    fault_at = time.time()
    noticed = await wait_until(
        lambda: (
            run.job.agent_detection_after(fault_at) is not None
            or run.job.snapshot().first_of_later_generation(generation, fault_at) is not None
        ),
        bound,
    )
    metrics: dict[str, Metric] = {
        "fault_step": step,
        **torchrun_recovery(run, fault_at, generation),
    }
    if not noticed:
        metrics |= {"completed": False, "weights_ok": False}
        return Measured(
            metrics,
            {"pg_timeout_s": ctx.config.pg_timeout_s},
            note=f"not detected within {bound:.0f} s ({why})",
        )
    metrics |= await _torchrun_finish(ctx, run)
    # The recovery as of the end: a generation restarted after detection counts.
    metrics |= torchrun_recovery(run, fault_at, generation)
    return Measured(metrics)


# --------------------------------------------------------------------------- controller crash


@dataclass(frozen=True)
class Outage:
    killed_at: float
    restarted_at: float


async def kill_controller(stack: LocalStack, down_s: float) -> Outage:
    """SIGKILL the Lazarus worker, leave it dead ``down_s``, start it again (the
    controller-crash scenarios and the soak)."""
    killed_at = time.time()
    stack.kill_worker(signal.SIGKILL)
    await asyncio.sleep(down_s)
    stack.start_worker()
    return Outage(killed_at, time.time())


_CONTROLLER_DOC = """
    1. launch the example; wait until it reports ``shape.fault_step``;
    2. Lazarus: SIGKILL the worker, restart it ``shape.worker_down_s`` later; the
       ranks must not notice (no incident, still generation 1, never more rank
       processes than the world size) and the restarted worker must pick the job
       up. torchrun: SIGKILL the agent; its ranks live in their own sessions;
    3. wait for the end (torchrun: for the orphaned ranks to exit); weights
       against the reference.
"""

CONTROLLER = scenario(
    "controller_crash",
    "SIGKILL the controller (Lazarus worker, restarted after a pause; torchrun agent) "
    "at the fault step.\n" + _CONTROLLER_DOC,
)
WORKER_KILL = scenario(
    "worker_kill",
    "SIGKILL the controller worker at the fault step, restart it after a pause; ranks "
    "must not notice (controller_crash under Lazarus alone, the recovery benchmark's name).\n"
    + _CONTROLLER_DOC,
)


@runs(WORKER_KILL, "lazarus")
@runs(CONTROLLER, "lazarus")
async def controller_crash_lazarus(ctx: BenchContext, repeat: int) -> Measured:
    async with ctx.lazarus("controller", repeat) as run:
        step = await run.job.reach_step(ctx.shape.fault_step)
        outage = await kill_controller(ctx.stack, ctx.shape.worker_down_s)
        status, metrics, details = await finish(run)
        trace = run.trace()
    details |= {"worker_killed_at": outage.killed_at, "worker_restarted_at": outage.restarted_at}
    metrics |= {
        "fault_step": step,
        "worker_down_s": outage.restarted_at - outage.killed_at,
        "steps_while_worker_down": _steps_between(trace, outage.killed_at, outage.restarted_at),
        "training_survived": bool(metrics["completed"]) and bool(metrics["weights_ok"]),
        "steps_lost": sum(i.steps_lost or 0 for i in status.incidents),
        "supervised_after": status.phase == Phase.SUCCEEDED,
    }
    return Measured(metrics, details)


@runs(CONTROLLER, "torchrun")
async def controller_crash_torchrun(ctx: BenchContext, repeat: int) -> Measured:
    async with ctx.torchrun("controller", repeat) as run:
        step = await torchrun_reach(ctx, run, ctx.shape.fault_step)
        await asyncio.to_thread(run.job.kill_agent)
        # The ranks live in their own sessions: they carry on, unsupervised.
        survivors = len(run.job.live_ranks())
        await wait_until(lambda: not run.job.live_ranks(), ctx.shape.job_timeout_s)
        ended = time.time()
        completed = run.weights.is_file()
        weights_ok = completed and await ctx.weights_ok(run.weights)
    metrics: dict[str, Metric] = {
        "fault_step": step,
        **torchrun_end(run, ended, completed, weights_ok, run.job.nproc),
        "ranks_alive_after_kill": survivors,
        "training_survived": weights_ok,
        "steps_lost": 0 if run.job.generation <= 1 else None,
        "supervised_after": False,
    }
    return Measured(
        metrics, note="the ranks finish orphaned: nothing watches them after the agent died"
    )


def _steps_between(trace: StepTrace, start: float, end: float) -> int | None:
    before, during = trace.max_step(before=start), trace.max_step(before=end)
    return during - before if before is not None and during is not None else None


# --------------------------------------------------------------------------- pause

_PAUSE_DOC = """
    1. launch the example; wait until it reports ``shape.fault_step``;
    2. signal ``pause``: the ranks save a just-in-time checkpoint and stop; wait
       for PAUSED and for no rank process alive;
    3. hold ``{hold}``, then signal ``resume``: a new generation resumes from the
       JIT checkpoint;
    4. wait for the end; weights against the reference.
"""

PAUSE = scenario(
    "pause",
    "Pause at the fault step (a just-in-time checkpoint, then stop), resume at once; "
    "reports the save latency and the steps the pause cost.\n" + _PAUSE_DOC.format(hold="nothing"),
)
PAUSE_RESUME = scenario(
    "pause_resume",
    "Planned maintenance: pause at the fault step, hold, resume.\n"
    + _PAUSE_DOC.format(hold="``shape.pause_hold_s``"),
    not_possible={"torchrun": NO_PAUSE},
)


async def _pause_lazarus(ctx: BenchContext, repeat: int, label: str, hold_s: float) -> Measured:
    async with ctx.lazarus(label, repeat) as run:
        job = run.job
        step = await job.reach_step(ctx.shape.fault_step)
        generation, _ = chaos.current_step(job.run_root)
        asked_at = time.time()
        await job.control.pause()
        paused = await job.wait_phase(Phase.PAUSED)
        paused_at = time.time()
        stopped = await wait_until(
            lambda: not chaos.live_rank_processes(job.run_root), ctx.shape.job_timeout_s
        )
        stopped_at = time.time()
        await asyncio.sleep(hold_s)
        resumed_at = time.time()
        await job.control.resume()
        _, metrics, details = await finish(run)
        trace = run.trace()
        lost = recovery_metrics(
            trace, resumed_at, generation, run.logged_max_step(generation), None
        )
    stop = paused.planned_stops[-1] if paused.planned_stops else None
    committed_at = None
    if stop is not None and stop.checkpoint_step is not None:
        marker = read_json(job.paths.checkpoints / f"step-{stop.checkpoint_step:08d}" / "COMMITTED")
        committed_at = float(marker["committed_at"]) if marker else None
    first = trace.first_of_later_generation(generation, resumed_at)
    metrics |= {
        "fault_step": step,
        "pause_to_paused_s": paused_at - asked_at,
        "pause_to_ranks_stopped_s": (stopped_at - asked_at) if stopped else None,
        "resume_to_first_step_s": (first.t - resumed_at) if first is not None else None,
        "steps_lost": lost["steps_lost"],
        "resumed_from_step": lost["resumed_from_step"],
        "jit_checkpoint_ok": stop is not None and stop.checkpoint_step is not None,
        "jit_checkpoint_s": stop.checkpoint_s if stop else None,
        "signal_to_checkpoint_s": since(asked_at, committed_at),
    }
    return Measured(metrics, details)


@runs(PAUSE, "lazarus")
async def pause_lazarus(ctx: BenchContext, repeat: int) -> Measured:
    return await _pause_lazarus(ctx, repeat, "pause", 0.0)


@runs(PAUSE_RESUME, "lazarus")
async def pause_resume_lazarus(ctx: BenchContext, repeat: int) -> Measured:
    return await _pause_lazarus(ctx, repeat, "pause", ctx.shape.pause_hold_s)


# --------------------------------------------------------------------------- straggler

SLOW_NODE, SPARE_NODE = "n2", "n3"

STRAGGLER = scenario(
    "straggler",
    """One rank 2x slower for a stretch of steps (Lazarus: node n2 of n1, n2 plus spare n3).

    1. launch ``shape.straggler_steps`` steps, one rank per node (Lazarus: local
       nodes n1 and n2, spare n3; torchrun: 2 ranks); the example slows node n2's
       rank (torchrun: rank 1) by ``straggler_factor`` for steps
       ``straggler_from_step`` to ``straggler_until_step``;
    2. Lazarus: straggler detection (the spec's defaults) records it, and the
       cost model decides whether moving to the spare pays; torchrun: nothing
       detects it;
    3. wait for the end; rates before and during the stretch; weights against a
       2-rank reference.
    """,
    references=lambda shape: [(2, shape.straggler_steps)],
)


def _slow_args(shape: JobShape, *target: str) -> list[str]:
    return [
        *target,
        *flags(
            slow_factor=shape.straggler_factor,
            slow_from_step=shape.straggler_from_step,
            slow_until_step=shape.straggler_until_step,
        ),
    ]


def _stretch(trace: StepTrace, shape: JobShape) -> dict[str, Metric]:
    """Steps per second before and during the slow stretch (by the high-water mark)."""
    start, end = shape.straggler_from_step, shape.straggler_until_step
    return {
        "before_steps_per_s": trace.rate(max(1, start // 5), start),
        "stretch_s": since(trace.time_reaching(start), trace.time_reaching(end)),
        "stretch_steps_per_s": trace.rate(start, end),
    }


@runs(STRAGGLER, "lazarus")
async def straggler_lazarus(ctx: BenchContext, repeat: int) -> Measured:
    shape = ctx.shape
    steps = shape.straggler_steps
    spec_extra: dict[str, object] = {
        "nodes": [{"name": "n1"}, {"name": SLOW_NODE}],
        "spares": [{"name": SPARE_NODE}],
        "total_steps": steps,
    }
    async with ctx.lazarus(
        "straggler",
        repeat,
        steps=steps,
        extra_args=_slow_args(shape, "--slow-node", SLOW_NODE),
        spec_extra=spec_extra,
        nproc_per_node=1,
    ) as run:
        await run.job.reach_step(shape.straggler_from_step)
        slow_from = time.time()  # the next step of the slow node is the first slow one
        status, metrics, details = await finish(run)
        trace = run.trace()
        spec = run.job.spec
    found = status.stragglers[0] if status.stragglers else None
    incident = next((i for i in status.incidents if i.kind == "straggler"), None)
    metrics |= {
        **_stretch(trace, shape),
        "straggler_detected": found is not None,
        "found_ok": found is not None and found.node == SLOW_NODE,
        "slowdown_injected": shape.straggler_factor,
        "slowdown_measured": found.slowdown if found else None,
        "window_s": spec.straggler.window_s,
        "slowdown_factor": spec.straggler.slowdown_factor,
        "detection_from_injection_s": (found.detected_at - slow_from) if found else None,
        "detection_by_samples_s": found.detection_s if found else None,
        "swapped": any(SPARE_NODE in n for n in status.nodes.active),
        "recovery_s": incident.recovery_s if incident else None,
        "steps_lost": sum(i.steps_lost or 0 for i in status.incidents),
    }
    details["stragglers"] = [r.model_dump(mode="json") for r in status.stragglers]
    return Measured(metrics, details)


@runs(STRAGGLER, "torchrun")
async def straggler_torchrun(ctx: BenchContext, repeat: int) -> Measured:
    shape = ctx.shape
    steps = shape.straggler_steps
    async with ctx.torchrun(
        "straggler", repeat, steps=steps, extra_args=_slow_args(shape, "--slow-rank", "1")
    ) as run:
        metrics = await _torchrun_finish(ctx, run, steps)
        metrics |= {
            **_stretch(run.job.snapshot(), shape),
            "straggler_detected": False,
            "swapped": False,
        }
    return Measured(metrics, note="torchrun has no straggler detection")
