"""Running scenarios: one LocalStack for the whole benchmark, one fresh job per run.

The stack (embedded dev server, headless, plus a real worker process) lives in a
temporary directory that is removed at the end, whatever happened: every job is
terminated, every rank of every generation is stopped, the worker and the server
are shut down, even on Ctrl-C. Scenarios are plain async functions registered by
name (see :mod:`bench.scenarios`); the harness runs each one ``repeats`` times,
interleaved, and keeps every run's raw numbers.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from bench.jobs import WORLD_SIZE, JobPaths, JobShape, build_spec, run_reference, weights_match
from bench.measure import RunMonitor, count_history_events
from lazarus import chaos
from lazarus.activities.stop import stop_generations
from lazarus.domain.api import QUERY_STATUS, WORKFLOW_TYPE, workflow_id_for
from lazarus.domain.contracts import StopRequest
from lazarus.domain.spec import JobSpec
from lazarus.lifecycle import StartStop
from lazarus.local_stack import LocalStack
from lazarus.workflows.state import JobInput, JobStatus, Phase

Metric = float | int | bool | None
WORKDIR_PREFIX = "lazarus-bench-"
STEP_POLL_S = 0.05
"""How often :meth:`BenchJob.reach_step` reads the heartbeats (as ``chaos.wait_for_step``)."""
PROGRESS_POLL_S = 1.0
"""How often :meth:`BenchJob.result` checks that a job still makes progress."""

SpecBuilder = Callable[[str, JobPaths], JobSpec]
"""Builds a job's spec from its name and paths (the default: :func:`bench.jobs.build_spec`)."""
Reference = tuple[int, int]
"""(world size, steps) of a fault-free reference run."""


def default_references(shape: JobShape) -> list[Reference]:
    return [(WORLD_SIZE, shape.steps)]


@dataclass
class Outcome:
    """What one run of a scenario measured: ``metrics`` are summarised over repeats,
    ``details`` (incidents, the injected fault, ...) are kept raw in the JSON."""

    metrics: dict[str, Metric] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    run: Callable[[BenchContext, int], Awaitable[Outcome]]
    unavailable: Callable[[], str | None] | None = None
    """Why the scenario cannot run on this machine (e.g. no root for network
    namespaces), or None when it can: an unavailable scenario is skipped, with the
    reason in the results, instead of failing."""
    references: Callable[[JobShape], list[Reference]] = default_references
    """The fault-free reference runs its jobs are compared with, computed before
    any scenario runs so that no timing includes them."""


@dataclass
class RunRecord:
    scenario: str
    repeat: int
    started_at: float
    wall_s: float
    metrics: dict[str, Metric]
    details: dict[str, Any]
    error: str | None = None
    skipped: str | None = None
    """Why the scenario did not run (its prerequisites are missing here)."""


