"""What Lazarus costs when nothing goes wrong, next to torchrun: controller CPU per
training hour, Temporal history per generation and per hour, the rank helper's
heartbeat per call and fault-free wall time, for the ``lazarus`` system's fast setup.
What the memory tier's snapshots and replica pushes cost a step is measured at real
sizes by ``python -m bench state-scale``. The method:
docs/results/2026-12-bench-notebook.md, "Overhead".
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench import multinode
from bench.costs import table
from bench.harness import BenchContext, wait_until
from bench.jobs import REPO
from bench.measure import count_history_events, steady_window
from bench.report import Summary, render_cell

DEFAULT_REPORT_INTERVAL_S = 300.0
FAST_REPORT_INTERVAL_S = 2.0
MICRO_CALLS = 1_000_000
MICRO_WRITES = 2_000

_MICRO = r"""
import json, os, sys, time
import lazarus.rank as lz

calls, writes = int(sys.argv[1]), int(sys.argv[2])

def empty(step, **metrics):
    return None

def timed(fn):
    best = None
    for _ in range(3):
        started = time.perf_counter_ns()
        for i in range(calls):
            fn(i, loss=0.5)
        elapsed = (time.perf_counter_ns() - started) / calls
        best = elapsed if best is None else min(best, elapsed)
    return best

lz.heartbeat(0, loss=0.5)  # resolves the variables and writes once
empty_ns = timed(empty)
heartbeat_ns = timed(lz.heartbeat)
started = time.perf_counter_ns()
for i in range(writes):
    lz.flush_heartbeat()
write_ns = (time.perf_counter_ns() - started) / writes
print(json.dumps({"empty_ns": empty_ns, "heartbeat_ns": heartbeat_ns, "write_ns": write_ns}))
"""


class OverheadResult(BaseModel):
    lazarus_cpu_s_per_hour: float | None = None
    torchrun_cpu_s_per_hour: float | None = None
    cpu_window_s: dict[str, float] = {}
    history_events_per_generation: int | None = None
    history_events_per_hour_measured: float | None = None
    """At ``report_interval_s`` = FAST_REPORT_INTERVAL_S, measured."""
    history_events_per_report: float | None = None
    history_events_per_hour_default: float | None = None
    """Per-report cost scaled to the default 300 s interval."""
    heartbeat_ns_per_call: float | None = None
    empty_loop_ns_per_call: float | None = None
    heartbeat_over_empty_ns: float | None = None
    heartbeat_write_us: float | None = None
    heartbeat_us_per_step: float | None = None
    """Amortised at the job's step time: one throttled call plus a write every 0.2 s."""
    step_time_s: float
    completed: dict[str, bool] = {}
    cpu_job_wall_s: dict[str, float] = {}
    """Launch to end of each system's fault-free CPU job (``overhead_steps`` steps)."""
    cpu_job_steps: int | None = None


async def measure(ctx: BenchContext, progress: Callable[[str], None]) -> dict[str, Any]:
    result = OverheadResult(
        step_time_s=ctx.shape.step_time_s, cpu_job_steps=ctx.config.overhead_steps
    )
    progress("compare: overhead: heartbeat microbenchmark")
    micro = await asyncio.to_thread(heartbeat_micro)
    result.heartbeat_ns_per_call = micro["heartbeat_ns"]
    result.empty_loop_ns_per_call = micro["empty_ns"]
    result.heartbeat_over_empty_ns = micro["heartbeat_ns"] - micro["empty_ns"]
    result.heartbeat_write_us = micro["write_ns"] / 1000.0
    writes_per_step = min(1.0, ctx.shape.step_time_s / 0.2)
    result.heartbeat_us_per_step = (
        result.heartbeat_over_empty_ns / 1000.0 + result.heartbeat_write_us * writes_per_step
    )
    progress("compare: overhead: Lazarus worker CPU and history, fault-free job")
    await _lazarus_cpu(ctx, result)
    progress("compare: overhead: torchrun agent CPU, fault-free job")
    await _torchrun_cpu(ctx, result)
    if ctx.config.overhead_history_job:
        progress("compare: overhead: history growth at a 2 s report interval")
        await _history_rate(ctx, result)
    return result.model_dump()


