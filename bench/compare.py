"""``python -m bench compare``: the same job, the same fault, under Lazarus and under torchrun.

Each scenario (registered by name in :data:`SCENARIOS`, bodies in
:mod:`bench.compare_scenarios`) has one runner per system: ``lazarus`` (the
embedded dev server and a controller worker, as in ``bench recovery``),
``torchrun`` (its best working setup, see :mod:`bench.torchrun`) and, where it
says something, ``torchrun_default`` (the documented setup, for how often it
recovers at all). A system that cannot do what a scenario asks (torchrun has no
pause) is recorded as ``not_possible`` with the reason, not skipped silently.

Both systems run the identical command line (:meth:`CompareContext.example_args`)
with the same rank environment, and are measured by the same code
(:mod:`bench.trace`): fault to first step of the new generation, steps redone,
wall time against a fault-free run of the same system, and final weights against
a plain fault-free run, bit for bit.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from bench.harness import BenchContext, BenchJob
from bench.jobs import EXAMPLE, WORLD_SIZE, JobPaths, JobShape, build_spec, weights_match
from bench.torchrun import TorchrunJob, TorchrunSetup
from bench.trace import StepTrace, max_logged_step
from lazarus import chaos
from lazarus.activities.rundir import GenerationDir
from lazarus.domain.spec import JobSpec
from lazarus.local_stack import LocalStack

System = Literal["lazarus", "torchrun", "torchrun_default"]
SYSTEMS: tuple[System, ...] = ("lazarus", "torchrun", "torchrun_default")
Metric = float | int | bool | None
WORKDIR_PREFIX = "lazarus-compare-"
POLL_S = 0.05
RANK_ENV = {"OMP_NUM_THREADS": "1"}
"""torchrun sets OMP_NUM_THREADS=1 for its ranks unless it is set; Lazarus passes the
environment through. Both get it explicitly, so the ranks are the same under both."""


@dataclass(frozen=True)
class CompareConfig:
    """Everything that shapes a comparison run; recorded in the JSON."""

    shape: JobShape = field(default_factory=JobShape)
    pg_timeout_s: float = 1800.0
    """The example's collective timeout for both systems: gloo's default (30 min),
    so that a hang under torchrun behaves as it would out of the box."""
    torchrun_max_restarts: int = 3
    torchrun_monitor_interval_s: float = 0.5
    torchrun_hang_bound_s: float = 60.0
    """How long torchrun gets to notice a hang (it has no hang detection of its own)."""
    torchrun_default_bound_s: float = 60.0
    """How long torchrun's default setup gets to show a step of a restarted generation."""
    straggler_steps: int = 240
    straggler_from_step: int = 50
    straggler_until_step: int = 200
    straggler_factor: float = 2.0
    controller_down_s: float = 3.0
    """Lazarus: how long the worker stays dead before it is restarted."""
    pause_hold_s: float = 2.0
    """pause_resume: how long the job stays paused."""
    overhead_steps: int = 450
    """Overhead: steps of the fault-free jobs whose controller CPU is sampled (the
    middle two thirds: 30 s at 0.1 s/step, 3000 clock ticks)."""
    overhead_history_job: bool = True
    """Overhead: time history growth in a job of its own (reporting every 2 s);
    False (quick) makes the CPU job report every 2 s instead."""
    soak_minutes: float = 10.0
    soak_fault_every_s: float = 60.0
    soak_operator_after_s: float = 60.0
    """Soak: with no progress this long the harness acts as the operator (an
    unhandled incident): it restarts the job, as a person paged would."""
    soak_step_time_s: float = 0.1
    soak_max_restarts: int = 100
    """Both systems are given a restart budget that a fault a minute cannot spend."""
    seed: int = 1

    @classmethod
    def quick(cls) -> CompareConfig:
        """A tiny job for smoke tests: seconds per run, numbers meaningless."""
        shape = JobShape.quick()
        return cls(
            shape=shape,
            torchrun_hang_bound_s=shape.hang_timeout_s + 1.0,
            torchrun_default_bound_s=20.0,
            straggler_steps=40,
            straggler_from_step=10,
            straggler_until_step=30,
            controller_down_s=0.5,
            pause_hold_s=0.2,
            overhead_steps=40,
            overhead_history_job=False,
            soak_minutes=0.25,
            soak_fault_every_s=6.0,
            soak_operator_after_s=30.0,
            soak_step_time_s=0.05,
        )

    def with_steps(self, steps: int) -> CompareConfig:
        return replace(self, shape=self.shape.with_steps(steps))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class RunResult(BaseModel):
    """One run of one scenario under one system."""

    scenario: str
    system: System
    repeat: int
    status: Literal["ok", "error", "not_possible", "skipped"]
    note: str | None = None
    """Why not possible or skipped; or what a number means (``not detected within 60 s``)."""
    started_at: float
    wall_clock_s: float
    metrics: dict[str, Metric] = {}
    details: dict[str, Any] = {}
    error: str | None = None


