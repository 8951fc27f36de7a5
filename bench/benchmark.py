"""Running a benchmark: every scenario under every chosen system, on one LocalStack.

:func:`run_benchmark` runs the scenarios ``repeats`` times, interleaved (so slow
drift of the machine touches all of them alike), then the extras (overhead, soak),
and keeps every run's raw numbers as :class:`~bench.harness.RunRecord`. It sits
above both the harness (what a run gets) and the scenario registry (what there is
to run), which is why it is not in either: the registry's runners take the
harness's context, so the harness cannot know scenarios without a circle.
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from activities.nodes.ssh.files import SSH_DIRS_ENV, allowed_ssh_dirs
from bench.harness import BenchConfig, BenchContext, BenchRun, Extra, Metric, Plan, RunRecord
from bench.jobs import JobShape
from bench.registry import Scenario
from bench.systems import System
from lazarus.app.local_stack import LocalStack


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_benchmark(
    scenarios: list[Scenario],
    config: BenchConfig | JobShape,
    repeats: int,
    keep_workdir: bool = False,
    progress: Callable[[str], None] = print,
    *,
    systems: list[System] | None = None,
    extras: dict[str, Extra] | None = None,
    label: str = "bench",
) -> BenchRun:
    """Run every scenario under every system (default: Lazarus alone) ``repeats``
    times, interleaved, then the extras, on one fresh LocalStack; everything
    started is stopped at the end. A bare :class:`JobShape` means the recovery
    benchmark's config (:meth:`BenchConfig.recovery`). ``label`` prefixes the
    progress lines and names the temporary directory (``/tmp/lazarus-<label>-*``)."""
    if isinstance(config, JobShape):
        config = BenchConfig.recovery(config)
    plan = Plan(
        scenarios=[s.name for s in scenarios], systems=systems or ["lazarus"], repeats=repeats
    )
    workdir = Path(tempfile.mkdtemp(prefix=f"lazarus-{label}-"))
    # The test hosts' SSH files live under workdir (bench.multinode): the worker
    # started below allows that directory too (activities.nodes.ssh.files).
    os.environ[SSH_DIRS_ENV] = os.pathsep.join([*allowed_ssh_dirs(), str(workdir)])
    stack = LocalStack(
        workdir / "stack", task_queue=f"{label}-{uuid.uuid4().hex[:8]}", headless=True
    )
    run = BenchRun(
        config=config,
        plan=plan,
        started_at=time.time(),
        summaries={s.name: s.summary for s in scenarios},
    )
    contexts: list[BenchContext] = []
    with _sigterm_as_interrupt():
        try:
            progress(f"{label}: state in {workdir}; starting the dev server and a worker")
            stack.start()
            loop = _Loop(stack, config, workdir, scenarios, run, progress, label)
            asyncio.run(loop.run_all(extras or {}, contexts))
        finally:
            try:
                # The worker first, so nothing relaunches the ranks stopped next.
                stack.kill_worker(signal.SIGKILL)
                for ctx in contexts:
                    ctx.stop_all_watched()
                    try:
                        asyncio.run(ctx.stop_all_ranks())
                    finally:
                        ctx.release_resources()
            finally:
                stack.stop()
                if keep_workdir:
                    progress(f"{label}: kept {workdir}")
                else:
                    shutil.rmtree(workdir, ignore_errors=True)
    return run


@dataclass
class _Loop:
    stack: LocalStack
    config: BenchConfig
    workdir: Path
    scenarios: list[Scenario]
    run: BenchRun
    progress: Callable[[str], None]
    label: str

    async def run_all(self, extras: dict[str, Extra], contexts: list[BenchContext]) -> None:
        ctx = BenchContext(self.stack, await self.stack.client(), self.config, self.workdir)
        contexts.append(ctx)
        skipped: dict[str, str] = {}
        for sc in self.scenarios:
            reason = sc.unavailable() if sc.unavailable is not None else None
            if reason is not None:
                skipped[sc.name] = reason
                self.progress(f"{self.label}: skipping {sc.name}: {reason}")
        to_run = [s for s in self.scenarios if s.name not in skipped]
        references = sorted({ref for s in to_run for ref in s.references(ctx.shape)})
        for world_size, steps in references:
            self.progress(
                f"{self.label}: fault-free reference run (no controller), "
                f"{world_size} ranks, {steps} steps"
            )
            await ctx.reference_weights(world_size, steps)
        for repeat in range(self.run.plan.repeats):
            for sc in self.scenarios:
                for system in self.run.plan.systems:
                    record = await self._run_one(ctx, sc, system, repeat, skipped.get(sc.name))
                    if record is not None:
                        self.run.records.append(record)
        for name, extra in extras.items():
            self.progress(f"{self.label}: {name} ...")
            started = time.time()
            try:
                self.run.extras[name] = await extra(ctx, self.progress)
            except Exception as exc:
                self.progress(traceback.format_exc())
                self.run.extras[name] = {"error": f"{type(exc).__name__}: {exc}"}
            finally:
                ctx.stop_all_watched()
                if not self.stack.worker_running:
                    self.stack.start_worker()
            self.progress(f"{self.label}: {name} took {time.time() - started:.0f} s")

    async def _run_one(
        self, ctx: BenchContext, sc: Scenario, system: System, repeat: int, skipped: str | None
    ) -> RunRecord | None:
        started = time.time()
        record = RunRecord(sc.name, repeat, started, 0.0, {}, {}, system=system)
        if system in sc.not_possible:
            record.not_possible = sc.not_possible[system]
            return record
        runner = sc.runner(system)
        if runner is None:
            return None  # e.g. torchrun_default only where it says something
        if skipped is not None:
            record.skipped = skipped
            return record
        if not self.stack.worker_running:  # a run that failed half-way may leave it down
            self.stack.start_worker()
        where = sc.name if system == "lazarus" else f"{sc.name} / {system}"
        self.progress(f"{self.label}: {where} #{repeat + 1}/{self.run.plan.repeats} ...")
        try:
            measured = await runner(ctx.under(system), repeat)
            record.metrics, record.details = measured.metrics, measured.details
            record.note = measured.note
        except Exception as exc:
            record.error = f"{type(exc).__name__}: {exc}"
            self.progress(traceback.format_exc())
        finally:
            ctx.stop_all_watched()
            ctx.release_resources()
        record.wall_clock_s = time.time() - started
        shown = ", ".join(f"{k}={_short(v)}" for k, v in record.metrics.items())
        note = f" ({record.note})" if record.note else ""
        self.progress(
            f"{self.label}: {where} #{repeat + 1} {record.wall_clock_s:.1f} s: "
            f"{record.error or shown}{note}"
        )
        return record


def _short(value: Metric) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)
