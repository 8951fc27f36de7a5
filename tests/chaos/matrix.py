"""``python -m tests.chaos`` (``make test-chaos``): the fault x phase matrix.

Every guarantee Lazarus makes is checked under one fault injected at one phase of
the job's life, for every (fault, phase) cell where that combination means
something. Phases are reached deterministically: the product holds at a named
point (:mod:`lazarus.domain.chaos_points`) or the job reports a state, never after a
sleep. Each cell runs on the benchmark harness (one LocalStack for the matrix, a
fresh job per cell, the same reference runs) and is judged by
:func:`tests.chaos.invariants.judge`: the right end state, the fault-free weights,
one generation alive at a time, no step lost beyond the checkpoint interval (none
on a planned stop), nothing left behind, and no snapshot of an abandoned timeline resumed.

The fast paths (rejoin in place, the memory tier, warm standbys, a preflight that
swaps or shrinks) have their own phases and rows: ``rejoin``, ``after_rollback``,
``after_disk_fallback``, ``warm_standby``, and the preflight faults at a
recovery's relaunch (see docs/chaos.md). The cross-node ones (rejoin across ssh
nodes, memory replicas) run on SSH test hosts: :mod:`tests.chaos.multinode`, phases
``ssh_rejoin`` and ``replicated``.

The matrix is the explicit list :data:`CELLS`; a (fault, phase) pair not in it is
reported with the reason it is not a cell (:func:`absent_reason`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack, ExitStack, suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.service import RPCError

from activities.nodes.rundir import read_json
from bench import multinode, report
from bench.benchmark import run_benchmark
from bench.costs import results_path
from bench.harness import BenchContext, BenchJob, BenchRun, RunRecord
from bench.jobs import JobControl, JobPaths, JobShape, build_spec
from bench.measure import RunMonitor
from bench.registry import Scenario
from bench.systems import Outcome, Reference
from infra import chaos
from infra.testhosts import TestHosts
from lazarus.app.fleet_client import FleetClient
from lazarus.domain import chaos_points as points
from lazarus.domain.activity_refs import LAUNCH
from lazarus.domain.api import SIGNAL_PAUSE, SIGNAL_RESUME, UPDATE_DRAIN, fleet_workflow_id
from lazarus.domain.chaos_points import CHAOS_DIR_ENV
from lazarus.domain.checkpoint_layout import committed_steps
from lazarus.domain.fleet_state import FleetConfig
from lazarus.domain.memory_tier import MEMORY_ROOT, on_node
from lazarus.domain.spec import JobSpec
from tests.chaos import fleet as chaos_fleet
from tests.chaos import multinode as chaos_multinode
from tests.chaos.cell import REJOIN, Cell, CellRun
from tests.chaos.cell import held_at as _held_at
from tests.chaos.cell import job_status as _status
from tests.chaos.cell import kill_worker as _kill_worker
from tests.chaos.cell import restart_worker as _restart_worker
from tests.chaos.cell import signal_newest as _signal_newest
from tests.chaos.invariants import GenerationCensus, Launch, judge, processes_mentioning
from tests.chaos.points import ChaosPoints
from tests.chaos.s3 import ChaosS3, chaos_s3
from workflows.state import JobStatus, NodeRequest, Phase

FAULTS: dict[str, str] = {
    "rank_sigkill": "rank SIGKILL",
    "rank_sigstop": "rank SIGSTOP",
    "worker_sigkill": "worker SIGKILL",
    "server_sigkill": "dev server SIGKILL + restart",
    "node_ranks_killed": "every rank of a node killed",
    "s3_stopped": "S3 (moto) server stopped",
    "checkpoint_corrupt": "checkpoint corrupted on disk",
    "operator_signal": "duplicated or conflicting operator signal",
    "survivor_sigkill": "a survivor SIGKILLed (a second rank)",
    "preflight_swap": "a node fails the preflight (a spare replaces it)",
    "preflight_shrink": "a node fails the preflight (the job shrinks)",
    "job_cancelled": "the job cancelled",
    "node_quarantined": "a node quarantined (operator drain)",
    "job_terminated": "the job's workflow terminated (its fleet lease orphaned)",
    **chaos_multinode.FAULTS,
}
PHASES: dict[str, str] = {
    "launch_before_pids": "launch: before the pid files",
    "launch_before_launch_json": "launch: pid files written, no launch.json",
    "steady": "steady training",
    "checkpoint_write": "checkpoint write, before COMMITTED",
    "stop": "stop: after SIGTERM, before reaping",
    "recovery_relaunch": "relaunch of a recovery",
    "jit_checkpoint": "just-in-time checkpoint",
    "paused": "while paused",
    "continue_as_new": "continue-as-new",
    "rejoin": "rejoin: survivor told, new rank started, launch unrecorded",
    "after_rollback": "training after a rollback (memory tier on)",
    "after_disk_fallback": "training after a disk fallback (memory tier on)",
    "warm_standby": "warm standbys up",
    "same_name_restart": "a fleet job started again under the same name",
    **chaos_multinode.PHASES,
}
FAST_PHASES = ("rejoin", "after_rollback", "after_disk_fallback", "warm_standby")
FLEET_FAULTS = ("job_terminated",)
FLEET_PHASES = ("same_name_restart",)
FAST_FAULTS = (
    "survivor_sigkill",
    "preflight_swap",
    "preflight_shrink",
    "job_cancelled",
    "node_quarantined",
)

CHAOS_SHAPE = JobShape(
    steps=40,
    step_time_s=0.05,
    ckpt_every=5,
    fault_step=15,
    hang_timeout_s=8.0,  # a loaded machine takes seconds to tear a job down
    worker_down_s=1.0,
    health={"startup_timeout_s": 60.0, "poll_interval_s": 0.2},
    recovery={"backoff_initial_s": 0.2, "backoff_max_s": 2.0, "stop_grace_s": 3.0},
    job_timeout_s=240.0,
)
"""Small and quick, with timeouts that hold on a loaded 2-core machine."""
NAN_AT_STEP = 24
"""The rollback cells' diverged step: generation 1's memory snapshots (22, 23) lie
above the disk checkpoint the rollback retires (20), and generation 2 (from 15)
reaches its first disk save (20) before any step those snapshots hold."""
PREFLIGHT_FLAG = "preflight-fail-{node}"
"""In the job's directory: node ``{node}`` fails every preflight while it exists."""
CONTINUE_AS_NEW_AFTER_EVENTS = 20
"""Low enough that a 40-step job continues as new while it trains (its start-up alone
writes more events than this)."""


# --------------------------------------------------------------------------- helpers


async def _kill_server(run: CellRun) -> None:
    """SIGKILL the dev server's whole process group (no graceful shutdown), then
    start it again on the same sqlite file and port."""
    server = run.ctx.stack.server
    pid = server.pid
    assert pid is not None, "the dev server is not running"
    os.killpg(pid, signal.SIGKILL)
    run.notes.setdefault("faults", []).append({"server_sigkill_at": time.time(), "pid": pid})
    await asyncio.to_thread(server.stop)  # reaps it; nothing left to signal
    await asyncio.to_thread(server.start)


async def _pause(run: CellRun) -> JobStatus:
    await run.job.handle.signal(SIGNAL_PAUSE)
    return await run.job.wait_phase(Phase.PAUSED)


def _corrupt_newest_checkpoint(run: CellRun) -> None:
    """Flip bytes in the newest committed checkpoint's first data file: its manifest
    hash no longer matches, so a verified resume must skip it."""
    found = committed_steps(Path(run.job.spec.checkpoint_dir))
    if not found:
        raise RuntimeError("no committed checkpoint to corrupt")
    step, directory = found[-1]
    data = sorted(
        p
        for p in directory.rglob("*")
        if p.is_file() and p.name not in ("manifest.json", "COMMITTED")
    )
    if not data:
        raise RuntimeError(f"{directory}: no data file to corrupt")
    target = data[0]
    raw = bytearray(target.read_bytes())
    for i in range(0, min(len(raw), 64)):
        raw[i] ^= 0xFF
    target.write_bytes(bytes(raw))
    run.notes["corrupted"] = {"step": step, "file": str(target.relative_to(directory))}