# --------------------------------------------------------------------------- registry

Runner = Callable[["CompareContext", int], Awaitable["Measured"]]


@dataclass
class Measured:
    """What a runner returns: metrics (summarised over repeats) and raw details."""

    metrics: dict[str, Metric] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    note: str | None = None


@dataclass
class CompareScenario:
    name: str
    summary: str
    runners: dict[System, Runner] = field(default_factory=dict)
    not_possible: dict[System, str] = field(default_factory=dict)
    """Systems that cannot do this at all, and why (reported in every table)."""
    unavailable: Callable[[], str | None] | None = None
    """Why the scenario cannot run on this machine (then skipped, with the reason)."""


SCENARIOS: dict[str, CompareScenario] = {}


def scenario(
    name: str,
    summary: str,
    not_possible: dict[System, str] | None = None,
    unavailable: Callable[[], str | None] | None = None,
) -> CompareScenario:
    if name in SCENARIOS:
        raise ValueError(f"compare scenario {name!r} is registered twice")
    SCENARIOS[name] = CompareScenario(
        name, summary, not_possible=dict(not_possible or {}), unavailable=unavailable
    )
    return SCENARIOS[name]


def runs(sc: CompareScenario, system: System) -> Callable[[Runner], Runner]:
    """Register ``fn`` as how ``system`` runs scenario ``sc``."""

    def register(fn: Runner) -> Runner:
        if system in sc.runners:
            raise ValueError(f"{sc.name}/{system} is registered twice")
        sc.runners[system] = fn
        return fn

    return register


# --------------------------------------------------------------------------- jobs


@dataclass
class LazarusRun:
    """A job under Lazarus, started by :meth:`CompareContext.lazarus`."""

    job: BenchJob
    started_at: float

    def trace(self) -> StepTrace:
        """Heartbeats as seen by the run-directory monitor, by the rank's own clock."""
        trace = StepTrace(started_at=self.started_at)
        for p in list(self.job.monitor.progress):
            trace.add(p.written_at, p.generation, p.step)
        return trace

    def logged_max_step(self, generation: int) -> int | None:
        gen = GenerationDir.of(chaos.run_root_of(self.job.run_root), generation)
        return max_logged_step(sorted(gen.path.glob("rank-*.log")))