class BenchJob:
    """A started example job, its run directory monitor, and the common measurements."""

    def __init__(
        self,
        ctx: BenchContext,
        spec: JobSpec,
        paths: JobPaths,
        handle: WorkflowHandle[Any, JobStatus],
        monitor: RunMonitor,
        steps: int,
    ) -> None:
        self.ctx = ctx
        self.spec = spec
        self.paths = paths
        self.handle = handle
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
            status: JobStatus = await self.handle.query(QUERY_STATUS, result_type=JobStatus)
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
        waiting = asyncio.ensure_future(self.handle.result())
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

    async def common_outcome(self, status: JobStatus) -> Outcome:
        """What every Lazarus scenario reports about a finished job."""
        assert self.handle.first_execution_run_id is not None
        history = await count_history_events(
            self.ctx.client, self.handle.id, self.handle.first_execution_run_id
        )
        completed = status.phase == Phase.SUCCEEDED
        reference = await self.ctx.reference_weights(self.spec.world_size, self.steps)
        weights_ok = completed and await asyncio.to_thread(
            weights_match, self.paths.weights, reference
        )
        generations = max(status.generation, 1)
        return Outcome(
            metrics={
                "completed": completed,
                "weights_ok": weights_ok,
                "generations": status.generation,
                "incidents": len(status.incidents),
                "max_live_ranks": self.monitor.max_live_ranks,
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
                await self.handle.terminate("benchmark cleanup")
        await self.ctx.stop_ranks(self.run_root, self.spec.job_id)


class BenchContext:
    """Shared by every run of a benchmark: the stack, a client, the job shape."""

    def __init__(self, stack: LocalStack, client: Client, shape: JobShape, workdir: Path) -> None:
        self.stack = stack
        self.client = client
        self.shape = shape
        self.workdir = workdir
        self._references: dict[Reference, Path] = {}
        self._reference_lock = asyncio.Lock()
        self.run_roots: dict[str, Path] = {}
        """Every job started, by job id, so that cleanup can find its ranks."""
        self.resources: list[StartStop] = []
        """Other things a scenario started (test hosts): cleanup stops each one."""

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

    @asynccontextmanager
    async def job(
        self,
        scenario: str,
        repeat: int,
        build: SpecBuilder | None = None,
        steps: int | None = None,
        input_overrides: dict[str, Any] | None = None,
    ) -> AsyncIterator[BenchJob]:
        """Start the example job under Lazarus, monitored; always cleaned up on exit.

        ``build`` makes a different spec (multi-node jobs); ``steps`` says how many
        steps it trains, when not ``shape.steps``, so its weights meet the right
        reference; ``input_overrides`` sets other :class:`JobInput` fields (e.g. a low
        ``continue_as_new_after_events``)."""
        name = f"bench-{scenario.replace('_', '-')}-{repeat}-{uuid.uuid4().hex[:6]}"
        paths = JobPaths(self.workdir / "jobs" / name)
        spec = build(name, paths) if build is not None else build_spec(name, paths, self.shape)
        run_root = Path(spec.run_dir) / spec.job_id
        self.run_roots[spec.job_id] = run_root
        handle = await self.client.start_workflow(
            WORKFLOW_TYPE,
            JobInput(spec=spec, **(input_overrides or {})),
            id=workflow_id_for(spec.name),
            task_queue=self.stack.task_queue,
            result_type=JobStatus,
        )
        job = BenchJob(self, spec, paths, handle, RunMonitor(run_root), steps or self.shape.steps)
        job.monitor.__enter__()
        try:
            yield job
        finally:
            await job.abandon()

    async def stop_ranks(self, run_root: Path, job_id: str) -> None:
        await stop_generations(
            StopRequest(job_id=job_id, run_root=str(run_root), grace_s=0, reason="benchmark")
        )

    async def stop_all_ranks(self) -> None:
        for job_id, run_root in self.run_roots.items():
            await self.stop_ranks(run_root, job_id)

    def release_resources(self) -> None:
        """Stop everything registered in :attr:`resources`, newest first (idempotent)."""
        while self.resources:
            resource = self.resources.pop()
            try:
                resource.stop()
            except Exception:
                traceback.print_exc()


@dataclass
class BenchRun:
    """Everything a benchmark produced, before summarising."""

    shape: JobShape
    scenarios: list[str]
    repeats: int
    started_at: float
    records: list[RunRecord] = field(default_factory=list)
    server_address: str = ""
    load_average_at_start: list[float] = field(default_factory=lambda: list(os.getloadavg()))
    """Other work on the machine skews every timing; this says how busy it was."""


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_benchmark(
    scenarios: list[Scenario],
    shape: JobShape,
    repeats: int,
    keep_workdir: bool = False,
    progress: Callable[[str], None] = print,
) -> BenchRun:
    """Run every scenario ``repeats`` times on one fresh LocalStack, then tear it all down."""
    workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
    stack = LocalStack(workdir / "stack", task_queue=f"bench-{uuid.uuid4().hex[:8]}", headless=True)
    bench = BenchRun(
        shape=shape,
        scenarios=[s.name for s in scenarios],
        repeats=repeats,
        started_at=time.time(),
    )
    previous_term = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    contexts: list[BenchContext] = []
    try:
        progress(f"bench: state in {workdir}; starting the dev server and a worker")
        stack.start()
        bench.server_address = stack.server.address
        asyncio.run(_run_all(stack, shape, workdir, scenarios, repeats, bench, contexts, progress))
    finally:
        try:
            # The worker first, so nothing relaunches the ranks stopped next.
            stack.kill_worker(signal.SIGKILL)
            for ctx in contexts:
                try:
                    asyncio.run(ctx.stop_all_ranks())
                finally:
                    ctx.release_resources()
        finally:
            stack.stop()
            signal.signal(signal.SIGTERM, previous_term)
            if keep_workdir:
                progress(f"bench: kept {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    return bench


async def _run_all(
    stack: LocalStack,
    shape: JobShape,
    workdir: Path,
    scenarios: list[Scenario],
    repeats: int,
    bench: BenchRun,
    contexts: list[BenchContext],
    progress: Callable[[str], None],
) -> None:
    ctx = BenchContext(stack, await stack.client(), shape, workdir)
    contexts.append(ctx)
    skipped: dict[str, str] = {}
    for scenario in scenarios:
        reason = scenario.unavailable() if scenario.unavailable is not None else None
        if reason is not None:
            skipped[scenario.name] = reason
            progress(f"bench: skipping {scenario.name}: {reason}")
    references = sorted(
        {ref for s in scenarios if s.name not in skipped for ref in s.references(shape)}
    )
    for world_size, steps in references:
        progress(f"bench: fault-free reference run (no Lazarus), {world_size} ranks, {steps} steps")
        await ctx.reference_weights(world_size, steps)
    # Interleaved, so slow drift of the machine touches every scenario alike.
    for repeat in range(repeats):
        for scenario in scenarios:
            if scenario.name in skipped:
                bench.records.append(
                    RunRecord(
                        scenario=scenario.name,
                        repeat=repeat,
                        started_at=time.time(),
                        wall_s=0.0,
                        metrics={},
                        details={},
                        skipped=skipped[scenario.name],
                    )
                )
                continue
            if not stack.worker_running:  # a scenario that failed half-way may leave it down
                stack.start_worker()
            started = time.time()
            progress(f"bench: {scenario.name} #{repeat + 1}/{repeats} ...")
            try:
                outcome = await scenario.run(ctx, repeat)
                error = None
            except Exception as exc:
                outcome = Outcome()
                error = f"{type(exc).__name__}: {exc}"
                progress(traceback.format_exc())
            finally:
                ctx.release_resources()
            wall = time.time() - started
            bench.records.append(
                RunRecord(
                    scenario=scenario.name,
                    repeat=repeat,
                    started_at=started,
                    wall_s=wall,
                    metrics=outcome.metrics,
                    details=outcome.details,
                    error=error,
                )
            )
            shown = ", ".join(f"{k}={_short(v)}" for k, v in outcome.metrics.items())
            progress(f"bench: {scenario.name} #{repeat + 1} {wall:.1f} s: {error or shown}")


def _short(value: Metric) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)