async def _next_run(run: CellRun) -> None:
    """Wait until the workflow has continued as new (its run id changed)."""
    handle = run.ctx.client.get_workflow_handle(run.job.handle.id)
    first = run.job.handle.first_execution_run_id
    loop = asyncio.get_running_loop()
    deadline = loop.time() + run.ctx.shape.job_timeout_s
    while True:
        described: WorkflowExecutionDescription = await handle.describe()
        if described.run_id != first:
            run.notes["continued_as_new_run"] = described.run_id
            return
        if described.status != WorkflowExecutionStatus.RUNNING:
            raise RuntimeError(f"the workflow ended ({described.status}) without continuing as new")
        if loop.time() > deadline:
            raise TimeoutError("the workflow never continued as new")
        await asyncio.sleep(0.05)


def _memory_job_dir(job_id: str) -> Path:
    """The job's directory in this user's private tmpfs root (its runs' snapshots)."""
    return Path(on_node(MEMORY_ROOT, os.getuid())) / job_id


def _idle_standbys(run: CellRun) -> list[int]:
    """Processes forked by the job's zygotes that are neither a zygote nor a rank
    nor a rank's wrapper (a handed-off standby): the idle standbys, from /proc."""
    zygote_dirs = list(run.job.run_root.glob("*/.zygote-*"))
    busy: set[int] = set()
    for zygote in zygote_dirs:
        record = read_json(zygote / "zygote.pid")
        if record is not None:
            busy.add(int(record["pid"]))
    for pid_file in run.job.run_root.glob("*/gen-*/rank-*.pid"):
        record = read_json(pid_file)
        if record is not None:
            busy.update(int(record[k]) for k in ("pid", "wrapper_pid") if k in record)
    idle: set[int] = set()
    for zygote in zygote_dirs:
        for line in processes_mentioning(str(zygote)):
            pid = int(line.split(":", 1)[0])
            if pid not in busy:
                idle.add(pid)
    return sorted(idle)


async def _standbys_up(run: CellRun) -> None:
    """Wait until some zygote has an idle standby (an observed state, not a delay)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + run.ctx.shape.job_timeout_s
    while not (idle := _idle_standbys(run)):
        if loop.time() > deadline:
            raise TimeoutError("no warm standby came up")
        await asyncio.sleep(0.1)
    run.notes["idle_standbys"] = idle


async def _ended(run: CellRun) -> JobStatus:
    """Wait for the workflow to close (a cancel ends it without a result), then its
    last status: queries still answer on a closed workflow."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + run.ctx.shape.job_timeout_s
    while (await run.job.handle.describe()).status == WorkflowExecutionStatus.RUNNING:
        if loop.time() > deadline:
            raise TimeoutError("the job never ended")
        await asyncio.sleep(0.1)
    run.job.finished = True
    run.job.monitor.stop()
    return await _status(run)


def _set_memory_mode(run: CellRun, mode: int) -> None:
    """Open (0o755) or close (0o700) the job's tmpfs directory: open, the tier is
    unsafe and the checkpoint search refuses it (disk serves); only this job's
    directory, never the private root other jobs of this user share."""
    job_dir = _memory_job_dir(run.job.spec.job_id)
    job_dir.chmod(mode)
    run.notes.setdefault("memory_mode", []).append(f"{mode:o}")


# --------------------------------------------------------------------------- injections


