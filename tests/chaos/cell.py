"""What a chaos cell is, and what its injection sees and may use: shared by the matrix
(:mod:`tests.chaos.matrix`) and the rows that live in modules of their own
(:mod:`tests.chaos.multinode`), which the matrix imports (so none of them imports it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bench.harness import BenchContext, BenchJob
from bench.jobs import WORLD_SIZE
from infra import chaos
from infra.testhosts import TestHosts
from tests.chaos.invariants import Launch
from tests.chaos.points import ChaosPoints
from tests.chaos.s3 import ChaosS3
from workflows.state import JobStatus, Phase

REJOIN = {"enabled": True, "timeout_s": 60.0}
"""The rejoin cells' ``rejoin``: long enough for a survivor to outwait a controller
restarted on a loaded machine."""


@dataclass(frozen=True)
class SshLayout:
    """A cell on SSH test hosts (:mod:`tests.chaos.multinode`): ``nodes`` hosts of one
    rank each (h1, h2, ...), then ``spares`` more held in reserve, each host with its
    own ``/dev/shm``."""

    nodes: int
    spares: int = 0
    replicas: bool = False
    """The memory tier every step with ``memory_replicas``: each node pushes its
    committed snapshot to the next (a ring)."""
    points_in_ranks: bool = False
    """The ranks reach the chaos points too (the spec refuses ``LAZARUS_*`` in ``env``,
    so the command runs under ``env LAZARUS_CHAOS_DIR=...``; not with rejoin, which
    needs the command to be the interpreter)."""

    @property
    def hosts(self) -> int:
        return self.nodes + self.spares

    @property
    def world_size(self) -> int:
        return self.nodes


@dataclass
class CellRun:
    """What an injection sees: the harness, the job, the chaos points. ``notes`` go
    into the result (the fault injected, at which step, ...)."""

    ctx: BenchContext
    job: BenchJob
    points: ChaosPoints
    s3: ChaosS3 | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    final: JobStatus | None = None
    """Set by an injection that ends the job itself (a cancel): its last status."""
    fleet: str | None = None
    """The fleet the job leases from (a ``fleet`` cell)."""
    hosts: TestHosts | None = None
    """The SSH test hosts the job runs on (an ``ssh`` cell)."""


Inject = Callable[[CellRun], Awaitable[None]]
Check = Callable[[CellRun, list[Launch]], list[str]]
"""A cell's own check, judged with the matrix's invariants once the job ended: what
must not have happened, in words (empty: it held). It gets the launches the
controller asked for, from the workflow's history."""


@dataclass(frozen=True)
class Cell:
    fault: str
    phase: str
    why: str
    """What this combination tests that no other cell does."""
    inject: Inject
    arm: str | None = None
    """A chaos point held from the job's start (launch points of generation 1)."""
    expect: tuple[Phase, ...] = (Phase.SUCCEEDED,)
    jit_only: bool = False
    """Checkpoints only when asked (no periodic ones): the just-in-time one is the
    only checkpoint write the cell can hold."""
    nodes: bool = False
    """Two local logical nodes of one rank each, plus a spare."""
    continue_as_new: bool = False
    s3: bool = False
    """Checkpoints are tiered to the matrix's S3 endpoint (moto)."""
    lost_intervals: int = 1
    """How many checkpoint intervals of steps the fault may cost: 2 where it destroys
    the checkpoint being written (the one before it is the newest to resume from)."""
    smoke: bool = False
    """Part of the fast subset run by ``make test``."""
    memory: bool = False
    """The memory tier on: a tmpfs snapshot every step (``memory_every_steps: 1``)."""
    rejoin: bool = False
    """Rejoin in place on (the example in its ``--resilient`` mode)."""
    warm: bool = False
    """Warm starts with one standby per node (``warm_start: {standby: 1}``)."""
    three_nodes: bool = False
    """Three local logical nodes of one rank each, ``min_nodes: 2``, no spare."""
    preflight_flag: bool = False
    """A health command that fails node ``n`` while :data:`PREFLIGHT_FLAG` exists."""
    nan_at_step: int | None = None
    """The loss diverges at this step in generation 1 (the numerical ladder rolls back)."""
    weights: bool = True
    """Judge the final weights (not after a shrink: the world size changed mid-run,
    so no fault-free run of one world size has them)."""
    fleet: bool = False
    """The job leases two one-rank local nodes from a fleet of three
    (:data:`tests.chaos.fleet.FLEET_NODES`), started for the cell on the matrix's worker.
    An injection may start the job again under its name: the cell's job (its end
    state, weights, launches) is then the last start, ``run.job``."""
    ssh: SshLayout | None = None
    """Run on fresh SSH test hosts (network namespaces), started for the cell."""
    check: Check | None = None
    """The cell's own check, beside the matrix's invariants (``cell_check``)."""

    @property
    def world_size(self) -> int:
        """The world size the job starts at (its fault-free reference's)."""
        if self.ssh is not None:
            return self.ssh.world_size
        if self.three_nodes:
            return 3
        return 2 if self.nodes else WORLD_SIZE

    @property
    def key(self) -> str:
        return f"{self.fault}@{self.phase}"


def signal_newest(run: CellRun, rank: int, sig: signal.Signals) -> None:
    fault = chaos.signal_rank(run.job.run_root, rank=rank, sig=sig)
    run.notes.setdefault("faults", []).append(dataclasses.asdict(fault))


async def kill_worker(run: CellRun) -> None:
    run.ctx.stack.kill_worker(signal.SIGKILL)
    run.notes.setdefault("faults", []).append({"worker_sigkill_at": time.time()})


async def restart_worker(run: CellRun) -> None:
    await asyncio.sleep(run.ctx.shape.worker_down_s)  # the outage's length, not a sync point
    run.ctx.stack.start_worker()


async def held_at(run: CellRun, point: str) -> None:
    await run.points.reached(point)
    run.notes["held_at"] = point
    run.notes["step_when_held"] = chaos.current_step(run.job.run_root)[1]


async def job_status(run: CellRun) -> JobStatus:
    status: JobStatus = await run.job.handle.query("status", result_type=JobStatus)
    return status