@dataclass
class TorchrunRun:
    job: TorchrunJob
    paths: JobPaths

    @property
    def weights(self) -> Path:
        return self.paths.weights

    async def wait_exit(self, timeout_s: float) -> float | None:
        """Wait for the agent to exit; the time it did, or None on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.job.agent.poll() is not None:
                return time.time()
            await asyncio.sleep(POLL_S)
        return None


class CompareContext:
    """Shared by every run: the Lazarus stack (through ``bench``), the config,
    and every torchrun job started (so cleanup can find them)."""

    def __init__(self, bench: BenchContext, config: CompareConfig) -> None:
        self.bench = bench
        self.config = config
        self.torchrun_jobs: list[TorchrunJob] = []

    @property
    def shape(self) -> JobShape:
        return self.config.shape

    @property
    def workdir(self) -> Path:
        return self.bench.workdir

    def example_args(
        self,
        paths: JobPaths,
        steps: int | None = None,
        extra: list[str] | None = None,
        step_time_s: float | None = None,
    ) -> list[str]:
        """The example's command line, identical for both systems (bar paths)."""
        shape = self.shape
        return [
            str(EXAMPLE),
            "--steps",
            str(steps or shape.steps),
            "--step-time",
            str(shape.step_time_s if step_time_s is None else step_time_s),
            "--ckpt-every",
            str(shape.ckpt_every),
            "--pg-timeout-s",
            str(self.config.pg_timeout_s),
            "--out",
            str(paths.weights),
            "--checkpoint-dir",
            str(paths.checkpoints),
            *(extra or []),
        ]

    async def reference(self, steps: int | None = None, world_size: int = WORLD_SIZE) -> Path:
        return await self.bench.reference_weights(world_size, steps)

    async def weights_ok(
        self, weights: Path, steps: int | None = None, world_size: int = WORLD_SIZE
    ) -> bool:
        reference = await self.reference(steps, world_size)
        return await asyncio.to_thread(weights_match, weights, reference)

    def _paths(self, system: str, scenario: str, repeat: int) -> tuple[str, JobPaths]:
        name = f"{system}-{scenario.replace('_', '-')}-{repeat}-{uuid.uuid4().hex[:6]}"
        paths = JobPaths(self.workdir / "jobs" / name)
        paths.root.mkdir(parents=True, exist_ok=True)
        return name, paths

    @asynccontextmanager
    async def torchrun(
        self,
        scenario: str,
        repeat: int,
        setup: TorchrunSetup = "best",
        steps: int | None = None,
        extra_args: list[str] | None = None,
        max_restarts: int | None = None,
        step_time_s: float | None = None,
    ) -> AsyncIterator[TorchrunRun]:
        """Start the example under torchrun; every process it started is killed on exit."""
        _, paths = self._paths(f"torchrun-{setup}", scenario, repeat)
        job = TorchrunJob(
            example_args=self.example_args(paths, steps, extra_args, step_time_s),
            log_path=paths.root / "torchrun.log",
            setup=setup,
            max_restarts=(
                self.config.torchrun_max_restarts if max_restarts is None else max_restarts
            ),
            monitor_interval_s=self.config.torchrun_monitor_interval_s,
            extra_env=dict(RANK_ENV),
        )
        self.torchrun_jobs.append(job)
        job.start()
        try:
            yield TorchrunRun(job, paths)
        finally:
            await asyncio.to_thread(job.stop)

    @asynccontextmanager
    async def lazarus(
        self,
        scenario: str,
        repeat: int,
        steps: int | None = None,
        extra_args: list[str] | None = None,
        spec_extra: dict[str, object] | None = None,
        nproc_per_node: int = WORLD_SIZE,
        step_time_s: float | None = None,
    ) -> AsyncIterator[LazarusRun]:
        """Start the example under Lazarus (the same command line as torchrun's)."""

        def build(name: str, paths: JobPaths) -> JobSpec:
            command = [sys.executable, *self.example_args(paths, steps, extra_args, step_time_s)]
            extra: dict[str, object] = {"command": command, "env": dict(RANK_ENV)}
            extra.update(spec_extra or {})
            return build_spec(
                name, paths, self.shape, nproc_per_node=nproc_per_node, steps=steps, extra=extra
            )

        started = time.time()
        async with self.bench.job(f"cmp-{scenario}", repeat, build, steps=steps) as job:
            yield LazarusRun(job, started)

    def stop_all_torchrun(self) -> None:
        for job in self.torchrun_jobs:
            try:
                job.stop()
            except Exception:
                traceback.print_exc()


async def wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``predicate`` every 50 ms; False if it never held within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(POLL_S)
    return predicate()


# --------------------------------------------------------------------------- the run


class ScenarioPlan(BaseModel):
    scenarios: list[str]
    systems: list[System]
    repeats: int


@dataclass
class CompareRun:
    """Everything a comparison produced before it is summarised."""

    config: CompareConfig
    plan: ScenarioPlan
    started_at: float
    results: list[RunResult] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)
    """Overhead and soak results, by name, as JSON-ready dicts."""


