"""The one benchmark harness: one LocalStack per invocation, one fresh job per run.

:class:`BenchContext` is what a scenario's runner gets (:meth:`~BenchContext.lazarus`,
:meth:`~BenchContext.torchrun`, :meth:`~BenchContext.job`); :mod:`bench.benchmark`
runs them. What it does: docs/results/2026-12-bench-notebook-2.md, "What it does".
"""

from __future__ import annotations

import asyncio
import copy
import os
import sys
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel
from temporalio.client import Client
from temporalio.service import RPCError

from activities.nodes.rundir import GenerationDir
from activities.stop import stop_generations
from bench.jobs import EXAMPLE, WORLD_SIZE, JobControl, JobPaths, JobShape, build_spec, flags
from bench.measure import RunMonitor, StepTrace, count_history_events, max_logged_step
from bench.metrics import Value
from bench.systems import DEFAULT_PRELOAD, LAZARUS_SETUPS, LazarusSetup, Measured, Reference, System
from bench.torchrun import ProcessWatch, Rendezvous, TorchrunJob, TorchrunSetup
from infra import chaos
from infra.reference_run import run_reference, weights_match
from lazarus.app.lifecycle import StartStop
from lazarus.app.local_stack import LocalStack
from lazarus.domain.contracts import StopRequest
from lazarus.domain.spec import JobSpec
from workflows.state import JobStatus, Phase

__all__ = [
    "BenchConfig",
    "BenchContext",
    "BenchJob",
    "BenchRun",
    "RunRecord",
]

Metric = Value
STEP_POLL_S = 0.05
"""How often :meth:`BenchJob.reach_step` reads the heartbeats (as ``chaos.wait_for_step``)."""
PROGRESS_POLL_S = 1.0
"""How often :meth:`BenchJob.result` checks that a job still makes progress."""
RANK_ENV = {"OMP_NUM_THREADS": "1"}
"""torchrun sets OMP_NUM_THREADS=1 for its ranks unless it is set; Lazarus passes the
environment through. Under the comparable command line both get it explicitly."""

Watched = TypeVar("Watched", bound=ProcessWatch)
SpecBuilder = Callable[[str, JobPaths], JobSpec]
"""Builds a job's spec from its name and paths (the default: :func:`bench.jobs.build_spec`)."""


@dataclass(frozen=True)
class BenchConfig:
    """Everything that shapes a benchmark run beyond the job; recorded in the JSON."""

    shape: JobShape = field(default_factory=JobShape)
    command: Literal["plain", "comparable"] = "comparable"
    """``comparable`` (compare, soak, overhead): the example's command line is the one
    torchrun runs (``--pg-timeout-s``, ``OMP_NUM_THREADS=1``); ``plain`` (recovery):
    :func:`bench.jobs.build_spec`'s, the environment passed through, as a user would."""
    pg_timeout_s: float = 1800.0
    """The example's collective timeout under the comparable command line: gloo's
    default (30 min), so that a hang under torchrun behaves as it would out of the box."""
    torchrun_max_restarts: int = 3
    torchrun_monitor_interval_s: float = 0.5
    torchrun_hang_bound_s: float = 60.0
    """How long torchrun gets to notice a hang (it has no hang detection of its own)."""
    torchrun_default_bound_s: float = 60.0
    """How long torchrun's default setup gets to show a step of a restarted generation."""
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
    slurm_cred_expire_s: int | None = None
    """Slurm's ``AuthInfo=cred_expire`` on the bench's test clusters (None: its default,
    120 s). Plain Slurm holds a requeued job this long before it may start again:
    quick runs shorten it, so a smoke test does not spend two minutes waiting."""
    warm_preload: tuple[str, ...] = DEFAULT_PRELOAD
    """The ``lazarus`` system's ``warm_start.preload`` (``--preload``)."""

    @classmethod
    def quick(cls) -> BenchConfig:
        """A tiny job for smoke tests: seconds per run, numbers meaningless."""
        shape = JobShape.quick()
        return cls(
            shape=shape,
            torchrun_hang_bound_s=shape.hang_timeout_s + 1.0,
            torchrun_default_bound_s=20.0,
            overhead_steps=40,
            overhead_history_job=False,
            soak_minutes=0.25,
            soak_fault_every_s=6.0,
            soak_operator_after_s=30.0,
            soak_step_time_s=0.05,
            slurm_cred_expire_s=30,
        )

    @classmethod
    def recovery(cls, shape: JobShape) -> BenchConfig:
        """The recovery benchmark's: Lazarus alone, the plain command line."""
        return cls(shape=shape, command="plain")

    def with_steps(self, steps: int) -> BenchConfig:
        return replace(self, shape=self.shape.with_steps(steps))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- jobs