async def rank_kill_steady(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    _signal_newest(run, 1, signal.SIGKILL)


async def rank_kill_continue_as_new(run: CellRun) -> None:
    await _next_run(run)
    _signal_newest(run, 1, signal.SIGKILL)


async def rank_hang_steady(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    _signal_newest(run, 0, signal.SIGSTOP)


async def rank_hang_stop(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    run.points.arm(points.STOP_AFTER_SIGTERM)
    # Rank 0 frozen first, so it cannot exit by itself when its peer dies (gloo sees
    # the closed connection at once): the recovery's stop must signal it and so
    # reaches the point. The stop's SIGCONT wakes it; it is frozen again below.
    _signal_newest(run, 0, signal.SIGSTOP)
    _signal_newest(run, 1, signal.SIGKILL)  # a crash: the recovery stops generation 1
    await _held_at(run, points.STOP_AFTER_SIGTERM)
    try:
        _signal_newest(run, 0, signal.SIGSTOP)  # SIGTERMed, now frozen before it can exit
    except ProcessLookupError:
        run.notes["rank0_already_exited"] = True
    run.points.release(points.STOP_AFTER_SIGTERM)


async def rank_stop_continue_as_new(run: CellRun) -> None:
    await _next_run(run)
    # Training, not rendezvous: a freeze before the first step is the launch cell's.
    await run.job.reach_step(run.ctx.shape.fault_step)
    _signal_newest(run, 0, signal.SIGSTOP)


async def worker_kill_relaunch(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    run.points.arm(points.LAUNCH_BEFORE_LAUNCH_JSON)
    _signal_newest(run, 1, signal.SIGKILL)
    await _held_at(run, points.LAUNCH_BEFORE_LAUNCH_JSON)
    await _kill_worker(run)
    run.points.release(points.LAUNCH_BEFORE_LAUNCH_JSON)
    await _restart_worker(run)


async def worker_kill_launch_before_pids(run: CellRun) -> None:
    await _held_at(run, points.LAUNCH_BEFORE_PIDS)
    await _kill_worker(run)
    run.points.release(points.LAUNCH_BEFORE_PIDS)
    await _restart_worker(run)


async def worker_kill_launch_before_launch_json(run: CellRun) -> None:
    await _held_at(run, points.LAUNCH_BEFORE_LAUNCH_JSON)
    await _kill_worker(run)
    run.points.release(points.LAUNCH_BEFORE_LAUNCH_JSON)
    await _restart_worker(run)


async def worker_kill_steady(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    await _kill_worker(run)
    await _restart_worker(run)


async def worker_kill_stop(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    run.points.arm(points.STOP_AFTER_SIGTERM)
    # Rank 0 frozen first, so it cannot exit by itself when its peer dies: the
    # recovery's stop must signal it, and so reaches the point the worker dies at.
    _signal_newest(run, 0, signal.SIGSTOP)
    _signal_newest(run, 1, signal.SIGKILL)
    await _held_at(run, points.STOP_AFTER_SIGTERM)
    await _kill_worker(run)
    run.points.release(points.STOP_AFTER_SIGTERM)
    await _restart_worker(run)


async def worker_kill_jit(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    run.points.arm(points.CHECKPOINT_BEFORE_COMMIT)
    await run.job.handle.signal(SIGNAL_PAUSE)
    await _held_at(run, points.CHECKPOINT_BEFORE_COMMIT)
    await _kill_worker(run)
    run.points.release(points.CHECKPOINT_BEFORE_COMMIT)
    await _restart_worker(run)
    await run.job.wait_phase(Phase.PAUSED)
    await run.job.handle.signal(SIGNAL_RESUME)


async def worker_kill_paused(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    await _pause(run)
    await _kill_worker(run)
    await _restart_worker(run)
    await run.job.wait_phase(Phase.PAUSED)
    await run.job.handle.signal(SIGNAL_RESUME)


async def worker_kill_continue_as_new(run: CellRun) -> None:
    await _next_run(run)
    await _kill_worker(run)
    await _restart_worker(run)


async def server_kill_steady(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    await _kill_server(run)


async def server_kill_relaunch(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    run.points.arm(points.LAUNCH_BEFORE_LAUNCH_JSON)
    _signal_newest(run, 1, signal.SIGKILL)
    await _held_at(run, points.LAUNCH_BEFORE_LAUNCH_JSON)
    server = run.ctx.stack.server
    assert server.pid is not None
    os.killpg(server.pid, signal.SIGKILL)
    run.notes.setdefault("faults", []).append({"server_sigkill_at": time.time()})
    run.points.release(points.LAUNCH_BEFORE_LAUNCH_JSON)
    await asyncio.to_thread(server.stop)
    await asyncio.to_thread(server.start)


async def server_kill_paused(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    await _pause(run)
    await _kill_server(run)
    await run.job.wait_phase(Phase.PAUSED)
    await run.job.handle.signal(SIGNAL_RESUME)


async def node_killed_steady(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    run.notes["killed_ranks"] = chaos.kill_node(run.job.run_root, "b")


async def corrupt_then_crash(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    _corrupt_newest_checkpoint(run)
    _signal_newest(run, 1, signal.SIGKILL)


async def corrupt_while_paused(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    await _pause(run)
    _corrupt_newest_checkpoint(run)  # the just-in-time one: resume must skip it
    await run.job.handle.signal(SIGNAL_RESUME)


def _stop_s3(run: CellRun) -> None:
    assert run.s3 is not None, "an S3 cell without the S3 endpoint"
    run.s3.stop()
    run.notes.setdefault("faults", []).append({"s3_stopped_at": time.time()})


async def s3_down_steady(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    _stop_s3(run)


async def s3_down_recovery(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    _stop_s3(run)
    _signal_newest(run, 1, signal.SIGKILL)


async def s3_down_paused(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    await _pause(run)
    _stop_s3(run)
    await run.job.handle.signal(SIGNAL_RESUME)


async def conflicting_signals_steady(run: CellRun) -> None:
    """A stray ``resume`` to a running job, then a real ``pause``: the pause must
    hold (the stray resume is ignored, not remembered), then a resume finishes it."""
    await run.job.reach_step(run.ctx.shape.fault_step)
    await run.job.handle.signal(SIGNAL_RESUME)
    await run.job.handle.signal(SIGNAL_PAUSE)
    await run.job.wait_phase(Phase.PAUSED)
    # Still paused after the controller had time to act on anything remembered:
    await run.job.reach_step(0)  # (cheap: a read of the run directory)
    status = await _status_after_polls(run, polls=10)
    run.notes["phase_after_pause"] = status.phase.value
    if status.phase != Phase.PAUSED:
        raise AssertionError(f"paused job went on to {status.phase.value} by itself")
    await run.job.handle.signal(SIGNAL_RESUME)


async def _status_after_polls(run: CellRun, polls: int) -> JobStatus:
    """The status after ``polls`` status queries, each answered by a workflow task
    (so the workflow has run its loop that many times)."""
    status = await run.job.wait_phase(Phase.PAUSED)
    for _ in range(polls):
        status = await run.job.handle.query("status", result_type=JobStatus)
        await asyncio.sleep(0.05)
    return status


async def duplicate_signals_paused(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    await run.job.handle.signal(SIGNAL_PAUSE)
    await run.job.handle.signal(SIGNAL_PAUSE)
    await run.job.wait_phase(Phase.PAUSED)
    await run.job.handle.signal(SIGNAL_PAUSE)
    await run.job.handle.signal(SIGNAL_RESUME)
    await run.job.handle.signal(SIGNAL_RESUME)


async def duplicate_pause_during_jit(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    run.points.arm(points.CHECKPOINT_BEFORE_COMMIT)
    await run.job.handle.signal(SIGNAL_PAUSE)
    await _held_at(run, points.CHECKPOINT_BEFORE_COMMIT)
    await run.job.handle.signal(SIGNAL_PAUSE)
    run.points.release(points.CHECKPOINT_BEFORE_COMMIT)
    await run.job.wait_phase(Phase.PAUSED)
    await run.job.handle.signal(SIGNAL_RESUME)


async def _into_rejoin(run: CellRun) -> None:
    """Crash rank 1 and hold the recovery's launch where the survivor (rank 0) has
    its rejoin request and the new rank 1 is started, launch.json not yet written:
    the middle of a rejoin, reached by a chaos point."""
    await run.job.reach_step(run.ctx.shape.fault_step)
    run.points.arm(points.LAUNCH_BEFORE_LAUNCH_JSON)
    _signal_newest(run, 1, signal.SIGKILL)
    await _held_at(run, points.LAUNCH_BEFORE_LAUNCH_JSON)


# ------------------------------------------------ a rank's fault, generated per phase
# A rank SIGKILLed and a rank SIGSTOPped are reached the same way at these phases and
# differ only in the signal: one reach per phase, one cell per (fault, phase) row.

RANK_SIGNALS = {"rank_sigkill": signal.SIGKILL, "rank_sigstop": signal.SIGSTOP}


async def _rank_at_launch(run: CellRun, sig: signal.Signals) -> None:
    await _held_at(run, points.LAUNCH_BEFORE_LAUNCH_JSON)
    _signal_newest(run, 1, sig)  # before its first heartbeat, the launch unrecorded
    run.points.release(points.LAUNCH_BEFORE_LAUNCH_JSON)


async def _rank_at_checkpoint_write(run: CellRun, sig: signal.Signals) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    run.points.arm(points.CHECKPOINT_BEFORE_COMMIT)
    await _held_at(run, points.CHECKPOINT_BEFORE_COMMIT)
    _signal_newest(run, 0, sig)  # rank 0 is the one holding the commit
    run.points.release(points.CHECKPOINT_BEFORE_COMMIT)


async def _rank_at_recovery_relaunch(run: CellRun, sig: signal.Signals) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    run.points.arm(points.LAUNCH_BEFORE_LAUNCH_JSON)
    _signal_newest(run, 1, signal.SIGKILL)
    await _held_at(run, points.LAUNCH_BEFORE_LAUNCH_JSON)
    _signal_newest(run, 1, sig)  # generation 2's rank 1, mid-launch
    run.points.release(points.LAUNCH_BEFORE_LAUNCH_JSON)


async def _rank_at_jit_checkpoint(run: CellRun, sig: signal.Signals) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    run.points.arm(points.CHECKPOINT_BEFORE_COMMIT)
    await run.job.handle.signal(SIGNAL_PAUSE)
    await _held_at(run, points.CHECKPOINT_BEFORE_COMMIT)
    _signal_newest(run, 1, sig)
    run.points.release(points.CHECKPOINT_BEFORE_COMMIT)
    await run.job.wait_phase(Phase.PAUSED)
    await run.job.handle.signal(SIGNAL_RESUME)


async def _rank_at_rejoin(run: CellRun, sig: signal.Signals) -> None:
    await _into_rejoin(run)
    _signal_newest(run, 1, sig)  # the new rank 1, mid-rendezvous
    run.points.release(points.LAUNCH_BEFORE_LAUNCH_JSON)


RANK_REACH: dict[str, Callable[[CellRun, signal.Signals], Awaitable[None]]] = {
    "launch_before_launch_json": _rank_at_launch,
    "checkpoint_write": _rank_at_checkpoint_write,
    "recovery_relaunch": _rank_at_recovery_relaunch,
    "jit_checkpoint": _rank_at_jit_checkpoint,
    "rejoin": _rank_at_rejoin,
}
"""The phases where a rank's fault is generated from its signal (:func:`rank_cell`)."""


def rank_cell(fault: str, phase: str, why: str, **setup: Any) -> Cell:
    """The cell of ``fault`` (a key of :data:`RANK_SIGNALS`) at ``phase`` (a key of
    :data:`RANK_REACH`), with its ``setup`` (the :class:`Cell` options)."""
    reach, sig = RANK_REACH[phase], RANK_SIGNALS[fault]

    async def inject(run: CellRun) -> None:
        await reach(run, sig)

    inject.__name__ = f"{fault}_at_{phase}"
    return Cell(fault, phase, why, inject, **setup)


async def survivor_kill_rejoin(run: CellRun) -> None:
    await _into_rejoin(run)
    _signal_newest(run, 0, signal.SIGKILL)  # the carried survivor (its pid file is linked)
    run.points.release(points.LAUNCH_BEFORE_LAUNCH_JSON)


async def worker_kill_rejoin(run: CellRun) -> None:
    await _into_rejoin(run)
    await _kill_worker(run)
    run.points.release(points.LAUNCH_BEFORE_LAUNCH_JSON)
    await _restart_worker(run)


async def crash_after_rollback(run: CellRun) -> None:
    """Generation 1 diverges at :data:`NAN_AT_STEP`; the rollback resumes generation
    2 below the retired checkpoint, with generation 1's newer snapshots still in
    tmpfs. Generation 2 is held at its first disk commit (below those snapshots)
    and rank 1 is killed there: the next resume must not pick them."""
    await run.job.reach_step(run.ctx.shape.fault_step)  # before the NaN
    run.points.arm(points.LAUNCH_BEFORE_PIDS)
    await _held_at(run, points.LAUNCH_BEFORE_PIDS)  # generation 2's launch
    incidents = (await _status(run)).incidents
    run.notes["rollback"] = [(i.failure_class, i.action, i.resumed_from_step) for i in incidents]
    run.points.arm(points.CHECKPOINT_BEFORE_COMMIT)
    run.points.release(points.LAUNCH_BEFORE_PIDS)
    await _held_at(run, points.CHECKPOINT_BEFORE_COMMIT)
    _signal_newest(run, 1, signal.SIGKILL)
    run.points.release(points.CHECKPOINT_BEFORE_COMMIT)


async def crash_after_disk_fallback(run: CellRun) -> None:
    """Generation 1 is held at a disk commit; the newest committed disk checkpoint is
    corrupted and the tier's directory opened to others (the search refuses it), then
    the holder dies: generation 2 falls back to the disk checkpoint before, two
    intervals below generation 1's snapshots. With the tier closed again, generation
    2 is held at its first disk commit (below those snapshots) and rank 1 is killed:
    the next resume must not pick generation 1's snapshots."""
    await run.job.reach_step(run.ctx.shape.fault_step + run.ctx.shape.ckpt_every + 1)
    run.points.arm(points.CHECKPOINT_BEFORE_COMMIT)
    await _held_at(run, points.CHECKPOINT_BEFORE_COMMIT)
    _corrupt_newest_checkpoint(run)
    _set_memory_mode(run, 0o755)
    run.points.arm(points.LAUNCH_BEFORE_PIDS)
    _signal_newest(run, 0, signal.SIGKILL)  # the holder: its checkpoint never commits
    run.points.release(points.CHECKPOINT_BEFORE_COMMIT)
    await _held_at(run, points.LAUNCH_BEFORE_PIDS)  # generation 2's launch, resume chosen
    _set_memory_mode(run, 0o700)
    incidents = (await _status(run)).incidents
    run.notes["fallback"] = [(i.kind, i.resumed_from_step, i.fallback_steps) for i in incidents]
    run.points.arm(points.CHECKPOINT_BEFORE_COMMIT)
    run.points.release(points.LAUNCH_BEFORE_PIDS)
    await _held_at(run, points.CHECKPOINT_BEFORE_COMMIT)
    _signal_newest(run, 1, signal.SIGKILL)
    run.points.release(points.CHECKPOINT_BEFORE_COMMIT)


async def preflight_fails_b(run: CellRun) -> None:
    """Rank 1 (on node b) crashes and b's preflight fails from then on: the
    recovery's relaunch must replace b (a spare) or shrink without it, with rejoin
    and the memory tier planned for the old node set."""
    await run.job.reach_step(run.ctx.shape.fault_step)
    (run.job.paths.root / PREFLIGHT_FLAG.format(node="b")).touch()
    _signal_newest(run, 1, signal.SIGKILL)


async def cancel_with_standbys(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    await _standbys_up(run)
    await run.job.handle.cancel()
    run.notes.setdefault("faults", []).append({"cancelled_at": time.time()})
    run.final = await _ended(run)


async def drain_with_standbys(run: CellRun) -> None:
    await run.job.reach_step(run.ctx.shape.fault_step)
    await _standbys_up(run)
    await run.job.handle.execute_update(
        UPDATE_DRAIN, NodeRequest(node="b", reason="chaos: quarantined with standbys up")
    )
    run.notes.setdefault("faults", []).append({"drained": "b", "at": time.time()})


def _fleet_check(run: CellRun, what: str, problems: list[str]) -> None:
    """Note one fleet check's problems; any of them fails the cell."""
    run.notes.setdefault("fleet_checks", {})[what] = problems
    if problems:
        raise AssertionError(f"{what}: {'; '.join(problems)}")


async def _start_again(run: CellRun) -> BenchJob:
    """A new start of the cell's job under the same name, spec and directories (what
    ``lazarus start`` of the same spec file does), monitored like the first."""
    first = run.job
    control = await JobControl.start(run.ctx.client, first.spec, run.ctx.stack.task_queue)
    again = BenchJob(
        run.ctx, first.spec, first.paths, control, RunMonitor(first.run_root), first.steps
    )
    again.monitor.__enter__()
    return again


async def restart_after_terminate(run: CellRun) -> None:
    """Issue 26, defects 6-8. A fleet job wedges (both ranks SIGSTOPped at step 15)
    and an operator terminates its workflow: no release runs, its lease is orphaned.
    A new start of the name must be refused with ``lazarus fleet release`` in its
    reason, launch nothing, and leave the old lease alone. The operator then kills the
    first start's ranks, sees none alive, and releases the lease (``--fenced``): a
    third start leases afresh, resumes the first start's checkpoint and succeeds;
    nothing stays leased or out of service."""
    assert run.fleet is not None, "a fleet cell without its fleet"
    fleets = FleetClient(run.ctx.client, task_queue=run.ctx.stack.task_queue)
    first = run.job
    job_id = first.spec.job_id
    await first.reach_step(run.ctx.shape.fault_step)
    leased = sorted((await _status(run)).nodes.active)
    _signal_newest(run, 0, signal.SIGSTOP)  # wedged: no step, no exit, no release
    _signal_newest(run, 1, signal.SIGSTOP)
    await first.control.terminate("chaos: an operator ends a wedged job")
    first.finished = True
    first.monitor.stop()
    ended = await first.handle.describe()
    run.notes["first_start"] = {
        "run_id": first.control.first_run_id,
        "leased": leased,
        "ended": ended.status.name if ended.status else None,
        "step": chaos.current_step(first.run_root)[1],
    }
    if ended.status != WorkflowExecutionStatus.TERMINATED:
        raise AssertionError(f"the first start is {ended.status}, not terminated")
    fleet = await fleets.status(run.fleet)
    _fleet_check(run, "orphaned", chaos_fleet.orphan_problems(fleet, job_id, leased))

    second = await _start_again(run)
    try:
        refused = await second.result()
    finally:
        second.monitor.stop()
    second_launches = await launches_from_history(
        run.ctx.client, second.control.workflow_id, second.control.first_run_id
    )
    run.notes["second_start"] = {
        "run_id": second.control.first_run_id,
        "phase": refused.phase.value,
        "reason": refused.operator_reason,
        "launches": len(second_launches),
    }
    _fleet_check(
        run,
        "refused",
        chaos_fleet.refusal_problems(refused, len(second_launches), job_id, run.fleet),
    )
    fleet = await fleets.status(run.fleet)
    _fleet_check(run, "kept_after_refusal", chaos_fleet.orphan_problems(fleet, job_id, leased))

    # The operator's way out: the first start's ranks are killed (checked gone),
    # then its lease freed, vouched fenced.
    await run.ctx.stop_ranks(first.run_root, job_id)
    left = chaos.live_ranks_by_generation(first.run_root)
    if left:
        raise AssertionError(f"the first start's ranks outlived their stop: {left}")
    run.notes["release"] = await fleets.release(run.fleet, job_id, fenced=True)
    fleet = await fleets.status(run.fleet)
    _fleet_check(run, "released", chaos_fleet.released_problems(fleet, job_id, leased))
    run.notes["weights_before_third_start"] = first.paths.weights.exists()

    third = await _start_again(run)
    run.job = third  # the cell's job from now on: judged, cleaned up
    running = await third.wait_phase(Phase.RUNNING)
    _fleet_check(run, "fresh_lease", chaos_fleet.lease_problems(running))
    run.notes["third_start"] = {
        "run_id": third.control.first_run_id,
        "leased": sorted(running.nodes.active),
    }
    run.final = await third.result()
    fleet = await fleets.status(run.fleet)
    _fleet_check(run, "nothing_held", chaos_fleet.leftover_problems(fleet, job_id))


# --------------------------------------------------------------------------- the matrix

CELLS: list[Cell] = [
    rank_cell(
        "rank_sigkill",
        "launch_before_launch_json",
        "a rank dies after its pid file but before the launch is recorded: the launch "
        "must still complete and supervision must find the dead rank",
        arm=points.LAUNCH_BEFORE_LAUNCH_JSON,
        smoke=True,
    ),
    Cell(
        "rank_sigkill", "steady", "the basic crash: relaunch from the checkpoint", rank_kill_steady
    ),
    rank_cell(
        "rank_sigkill",
        "checkpoint_write",
        "rank 0 dies between the manifest and COMMITTED: the half-written step must "
        "never be resumed from",
        smoke=True,
        lost_intervals=2,
    ),
    rank_cell(
        "rank_sigkill",
        "recovery_relaunch",
        "a second crash while the recovery's launch is half done (pid files, no "
        "launch.json): a second incident, never two generations",
    ),
    rank_cell(
        "rank_sigkill",
        "jit_checkpoint",
        "a rank dies while a pause's just-in-time checkpoint is being committed: the "
        "pause must still land, on an older checkpoint if need be",
        jit_only=True,
    ),
    Cell(
        "rank_sigkill",
        "continue_as_new",
        "a crash right after continue-as-new: the new run must re-attach to the ranks "
        "and still detect it",
        rank_kill_continue_as_new,
        continue_as_new=True,
    ),
    Cell("rank_sigstop", "steady", "a hang, found by the hang clock", rank_hang_steady),
    rank_cell(
        "rank_sigstop",
        "checkpoint_write",
        "rank 0 freezes holding an uncommitted checkpoint: hang detection, and the "
        "half-written step is not resumed from",
        lost_intervals=2,
    ),
    Cell(
        "rank_sigstop",
        "stop",
        "a rank frozen after SIGTERM: the stop must SIGKILL it after the grace, not wait",
        rank_hang_stop,
        smoke=True,
    ),
    rank_cell(
        "rank_sigstop",
        "launch_before_launch_json",
        "a rank freezes before its first heartbeat while the launch is unrecorded: the "
        "launch completes and the silent rank is found hung",
        arm=points.LAUNCH_BEFORE_LAUNCH_JSON,
    ),
    rank_cell(
        "rank_sigstop",
        "recovery_relaunch",
        "a rank of the recovery's generation freezes mid-launch: a second incident (a "
        "hang), never two generations",
    ),
    rank_cell(
        "rank_sigstop",
        "jit_checkpoint",
        "a peer freezes while rank 0 commits a pause's just-in-time checkpoint: the "
        "pause's stop (SIGTERM with SIGCONT) still takes it down",
        jit_only=True,
    ),
    Cell(
        "rank_sigstop",
        "continue_as_new",
        "a hang right after continue-as-new: the new run's hang clock must find it",
        rank_stop_continue_as_new,
        continue_as_new=True,
    ),
    Cell(
        "worker_sigkill",
        "recovery_relaunch",
        "the controller dies while a recovery's launch is half done: the retried launch "
        "adopts generation 2, never starts it twice",
        worker_kill_relaunch,
    ),
    Cell(
        "worker_sigkill",
        "launch_before_pids",
        "the controller dies before any rank started: the retried launch starts them once",
        worker_kill_launch_before_pids,
        arm=points.LAUNCH_BEFORE_PIDS,
    ),
    Cell(
        "worker_sigkill",
        "launch_before_launch_json",
        "the controller dies with ranks started but the launch unrecorded: the retry "
        "must adopt them, never start duplicates",
        worker_kill_launch_before_launch_json,
        arm=points.LAUNCH_BEFORE_LAUNCH_JSON,
    ),
    Cell(
        "worker_sigkill",
        "steady",
        "the controller dies: ranks train on, the new worker re-attaches",
        worker_kill_steady,
    ),
    Cell(
        "worker_sigkill",
        "stop",
        "the controller dies half-way through a recovery's stop: the retried stop finishes it",
        worker_kill_stop,
    ),
    Cell(
        "worker_sigkill",
        "jit_checkpoint",
        "the controller dies while a pause waits for its just-in-time checkpoint",
        worker_kill_jit,
        jit_only=True,
    ),
    Cell(
        "worker_sigkill",
        "paused",
        "the controller dies while the job is paused: still paused, resumes on request",
        worker_kill_paused,
    ),
    Cell(
        "worker_sigkill",
        "continue_as_new",
        "the controller dies right after continue-as-new",
        worker_kill_continue_as_new,
        continue_as_new=True,
    ),
    Cell(
        "server_sigkill",
        "steady",
        "the Temporal server dies hard and comes back: training is untouched",
        server_kill_steady,
    ),
    Cell(
        "server_sigkill",
        "recovery_relaunch",
        "the server dies while a recovery's launch is half done",
        server_kill_relaunch,
    ),
    Cell(
        "server_sigkill",
        "paused",
        "the server dies while the job is paused: the pause survives",
        server_kill_paused,
    ),
    Cell(
        "node_ranks_killed",
        "steady",
        "every rank of local node b dies with its wrapper (no exit status): node lost, "
        "the spare takes over",
        node_killed_steady,
        nodes=True,
    ),
    Cell(
        "s3_stopped",
        "steady",
        "S3 dies mid-job: tiering fails, training and local checkpoints go on",
        s3_down_steady,
        s3=True,
    ),
    Cell(
        "s3_stopped",
        "recovery_relaunch",
        "S3 is down when a crash needs a recovery: resume from the local checkpoint",
        s3_down_recovery,
        s3=True,
    ),
    Cell(
        "s3_stopped",
        "paused",
        "S3 dies while paused: resume from the local just-in-time checkpoint",
        s3_down_paused,
        s3=True,
    ),
    Cell(
        "checkpoint_corrupt",
        "steady",
        "the newest checkpoint is corrupted, then a crash: resume must verify and fall "
        "back to the one before",
        corrupt_then_crash,
    ),
    Cell(
        "checkpoint_corrupt",
        "paused",
        "the just-in-time checkpoint of a pause is corrupted while paused: resume falls back",
        corrupt_while_paused,
        jit_only=True,
    ),
    Cell(
        "operator_signal",
        "steady",
        "a stray resume to a running job, then a pause: the pause must hold",
        conflicting_signals_steady,
    ),
    Cell(
        "operator_signal",
        "paused",
        "pause twice, pause while paused, resume twice: one pause, one resume",
        duplicate_signals_paused,
    ),
    Cell(
        "operator_signal",
        "jit_checkpoint",
        "a second pause while the first one's just-in-time checkpoint is being written",
        duplicate_pause_during_jit,
        jit_only=True,
    ),
    # The fast paths (issue 26).
    rank_cell(
        "rank_sigkill",
        "rejoin",
        "the new rank dies while the survivor rejoins: never two generations, the "
        "job still completes",
        rejoin=True,
    ),
    rank_cell(
        "rank_sigstop",
        "rejoin",
        "the new rank freezes while the survivor rejoins: found hung, the whole "
        "generation restarts",
        rejoin=True,
    ),
    Cell(
        "survivor_sigkill",
        "rejoin",
        "the survivor itself dies while it rejoins (a second rank lost): a second "
        "incident, never a rank of two generations",
        survivor_kill_rejoin,
        rejoin=True,
    ),
    Cell(
        "worker_sigkill",
        "rejoin",
        "the controller dies while the survivor rejoins: the retried launch adopts "
        "the rejoin, never starts a duplicate",
        worker_kill_rejoin,
        rejoin=True,
    ),
    Cell(
        "rank_sigkill",
        "after_rollback",
        "a crash after a numerical rollback, before the new timeline passes the old "
        "one's snapshots: they must never be resumed",
        crash_after_rollback,
        memory=True,
        nan_at_step=NAN_AT_STEP,
        lost_intervals=2,
    ),
    Cell(
        "rank_sigkill",
        "after_disk_fallback",
        "a crash after a fallback to disk below the memory tier's snapshots: the "
        "old timeline's snapshots must never be resumed",
        crash_after_disk_fallback,
        memory=True,
        lost_intervals=2,
    ),
    Cell(
        "preflight_swap",
        "recovery_relaunch",
        "a crash on node b, whose preflight then fails: a spare replaces b with the "
        "memory tier and rejoin on",
        preflight_fails_b,
        nodes=True,
        memory=True,
        rejoin=True,
        preflight_flag=True,
    ),
    Cell(
        "preflight_shrink",
        "recovery_relaunch",
        "a crash on node b, whose preflight then fails: the job shrinks to a and c "
        "with the memory tier and rejoin on",
        preflight_fails_b,
        three_nodes=True,
        memory=True,
        rejoin=True,
        preflight_flag=True,
        weights=False,
    ),
    Cell(
        "job_cancelled",
        "warm_standby",
        "the job cancelled with warm standbys up: nothing of it alive 20 s later",
        cancel_with_standbys,
        nodes=True,
        warm=True,
        expect=(Phase.CANCELLED,),
        smoke=True,
    ),
    Cell(
        "node_quarantined",
        "warm_standby",
        "a node drained (quarantined) with warm standbys up: its zygote and standby "
        "are gone 20 s after the job ends",
        drain_with_standbys,
        nodes=True,
        warm=True,
    ),
    # The fleet row (issue 26, defects 6-8).
    Cell(
        "job_terminated",
        "same_name_restart",
        "a wedged fleet job terminated (its lease orphaned), then started again under "
        "its name: refused naming 'lazarus fleet release', never handed the stale "
        "lease; after the release a fresh start succeeds and nothing stays held",
        restart_after_terminate,
        fleet=True,
    ),
    # The cross-node fast paths on SSH test hosts (issue 28).
    *chaos_multinode.CELLS,
]
CELLS_BY_KEY = {cell.key: cell for cell in CELLS}
SMOKE = [cell.key for cell in CELLS if cell.smoke]
LOCAL = [cell.key for cell in CELLS if cell.ssh is None]
"""Every cell that needs no SSH test hosts: what ``make test-all`` runs."""


def absent_reason(fault: str, phase: str) -> str:
    """Why a (fault, phase) pair is not a cell of :data:`CELLS`."""
    cross_node = chaos_multinode.absent_reason(fault, phase)
    if cross_node is not None:
        return cross_node
    if fault in FLEET_FAULTS:
        return (
            "the fleet row: a terminated workflow orphans its lease, which only a new "
            "start of the name meets (same_name_restart)"
        )
    if phase in FLEET_PHASES:
        return (
            "the fleet row: a new start of the name meets only what the last start left "
            "behind; the job_terminated cell is the start that leaves a lease"
        )
    if fault in FAST_FAULTS and phase not in FAST_PHASES:
        return (
            "a fault of the fast paths: it exists only with rejoin, a preflight at a "
            "recovery's relaunch, or warm standbys (its cells say where)"
        )
    if phase in FAST_PHASES:
        return (
            "a fast-path phase: its rows are the faults issue 26 names there; this fault "
            "takes the same path as in the slow-path phase it shares (steady, relaunch)"
        )
    if fault == "s3_stopped":
        return (
            "S3 is read only at a restore and written only by background tiering: the "
            "steady, recovery and paused cells cover both"
        )
    if fault in ("rank_sigkill", "rank_sigstop", "node_ranks_killed"):
        if phase == "launch_before_pids":
            return "no rank exists yet"
        if phase == "paused":
            return "no rank runs while paused"
    if fault == "rank_sigkill" and phase == "stop":
        return "the stop SIGKILLs ranks itself after the grace: nothing new to test"
    if fault == "node_ranks_killed":
        return "the same path as a rank SIGKILL at this phase (a local node is its ranks)"
    if fault == "checkpoint_corrupt":
        return "only a resume reads a checkpoint: covered by the steady and paused cells"
    if fault == "server_sigkill":
        return (
            "the server holds no state of this phase that the steady and relaunch "
            "cells do not already cover"
        )
    if fault == "worker_sigkill" and phase == "checkpoint_write":
        return "the worker plays no part in a periodic checkpoint write"
    if fault == "operator_signal":
        return "signals in this phase are covered by the steady/paused/jit cells"
    raise ValueError(f"{fault}@{phase}: neither a cell nor a reason why not")


# --------------------------------------------------------------------------- running


def _spec_builder(
    cell: Cell, shape: JobShape, s3: ChaosS3 | None, fleet: str | None = None
) -> Callable[[str, JobPaths], JobSpec]:
    def build(name: str, paths: JobPaths) -> JobSpec:
        spec = _base_spec(name, paths)
        args: list[str] = []
        if cell.rejoin:
            args.append("--resilient")
        if cell.nan_at_step is not None:
            args += ["--nan-at-step", str(cell.nan_at_step)]
        return spec.model_copy(update={"command": [*spec.command, *args]}) if args else spec

    def _base_spec(name: str, paths: JobPaths) -> JobSpec:
        used = dataclasses.replace(shape, ckpt_every=shape.steps) if cell.jit_only else shape
        extra: dict[str, object] = {}
        if cell.memory:
            extra["checkpoints"] = {"memory_every_steps": 1}
        if cell.rejoin:
            extra["rejoin"] = dict(REJOIN)
        if cell.warm:
            extra["warm_start"] = {"preload": ["torch"], "standby": 1}
        if cell.preflight_flag:
            flag = str(paths.root / PREFLIGHT_FLAG.format(node=""))
            check = (
                f"import os, sys; sys.exit(os.path.exists({flag!r} + os.environ['LAZARUS_NODE']))"
            )
            extra["preflight"] = {"health_command": [sys.executable, "-c", check]}
        if cell.fleet:
            assert fleet is not None, "a fleet cell without its fleet"
            extra["fleet"] = {"name": fleet, "nodes": chaos_fleet.LEASED_NODES}
            return build_spec(name, paths, used, nproc_per_node=1, extra=extra)
        if cell.three_nodes:
            extra |= {"nodes": [{"name": n} for n in "abc"], "min_nodes": 2}
            return build_spec(name, paths, used, nproc_per_node=1, extra=extra)
        if cell.s3:
            assert s3 is not None, "an S3 cell without the S3 endpoint"
            extra["checkpoints"] = {
                "durable_uri": s3.durable_uri(name),
                "endpoint_url": s3.endpoint,
                "housekeeping_interval_s": 0,
                "upload_part_size_mb": 5,
            }
        if cell.nodes:
            extra |= {"nodes": [{"name": "a"}, {"name": "b"}], "spares": [{"name": "s0"}]}
            return build_spec(name, paths, used, nproc_per_node=1, extra=extra)
        return build_spec(name, paths, used, extra=extra)

    return build


async def run_cell(
    cell: Cell, chaos_points: ChaosPoints, ctx: BenchContext, s3: ChaosS3 | None = None
) -> Outcome:
    """One job, one fault at one phase, every invariant judged."""
    shape = ctx.shape
    chaos_points.release_all()
    if s3 is not None:
        s3.start()  # back up after an earlier cell's outage
    if cell.arm is not None:
        chaos_points.arm(cell.arm)
    overrides = (
        {"continue_as_new_after_events": CONTINUE_AS_NEW_AFTER_EVENTS}
        if cell.continue_as_new
        else None
    )
    label = cell.key.replace("@", ".")  # a job name allows no '@'
    async with AsyncExitStack() as cleanup:
        fleet = await _start_fleet(ctx, cleanup) if cell.fleet else None
        hosts = None
        if cell.ssh is not None:
            hosts = await cleanup.enter_async_context(
                multinode.hosts_for_run(ctx, label, 0, count=cell.ssh.hosts)
            )
            build = chaos_multinode.spec_builder(cell, shape, hosts, chaos_points.directory)
        else:
            build = _spec_builder(cell, shape, s3, fleet)
        first = await cleanup.enter_async_context(
            ctx.job(label, 0, build, input_overrides=overrides)
        )
        run = CellRun(ctx, first, chaos_points, s3, fleet=fleet, hosts=hosts)
        cleanup.push_async_callback(_abandon_restarts, run, first)
        return await _judged(cell, run, census_of(cell, first, hosts))


def census_of(cell: Cell, job: BenchJob, hosts: TestHosts | None = None) -> GenerationCensus:
    """The census of every run of the job's name (its run root holds them all); on
    SSH test hosts, of every host's own tmpfs."""
    if hosts is not None:
        return chaos_multinode.HostsCensus(job.run_root, hosts, job.spec.job_id)
    memory_dir = _memory_job_dir(job.spec.job_id) if cell.memory else None
    return GenerationCensus(job.run_root, memory_job_dir=memory_dir)


async def _start_fleet(ctx: BenchContext, cleanup: AsyncExitStack) -> str:
    """A fleet of local logical nodes on the matrix's worker, terminated with the cell."""
    config = FleetConfig.model_validate(
        {
            "name": f"chaos-{uuid.uuid4().hex[:6]}",
            "nodes": [{"name": n} for n in chaos_fleet.FLEET_NODES],
        }
    )
    await FleetClient(ctx.client, task_queue=ctx.stack.task_queue).start(config)
    handle = ctx.client.get_workflow_handle(fleet_workflow_id(config.name))

    async def stop() -> None:
        with suppress(RPCError):
            await handle.terminate("chaos cell done")

    cleanup.push_async_callback(stop)
    return config.name


async def _abandon_restarts(run: CellRun, first: BenchJob) -> None:
    """A later start of the job's name the injection left: stopped like the first."""
    if run.job is not first:
        await run.job.abandon()


async def _judged(cell: Cell, run: CellRun, census: GenerationCensus) -> Outcome:
    """Inject the cell's fault into its running job, wait for the end, judge it."""
    ctx, chaos_points, shape = run.ctx, run.points, run.ctx.shape
    with census:
        try:
            await cell.inject(run)
            chaos_points.release_all()
            status = run.final if run.final is not None else await run.job.result()
        except Exception as exc:
            raise CellError(f"{exc or type(exc).__name__}; {await _last_status(run.job)}") from exc
        finally:
            chaos_points.release_all()  # nothing may stay held, cleanup included
            if not ctx.stack.worker_running:
                ctx.stack.start_worker()
    job = run.job  # the last start of the name, where an injection started it again
    common = await job.common_outcome(status)
    # A fleet job's spec names no nodes (its world size is the lease's): judge it by
    # the world size it ran at.
    world_size = status.world_size if cell.fleet else job.spec.world_size
    weights_ok = (
        bool(common.metrics["weights_ok"])
        if Phase.SUCCEEDED in cell.expect and cell.weights
        else None
    )
    if cell.fleet and weights_ok is not None:
        weights_ok = status.phase == Phase.SUCCEEDED and await ctx.weights_ok(
            job.paths.weights, world_size=world_size
        )
    launches = await launches_from_history(
        ctx.client, job.control.workflow_id, job.control.first_run_id
    )
    verdict = await asyncio.to_thread(
        partial(
            judge,
            status,
            cell.expect,
            weights_ok,
            census,
            world_size,
            (shape.steps if cell.jit_only else shape.ckpt_every) * cell.lost_intervals,
            job.run_root,
            job.paths.checkpoints,
            launches=launches,
            job_dir=job.paths.root,
        )
    )
    if cell.check is not None:
        problems = cell.check(run, launches)
        verdict.check("cell_check", not problems, "; ".join(problems))
    return Outcome(
        metrics={"held": verdict.held, **verdict.checks},
        details={
            **common.details,
            "violations": verdict.violations,
            "timeline_unjudged": verdict.unjudged,
            "launches": [dataclasses.asdict(launch) for launch in launches],
            "resumed_snapshot_writers": {  # the writers the timeline check judged by
                launch.resume_path: [
                    dataclasses.asdict(seen) for seen in census.writers.get(launch.resume_path, [])
                ]
                for launch in launches
                if launch.resume_path in census.writers
            },
            "notes": run.notes,
            "census_samples": census.samples,
            "max_live_ranks": census.max_live_ranks,
        },
    )


async def launches_from_history(
    client: Client, workflow_id: str, first_run_id: str
) -> list[Launch]:
    """Every launch the controller asked for, across the continue-as-new chain, read
    from the workflow's history (the activity inputs: what the ranks were given as
    their resume point), in the order they were scheduled."""
    launches: list[Launch] = []
    run_id: str | None = first_run_id
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        for event in history.events:
            if not event.HasField("activity_task_scheduled_event_attributes"):
                continue
            attributes = event.activity_task_scheduled_event_attributes
            if attributes.activity_type.name != LAUNCH.name or not attributes.input.payloads:
                continue
            request = json.loads(attributes.input.payloads[0].data)
            resume = request.get("resume")
            launches.append(
                Launch(
                    generation=int(request["generation"]),
                    resume_step=int(resume["step"]) if resume else 0,
                    resume_path=str(resume["path"]) if resume else None,
                    at=event.event_time.ToMicroseconds() / 1e6,
                )
            )
        last = history.events[-1] if history.events else None
        run_id = None
        if last is not None and last.HasField(
            "workflow_execution_continued_as_new_event_attributes"
        ):
            run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return launches


class CellError(Exception):
    """A cell that could not finish: the message says where the job was left."""


async def _last_status(job: BenchJob) -> str:
    """The job's last known state, for the reason of a cell that failed."""
    try:
        status = await asyncio.wait_for(
            job.handle.query("status", result_type=JobStatus), timeout=10
        )
    except Exception as exc:  # the server or worker may be what failed
        return f"status unavailable ({type(exc).__name__})"
    return (
        f"job {status.phase.value} at step {status.step}, generation {status.generation}, "
        f"incidents {[i.kind for i in status.incidents]}"
    )


def _references(cell: Cell) -> Callable[[JobShape], list[Reference]]:
    if not cell.weights:
        return lambda shape: []
    world = cell.world_size
    return lambda shape: [(world, shape.steps)]


def scenarios_for(
    cells: list[Cell], chaos_points: ChaosPoints, s3: ChaosS3 | None = None
) -> list[Scenario]:
    """Each cell as a harness scenario: one framework for every benchmark."""

    def runner(cell: Cell) -> Callable[[BenchContext, int], Awaitable[Outcome]]:
        async def run(ctx: BenchContext, repeat: int) -> Outcome:
            return await run_cell(cell, chaos_points, ctx, s3)

        return run

    return [
        Scenario(
            name=cell.key,
            summary=cell.why,
            run=runner(cell),
            references=_references(cell),
            # Without root, ``ip`` or ``sshd`` the cross-node cells are skipped, with why.
            unavailable=multinode.netns_unavailable_reason if cell.ssh is not None else None,
        )
        for cell in cells
    ]


@dataclass(frozen=True)
class CellResult:
    fault: str
    phase: str
    state: str
    """held, failed, n/a (not a cell of the matrix), not run (not selected), or
    skipped (it cannot run on this machine: a cross-node cell without network
    namespaces)."""
    reason: str
    wall_s: float | None = None


def results(cells: list[Cell], records: list[RunRecord]) -> list[CellResult]:
    """Every (fault, phase) pair: the run cells' verdicts, the others' reasons."""
    by_key = {r.scenario: r for r in records}
    chosen = {c.key for c in cells}
    out: list[CellResult] = []
    for fault in FAULTS:
        for phase in PHASES:
            key = f"{fault}@{phase}"
            record = by_key.get(key)
            if record is None and key in CELLS_BY_KEY and key not in chosen:
                out.append(CellResult(fault, phase, "not run", "not selected in this run"))
            elif record is None:
                out.append(CellResult(fault, phase, "n/a", absent_reason(fault, phase)))
            elif record.skipped is not None:
                out.append(CellResult(fault, phase, "skipped", record.skipped))
            elif record.error is not None:
                out.append(CellResult(fault, phase, "failed", record.error, record.wall_s))
            elif record.metrics.get("held"):
                out.append(CellResult(fault, phase, "held", CELLS_BY_KEY[key].why, record.wall_s))
            else:
                why = "; ".join(record.details.get("violations", [])) or "invariant failed"
                out.append(CellResult(fault, phase, "failed", why, record.wall_s))
    return out


def render_table(cells: list[CellResult]) -> str:
    """The matrix as a rich table (faults down, phases across), as plain text."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Lazarus chaos matrix (fault x phase)", show_lines=True)
    table.add_column("fault")
    for phase in PHASES:
        table.add_column(phase.replace("_", " "), overflow="fold")
    mark = {
        "held": "[green]held[/]",
        "failed": "[red]FAILED[/]",
        "n/a": "[dim]n/a[/]",
        "not run": "[dim]-[/]",
        "skipped": "[yellow]skipped[/]",
    }
    for fault, label in FAULTS.items():
        row = [c for c in cells if c.fault == fault]
        table.add_row(label, *(mark[c.state] for c in row))
    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(table)
    return console.export_text()


def summary_line(cells: list[CellResult]) -> str:
    run = [c for c in cells if c.state in ("held", "failed")]
    held = [c for c in run if c.state == "held"]
    absent = sum(1 for c in cells if c.state == "n/a")
    skipped = sum(1 for c in cells if c.state == "skipped")
    return (
        f"{len(held)}/{len(run)} cells held ({len(CELLS)} cells in the matrix; "
        f"{absent} fault x phase pairs are not cells, each with its reason in the JSON"
        + (f"; {skipped} skipped: they cannot run on this machine" if skipped else "")
        + ")"
    )


def payload(cells: list[CellResult], bench: BenchRun, chaos_shape: JobShape) -> dict[str, Any]:
    return {
        "benchmark": "chaos",
        "machine": report.machine_info(),
        "config": {"job": chaos_shape.as_dict(), "cells": [c.key for c in CELLS]},
        "summary": summary_line(cells),
        "held": sum(1 for c in cells if c.state == "held"),
        "failed": sum(1 for c in cells if c.state == "failed"),
        "matrix": [dataclasses.asdict(c) for c in cells],
        "runs": [dataclasses.asdict(r) for r in bench.records],
        "load_average_at_start": bench.load_average_at_start,
    }


def run_matrix(
    cells: list[Cell],
    shape: JobShape = CHAOS_SHAPE,
    keep_workdir: bool = False,
    progress: Callable[[str], None] = print,
) -> tuple[list[CellResult], BenchRun]:
    """Run ``cells`` on one LocalStack; every other pair gets its reason."""
    chaos_dir = Path(tempfile.mkdtemp(prefix="lazarus-chaos-points-"))
    chaos_points = ChaosPoints(chaos_dir)
    previous = os.environ.get(CHAOS_DIR_ENV)
    os.environ[CHAOS_DIR_ENV] = str(chaos_dir)  # the worker and local ranks inherit it
    try:
        with ExitStack() as stack:
            # Started first, so the worker inherits its (fake) credentials.
            s3 = stack.enter_context(chaos_s3()) if any(c.s3 for c in cells) else None
            bench = run_benchmark(
                scenarios_for(cells, chaos_points, s3), shape, 1, keep_workdir, progress=progress
            )
    finally:
        chaos_points.release_all()
        if previous is None:
            os.environ.pop(CHAOS_DIR_ENV, None)
        else:
            os.environ[CHAOS_DIR_ENV] = previous
        shutil.rmtree(chaos_dir, ignore_errors=True)
    return results(cells, bench.records), bench


# --------------------------------------------------------------------------- CLI


def _cell_keys(text: str) -> list[str]:
    if text == "smoke":
        return list(SMOKE)
    if text == "local":
        return list(LOCAL)
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in CELLS_BY_KEY]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(
            f"unknown cell(s) {', '.join(unknown) or '(none given)'}; choose from "
            f"{', '.join(CELLS_BY_KEY)} (or 'smoke', 'local')"
        )
    return keys


def add_options(parser: argparse.ArgumentParser) -> None:
    """``python -m tests.chaos``'s options (:mod:`tests.chaos.__main__`)."""
    parser.add_argument(
        "--cells",
        type=_cell_keys,
        default=list(CELLS_BY_KEY),
        help="comma-separated fault@phase keys, 'smoke' (make test's) or 'local' (every cell "
        "without SSH test hosts: make test-all's) (default: every cell)",
    )
    parser.add_argument("--list", action="store_true", help="list the cells and exit")
    parser.add_argument("--json-out", type=Path, help="default: bench/results/chaos-<ts>.json")
    parser.add_argument("--keep-workdir", action="store_true", help="keep logs for debugging")


def run(args: argparse.Namespace) -> int:
    if args.list:
        for cell in CELLS:
            print(f"{cell.key:45} {cell.why}")
        return 0
    cells = [CELLS_BY_KEY[k] for k in args.cells]
    matrix, bench = run_matrix(
        cells,
        keep_workdir=args.keep_workdir,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    json_out: Path = results_path("chaos", args.json_out)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(payload(matrix, bench, CHAOS_SHAPE), indent=2, default=str))
    print(render_table(matrix))
    for result in matrix:
        if result.state == "failed":
            print(f"FAILED {result.fault}@{result.phase}: {result.reason}")
    print(summary_line(matrix))
    print(f"raw results: {json_out}")
    return 0 if all(c.state != "failed" for c in matrix) else 1