def heartbeat_micro(calls: int = MICRO_CALLS, writes: int = MICRO_WRITES) -> dict[str, float]:
    """Run the microbenchmark in a fresh interpreter, so the helper's module state
    (the heartbeat file is resolved once per process) is exactly a rank's."""
    with tempfile.TemporaryDirectory(prefix="lazarus-hb-") as tmp:
        env = {**os.environ, "LAZARUS_HEARTBEAT_FILE": str(Path(tmp) / "hb.json")}
        env["PYTHONPATH"] = str(REPO)
        out = subprocess.run(
            [sys.executable, "-c", _MICRO, str(calls), str(writes)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
    data: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return data


async def _lazarus_cpu(ctx: BenchContext, result: OverheadResult) -> None:
    """Worker CPU over the steady middle of a fault-free job; in quick mode the same
    job also reports every 2 s and gives the history growth."""
    steps = ctx.config.overhead_steps
    low, high = steady_window(steps)
    fast = not ctx.config.overhead_history_job
    extra = _fast_reports(ctx, fast)
    async with ctx.lazarus("overhead-cpu", 0, steps=steps, spec_extra=extra) as run:
        workflow_id, run_id = run.job.control.workflow_id, run.job.control.first_run_id
        await run.job.reach_step(low)
        first = multinode.cpu_sample(ctx.stack.worker_pid)
        events_first = await count_history_events(ctx.client, workflow_id, run_id)
        await run.job.reach_step(high)
        last = multinode.cpu_sample(ctx.stack.worker_pid)
        events_last = await count_history_events(ctx.client, workflow_id, run_id)
        status = await run.job.result()
        result.cpu_job_wall_s["lazarus"] = time.time() - run.started_at
        common = await run.job.common_outcome(status)
    result.lazarus_cpu_s_per_hour = multinode.cpu_rate(first, last) * 3600.0
    result.cpu_window_s["lazarus"] = last.at - first.at
    result.completed["lazarus_cpu"] = bool(common.metrics["weights_ok"])
    events = common.metrics["history_events"]
    # With fast reports (quick mode) this includes the reports: a smoke figure only.
    result.history_events_per_generation = int(events) if isinstance(events, int) else None
    if fast:
        _history_figures(result, events_last.events - events_first.events, last.at - first.at)


def _fast_reports(ctx: BenchContext, fast: bool) -> dict[str, object]:
    if not fast:
        return {}
    return {"health": ctx.shape.health_section(report_interval_s=FAST_REPORT_INTERVAL_S)}


def _history_figures(result: OverheadResult, events: int, window_s: float) -> None:
    """Events per hour at the fast report interval, and scaled to the default one."""
    if window_s <= 0:
        return
    result.history_events_per_hour_measured = events / window_s * 3600.0
    result.history_events_per_report = events / (window_s / FAST_REPORT_INTERVAL_S)
    result.history_events_per_hour_default = (
        result.history_events_per_report * 3600.0 / DEFAULT_REPORT_INTERVAL_S
    )


async def _torchrun_cpu(ctx: BenchContext, result: OverheadResult) -> None:
    steps = ctx.config.overhead_steps
    low, high = steady_window(steps)
    async with ctx.torchrun("overhead-cpu", 0, steps=steps) as run:
        timeout = ctx.shape.job_timeout_s
        await wait_until(lambda: (run.job.current_step() or 0) >= low, timeout)
        first = multinode.cpu_sample(run.job.agent.pid)
        await wait_until(lambda: (run.job.current_step() or 0) >= high, timeout)
        last = multinode.cpu_sample(run.job.agent.pid)
        ended = await run.wait_exit(timeout)
        result.completed["torchrun_cpu"] = ended is not None and run.job.agent.returncode == 0
        if ended is not None:
            result.cpu_job_wall_s["torchrun"] = ended - run.job.trace.started_at
    result.torchrun_cpu_s_per_hour = multinode.cpu_rate(first, last) * 3600.0
    result.cpu_window_s["torchrun"] = last.at - first.at


async def _history_rate(ctx: BenchContext, result: OverheadResult) -> None:
    """History growth of a healthy generation that reports every 2 s, and the events
    of one fault-free generation (the job's whole history minus its reports)."""
    steps = ctx.config.overhead_steps
    low, high = steady_window(steps)
    async with ctx.lazarus(
        "overhead-history", 0, steps=steps, spec_extra=_fast_reports(ctx, True)
    ) as run:
        workflow_id, run_id = run.job.control.workflow_id, run.job.control.first_run_id
        await run.job.reach_step(low)
        loop = asyncio.get_running_loop()
        first_at = loop.time()
        first = await count_history_events(ctx.client, workflow_id, run_id)
        await run.job.reach_step(high)
        last_at = loop.time()
        last = await count_history_events(ctx.client, workflow_id, run_id)
        status = await run.job.result()
    _history_figures(result, last.events - first.events, last_at - first_at)
    result.completed["lazarus_history"] = status.phase.value == "SUCCEEDED"


def markdown(extra: dict[str, Any], stats: Summary) -> str:
    """The overhead table; the wall-time ratio comes from the ``clean`` scenario."""
    if "error" in extra:
        return f"overhead: failed: {extra['error']}"
    o = OverheadResult.model_validate(extra)
    clean = stats.get("clean", {})
    laz, tr = clean.get("lazarus", {}).get("wall_s"), clean.get("torchrun", {}).get("wall_s")
    wall_ratio = ""
    if laz and tr and laz.stats and tr.stats and laz.stats.median and tr.stats.median:
        wall_ratio = f"{laz.stats.median / tr.stats.median:.3f}"

    def f(value: float | None, digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    rows = [
        (
            "controller CPU s per training hour",
            f(o.lazarus_cpu_s_per_hour),
            f(o.torchrun_cpu_s_per_hour),
        ),
        ("history events per fault-free generation", str(o.history_events_per_generation), "-"),
        (
            f"history events per healthy hour (report every {DEFAULT_REPORT_INTERVAL_S:.0f} s)",
            f(o.history_events_per_hour_default),
            "-",
        ),
        (
            f"history events per healthy hour (report every {FAST_REPORT_INTERVAL_S:.0f} s, "
            "measured)",
            f(o.history_events_per_hour_measured),
            "-",
        ),
        (
            "heartbeat() ns/call (throttled) / empty loop",
            f"{f(o.heartbeat_ns_per_call)} / {f(o.empty_loop_ns_per_call)}",
            "-",
        ),
        ("heartbeat file write, µs", f(o.heartbeat_write_us), "-"),
        (f"helper µs per step at {o.step_time_s} s/step", f(o.heartbeat_us_per_step, 2), "-"),
        (
            "fault-free wall time, s (clean)",
            render_cell(laz),
            render_cell(tr),
        ),
    ]
    laz_long, tr_long = o.cpu_job_wall_s.get("lazarus"), o.cpu_job_wall_s.get("torchrun")
    if laz_long is not None or tr_long is not None:
        rows.append(
            (f"fault-free wall time, s ({o.cpu_job_steps}-step CPU job)", f(laz_long), f(tr_long))
        )
    lines = table(["overhead", "Lazarus", "torchrun"], rows)
    if wall_ratio:
        lines.append(f"| fault-free wall time, Lazarus/torchrun (clean) | {wall_ratio} | |")
    if laz_long and tr_long:
        lines.append(
            f"| fault-free wall time, Lazarus/torchrun ({o.cpu_job_steps}-step CPU job) "
            f"| {laz_long / tr_long:.3f} | |"
        )
    return "\n".join(lines)