class BenchJob:
    """A started Lazarus job, its run directory monitor, and the common measurements."""

    def __init__(
        self,
        ctx: BenchContext,
        spec: JobSpec,
        paths: JobPaths,
        control: JobControl,
        monitor: RunMonitor,
        steps: int,
    ) -> None:
        self.ctx = ctx
        self.spec = spec
        self.paths = paths
        self.control = control
        self.handle = control.handle
        """The raw workflow handle (the chaos matrix signals it directly)."""
        self.monitor = monitor
        self.steps = steps
        self.run_root = Path(spec.run_dir) / spec.job_id
        self.finished = False

    async def reach_step(self, step: int, min_generation: int = 1) -> int:
        """Wait until the job reports ``step``; returns the step seen.

        Polls from the event loop (a read of a few small files every 50 ms), not
        from a thread: on Ctrl-C or SIGTERM the wait is cancelled at once, where a
        thread would hold up the interpreter's exit, and so every cleanup after
        it, until its timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ctx.shape.job_timeout_s
        while True:
            generation, seen = chaos.current_step(self.run_root)
            if generation >= min_generation and seen is not None and seen >= step:
                return seen
            if loop.time() > deadline:
                raise TimeoutError(
                    f"{self.run_root}: step {step} not reached in "
                    f"{self.ctx.shape.job_timeout_s:.0f} s"
                )
            await asyncio.sleep(STEP_POLL_S)

    async def wait_phase(self, phase: Phase) -> JobStatus:
        """Poll the status query until the job is in ``phase``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ctx.shape.job_timeout_s
        while True:
            status = await self.control.status()
            if status.phase == phase:
                return status
            if loop.time() > deadline:
                raise TimeoutError(f"{self.spec.job_id}: never reached {phase}: {status.phase}")
            await asyncio.sleep(STEP_POLL_S)

    async def result(self) -> JobStatus:
        """The job's final status. The deadline is on progress, not on speed: it
        fails only when neither the step nor the generation moved for
        ``job_timeout_s`` (a busy machine makes a job slower, never a failure)."""
        loop = asyncio.get_running_loop()
        waiting = asyncio.ensure_future(self.control.result())
        seen = chaos.current_step(self.run_root)
        moved_at = loop.time()
        try:
            while not waiting.done():
                await asyncio.wait({waiting}, timeout=PROGRESS_POLL_S)
                now_seen = chaos.current_step(self.run_root)
                if now_seen != seen:
                    seen, moved_at = now_seen, loop.time()
                elif loop.time() - moved_at > self.ctx.shape.job_timeout_s:
                    raise TimeoutError(
                        f"{self.spec.job_id}: no progress for "
                        f"{self.ctx.shape.job_timeout_s:.0f} s (generation, step: {seen})"
                    )
            status = waiting.result()
        finally:
            waiting.cancel()
        self.finished = True
        self.monitor.stop()
        return status

    async def common_outcome(self, status: JobStatus) -> Measured:
        """What every Lazarus job reports once finished (the metrics of
        :mod:`bench.metrics`' "any finished job" section, less the wall times)."""
        history = await count_history_events(
            self.ctx.client, self.control.workflow_id, self.control.first_run_id
        )
        completed = status.phase == Phase.SUCCEEDED
        reference = await self.ctx.reference_weights(self.spec.world_size, self.steps)
        weights_ok = completed and await asyncio.to_thread(
            weights_match, self.paths.weights, reference
        )
        generations = max(status.generation, 1)
        return Measured(
            metrics={
                "completed": completed,
                "weights_ok": weights_ok,
                "generations": status.generation,
                "incidents": len(status.incidents),
                "max_live_ranks": self.monitor.max_live_ranks,
                "duplicate_ranks": self.monitor.max_live_ranks > self.spec.world_size,
                "history_events": history.events,
                "workflow_runs": history.runs,
                "history_events_per_generation": history.events / generations,
                "job_elapsed_s": status.elapsed_s,
            },
            details={
                "job_id": self.spec.job_id,
                "phase": status.phase.value,
                "final_step": status.step,
                "world_size": status.world_size,
                "incidents": [i.model_dump(mode="json", by_alias=True) for i in status.incidents],
            },
        )

    async def abandon(self) -> None:
        """Terminate the workflow (if it still runs) and stop every rank it left."""
        self.monitor.stop()
        if not self.finished:
            with suppress(RPCError):  # already finished, or never got going
                await self.control.terminate("benchmark cleanup")
        await self.ctx.stop_ranks(self.run_root, self.spec.job_id)