Extra = Callable[[CompareContext, Callable[[str], None]], Awaitable[dict[str, Any]]]
"""A part of the comparison that is not a per-fault scenario (overhead, soak)."""


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_compare(
    config: CompareConfig,
    plan: ScenarioPlan,
    extras: dict[str, Extra] | None = None,
    keep_workdir: bool = False,
    progress: Callable[[str], None] = print,
) -> CompareRun:
    """Run every scenario under every system ``repeats`` times (interleaved), then
    the extras, on one fresh local stack; everything started is stopped at the end."""
    import bench.compare_scenarios  # noqa: F401  - registers the scenarios

    workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
    stack = LocalStack(
        workdir / "stack", task_queue=f"compare-{uuid.uuid4().hex[:8]}", headless=True
    )
    run = CompareRun(config=config, plan=plan, started_at=time.time())
    contexts: list[CompareContext] = []
    with _sigterm_as_interrupt():
        try:
            progress(f"compare: state in {workdir}; starting the dev server and a worker")
            stack.start()
            asyncio.run(
                _run_all(stack, config, workdir, plan, extras or {}, run, contexts, progress)
            )
        finally:
            try:
                stack.kill_worker(signal.SIGKILL)
                for ctx in contexts:
                    ctx.stop_all_torchrun()
                    try:
                        asyncio.run(ctx.bench.stop_all_ranks())
                    finally:
                        ctx.bench.release_resources()
            finally:
                stack.stop()
                if keep_workdir:
                    progress(f"compare: kept {workdir}")
                else:
                    shutil.rmtree(workdir, ignore_errors=True)
    return run


async def _run_all(
    stack: LocalStack,
    config: CompareConfig,
    workdir: Path,
    plan: ScenarioPlan,
    extras: dict[str, Extra],
    run: CompareRun,
    contexts: list[CompareContext],
    progress: Callable[[str], None],
) -> None:
    bench = BenchContext(stack, await stack.client(), config.shape, workdir)
    ctx = CompareContext(bench, config)
    contexts.append(ctx)
    chosen = [SCENARIOS[name] for name in plan.scenarios]
    skipped = {
        sc.name: reason
        for sc in chosen
        if sc.unavailable is not None and (reason := sc.unavailable()) is not None
    }
    progress("compare: fault-free reference runs (plain processes, no controller)")
    await ctx.reference()
    if "straggler" in plan.scenarios:
        await ctx.reference(config.straggler_steps)
    for repeat in range(plan.repeats):
        for sc in chosen:
            for system in plan.systems:
                result = await _run_one(ctx, sc, system, repeat, skipped.get(sc.name), progress)
                if result is not None:
                    run.results.append(result)
    for name, extra in extras.items():
        progress(f"compare: {name} ...")
        started = time.time()
        try:
            run.extras[name] = await extra(ctx, progress)
        except Exception as exc:
            progress(traceback.format_exc())
            run.extras[name] = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            ctx.stop_all_torchrun()
            if not stack.worker_running:
                stack.start_worker()
        progress(f"compare: {name} took {time.time() - started:.0f} s")


async def _run_one(
    ctx: CompareContext,
    sc: CompareScenario,
    system: System,
    repeat: int,
    skipped: str | None,
    progress: Callable[[str], None],
) -> RunResult | None:
    started = time.time()
    base = {"scenario": sc.name, "system": system, "repeat": repeat, "started_at": started}
    if system in sc.not_possible:
        return RunResult(
            **base, status="not_possible", note=sc.not_possible[system], wall_clock_s=0.0
        )
    runner = sc.runners.get(system)
    if runner is None:
        return None  # e.g. torchrun_default only where it says something
    if skipped is not None:
        return RunResult(**base, status="skipped", note=skipped, wall_clock_s=0.0)
    stack = ctx.bench.stack
    if not stack.worker_running:  # a run that failed half-way may leave it down
        stack.start_worker()
    progress(f"compare: {sc.name} / {system} #{repeat + 1} ...")
    try:
        measured = await runner(ctx, repeat)
        result = RunResult(
            **base,
            status="ok",
            note=measured.note,
            wall_clock_s=time.time() - started,
            metrics=measured.metrics,
            details=measured.details,
        )
    except Exception as exc:
        progress(traceback.format_exc())
        result = RunResult(
            **base,
            status="error",
            wall_clock_s=time.time() - started,
            error=f"{type(exc).__name__}: {exc}",
        )
    finally:
        ctx.stop_all_torchrun()
        ctx.bench.release_resources()
    shown = ", ".join(f"{k}={_short(v)}" for k, v in result.metrics.items())
    progress(
        f"compare: {sc.name} / {system} #{repeat + 1} {result.wall_clock_s:.1f} s: "
        f"{result.error or shown}{' (' + result.note + ')' if result.note else ''}"
    )
    return result


def _short(value: Metric) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)