@dataclass
class LazarusRun:
    """The example under Lazarus, started by :meth:`BenchContext.lazarus`."""

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
        exited = await wait_until(lambda: self.job.agent.poll() is not None, timeout_s)
        return time.time() if exited else None


async def wait_until(
    predicate: Callable[[], bool], timeout_s: float, poll_s: float = STEP_POLL_S
) -> bool:
    """Poll ``predicate`` every ``poll_s``; False if it never held within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(poll_s)
    return predicate()


class BenchContext:
    """Shared by every run of one invocation: the stack, a client, the config,
    the reference weights, and everything started (so that cleanup finds it)."""

    def __init__(
        self, stack: LocalStack, client: Client, config: BenchConfig, workdir: Path
    ) -> None:
        self.stack = stack
        self.client = client
        self.config = config
        self.workdir = workdir
        self._references: dict[Reference, Path] = {}
        self._reference_lock = asyncio.Lock()
        self.run_roots: dict[str, Path] = {}
        """Every Lazarus job started, by job id, so that cleanup can find its ranks."""
        self.watched: list[ProcessWatch] = []
        """Every job watched from outside (torchrun's, the peers'): cleanup kills each."""
        self.resources: list[StartStop] = []
        """Other things a scenario started (test hosts): cleanup stops each one."""
        self.setup: LazarusSetup = LAZARUS_SETUPS["lazarus"]
        """How :meth:`lazarus` sets up the example job: the ``lazarus`` system's (the
        fast setup) unless :meth:`under` says otherwise."""

    def under(self, system: System) -> BenchContext:
        """This context for a run of ``system``: a Lazarus system's setup (another
        system keeps the default, unused). A shallow copy: the stack, the client, the
        references and every record of what was started stay shared, so cleanup
        still finds everything."""
        view = copy.copy(self)
        view.setup = LAZARUS_SETUPS.get(system, self.setup)
        return view

    @property
    def shape(self) -> JobShape:
        return self.config.shape

    async def reference_weights(
        self, world_size: int = WORLD_SIZE, steps: int | None = None
    ) -> Path:
        """The fault-free weights for ``world_size`` ranks and ``steps`` (default
        ``shape.steps``), computed once each."""
        key = (world_size, self.shape.steps if steps is None else steps)
        async with self._reference_lock:
            if key not in self._references:
                self._references[key] = await asyncio.to_thread(
                    run_reference,
                    self.workdir / f"reference-w{key[0]}-s{key[1]}",
                    key[1],
                    key[0],
                )
            return self._references[key]

    async def weights_ok(
        self, weights: Path, steps: int | None = None, world_size: int = WORLD_SIZE
    ) -> bool:
        reference = await self.reference_weights(world_size, steps)
        return await asyncio.to_thread(weights_match, weights, reference)

    def example_args(
        self,
        paths: JobPaths,
        steps: int | None = None,
        extra: list[str] | None = None,
        step_time_s: float | None = None,
    ) -> list[str]:
        """The example's comparable command line, identical for both systems (bar paths)."""
        shape = self.shape
        return [
            str(EXAMPLE),
            *flags(
                steps=steps or shape.steps,
                step_time=shape.step_time_s if step_time_s is None else step_time_s,
                ckpt_every=shape.ckpt_every,
                pg_timeout_s=self.config.pg_timeout_s,
                out=paths.weights,
                checkpoint_dir=paths.checkpoints,
            ),
            *(extra or []),
        ]

    @asynccontextmanager
    async def job(
        self,
        scenario: str,
        repeat: int,
        build: SpecBuilder | None = None,
        steps: int | None = None,
        input_overrides: dict[str, Any] | None = None,
    ) -> AsyncIterator[BenchJob]:
        """Start a job under Lazarus, monitored; always cleaned up on exit.

        ``build`` makes its spec (default: the example, :func:`bench.jobs.build_spec`);
        ``steps`` says how many steps it trains, when not ``shape.steps``, so its
        weights meet the right reference; ``input_overrides`` sets other
        :class:`JobInput` fields (e.g. a low ``continue_as_new_after_events``)."""
        paths = self._paths("bench", scenario, repeat)
        name = paths.root.name
        spec = build(name, paths) if build is not None else build_spec(name, paths, self.shape)
        run_root = Path(spec.run_dir) / spec.job_id
        self.run_roots[spec.job_id] = run_root
        control = await JobControl.start(
            self.client, spec, self.stack.task_queue, **(input_overrides or {})
        )
        job = BenchJob(self, spec, paths, control, RunMonitor(run_root), steps or self.shape.steps)
        job.monitor.__enter__()
        try:
            yield job
        finally:
            await job.abandon()

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
        """Start the example under Lazarus, with the command line of ``config.command``
        plus ``extra_args``, under :attr:`setup` (warm start, memory tier);
        ``spec_extra`` adds or replaces top-level spec fields (a ``checkpoints``
        section is merged with the setup's).

        Only the example job started here gets the setup: jobs built by a scenario's
        own spec builder through :meth:`job` (ssh nodes, the chaos matrix) keep the
        spec they build, unless the builder asks for it (``node_loss`` takes the warm
        start and the memory tier: each ssh test host has its own ``/dev/shm``, lost
        with the host, so the tier there is measured as on real nodes)."""
        comparable = self.config.command == "comparable"
        setup_fields = self.setup.spec_fields(self.shape, self.config.warm_preload)
        extra_args = [*(extra_args or []), *self.setup.example_args]

        def build(name: str, paths: JobPaths) -> JobSpec:
            extra: dict[str, object] = {}
            if comparable:
                command = [
                    sys.executable,
                    *self.example_args(paths, steps, extra_args, step_time_s),
                ]
                extra = {"command": command, "env": dict(RANK_ENV)}
            extra.update(_merged(setup_fields, spec_extra or {}))
            spec = build_spec(
                name, paths, self.shape, nproc_per_node=nproc_per_node, steps=steps, extra=extra
            )
            if comparable or not extra_args:
                return spec
            return spec.model_copy(update={"command": [*spec.command, *extra_args]})

        label = f"cmp-{scenario}" if comparable else scenario
        started = time.time()
        async with self.job(label, repeat, build, steps=steps) as job:
            yield LazarusRun(job, started)

    def _paths(self, system: str, scenario: str, repeat: int) -> JobPaths:
        name = f"{system}-{scenario.replace('_', '-')}-{repeat}-{uuid.uuid4().hex[:6]}"
        paths = JobPaths(self.workdir / "jobs" / name)
        paths.root.mkdir(parents=True, exist_ok=True)
        return paths

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
        rendezvous: Rendezvous | None = None,
        nproc: int = WORLD_SIZE,
    ) -> AsyncIterator[TorchrunRun]:
        """Start the example under torchrun; every process it started is killed on exit.
        With ``rendezvous`` (multi-node) no agent is started here: the scenario starts
        one per host (:meth:`TorchrunJob.start_agent`)."""
        paths = self._paths(f"torchrun-{setup}", scenario, repeat)
        job = TorchrunJob(
            example_args=self.example_args(paths, steps, extra_args, step_time_s),
            log_path=paths.root / "torchrun.log",
            setup=setup,
            max_restarts=(
                self.config.torchrun_max_restarts if max_restarts is None else max_restarts
            ),
            monitor_interval_s=self.config.torchrun_monitor_interval_s,
            extra_env=dict(RANK_ENV),
            rendezvous=rendezvous,
            nproc=nproc,
        )
        async with self.watch(job, start=rendezvous is None):
            yield TorchrunRun(job, paths)

    @asynccontextmanager
    async def watch(self, job: Watched, start: bool = True) -> AsyncIterator[Watched]:
        """Start ``job`` (unless ``start`` is False: the agents of a multi-node job are
        the scenario's to start); every process it started is killed on exit, and by
        the cleanup after a failed run."""
        self.watched.append(job)
        if start:
            job.start()
        try:
            yield job
        finally:
            await asyncio.to_thread(job.stop)

    async def stop_ranks(self, run_root: Path, job_id: str) -> None:
        """Stop every rank the job left, and end its runs: a job the bench abandons
        (the soak's, a failed run's) never gets the workflow's own end-of-run stop,
        so its zygotes and memory-tier snapshots would outlive the bench."""
        await stop_generations(
            StopRequest(
                job_id=job_id,
                run_root=str(run_root),
                grace_s=0,
                reason="benchmark",
                end_of_run=True,
            )
        )

    async def stop_all_ranks(self) -> None:
        for job_id, run_root in self.run_roots.items():
            await self.stop_ranks(run_root, job_id)

    def stop_all_watched(self) -> None:
        for job in self.watched:
            try:
                job.stop()
            except Exception:
                traceback.print_exc()

    def release_resources(self) -> None:
        """Stop everything registered in :attr:`resources`, newest first (idempotent)."""
        while self.resources:
            resource = self.resources.pop()
            try:
                resource.stop()
            except Exception:
                traceback.print_exc()


def _merged(setup: dict[str, object], extra: dict[str, object]) -> dict[str, object]:
    """``extra`` over ``setup``, top-level fields replaced but the ``checkpoints``
    sections merged (a scenario's checkpoint settings keep the setup's tiers)."""
    merged = {**setup, **extra}
    ours, theirs = setup.get("checkpoints"), extra.get("checkpoints")
    if isinstance(ours, dict) and isinstance(theirs, dict):
        merged["checkpoints"] = {**ours, **theirs}
    return merged


# --------------------------------------------------------------------------- the run


@dataclass
class RunRecord:
    """One run of one scenario under one system, as the JSON keeps it."""

    scenario: str
    repeat: int
    started_at: float
    wall_clock_s: float
    """How long the run took, set-up and checks included (not a metric)."""
    metrics: dict[str, Metric]
    details: dict[str, Any]
    error: str | None = None
    skipped: str | None = None
    """Why the scenario did not run (its prerequisites are missing here)."""
    system: System = "lazarus"
    not_possible: str | None = None
    """Why this system cannot do this scenario at all."""
    note: str | None = None
    """What a number means (``not detected within 60 s``)."""

    @property
    def wall_s(self) -> float:
        """The chaos matrix's name for :attr:`wall_clock_s`."""
        return self.wall_clock_s

    @property
    def status(self) -> Literal["ok", "error", "not_possible", "skipped"]:
        if self.not_possible is not None:
            return "not_possible"
        if self.skipped is not None:
            return "skipped"
        return "error" if self.error is not None else "ok"


class Plan(BaseModel):
    scenarios: list[str]
    systems: list[System]
    repeats: int


@dataclass
class BenchRun:
    """Everything a benchmark produced, before summarising."""

    config: BenchConfig
    plan: Plan
    started_at: float
    records: list[RunRecord] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)
    """Overhead and soak results, by name, as JSON-ready dicts."""
    summaries: dict[str, str] = field(default_factory=dict)
    """Each scenario's one-line summary, by name."""
    load_average_at_start: list[float] = field(default_factory=lambda: list(os.getloadavg()))
    """Other work on the machine skews every timing; this says how busy it was."""

    @property
    def shape(self) -> JobShape:
        return self.config.shape


Extra = Callable[[BenchContext, Callable[[str], None]], Awaitable[dict[str, Any]]]
"""A part of a benchmark that is not a per-fault scenario (overhead, soak)."""
