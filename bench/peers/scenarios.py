"""The peers' runners for ``crash`` and ``hang``, and why they do not run the rest.

The same job, fault step and outside measurement as the other systems
(:func:`bench.scenarios.recovery_metrics`): ``nvrx`` runs as torchrun; for
``nvrx_inprocess`` a generation is the Wrapper iteration + 1; torchft's survivors go
on without the failed group, so it reports ``survivors_first_step_s`` beside
``recovery_outside_s`` (the job at full world size). A peer not installed fails its
runs saying how to install it (``make bench-peers``).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from bench.harness import RANK_ENV, BenchContext, Metric, TorchrunRun, wait_until
from bench.jobs import REPO, WORLD_SIZE, JobPaths, flags
from bench.measure import StepTrace
from bench.peers.jobs import Member, MemberJob, MemberPoint, NvrxLauncherJob
from bench.peers.settings import (
    NVRX_DIST,
    TORCHFT_DIST,
    NvrxInprocessSettings,
    NvrxSettings,
    TorchftSettings,
    version,
)
from bench.registry import SCENARIOS, runs
from bench.scenarios import CRASH, HANG, crash_under_agent, hang_under_agent, recovery_metrics
from bench.systems import PEER_SYSTEMS, Measured, System
from bench.torchrun import Rendezvous
from lazarus.domain.ports import free_port

PEERS_DIR = REPO / "bench" / "peers"
INSTALL_HINT = "run `make bench-peers` (the `peers` extra and infra/install_nvrx.py)"
NVRX_UP = re.compile(r"^nvrx iteration (?P<gen>\d+) rank")
TORCHFT_UP = re.compile(r"^torchft replica \d+ up")
INPROCESS_DETECTION = re.compile(r"RankShouldRestart|SOFT_TIMEOUT|HARD_TIMEOUT")
"""NVRx's own line once a rank's function is interrupted for a restart."""
TORCHFT_DETECTION = re.compile(r"got exception|[Tt]imed out")
"""torchft's line once a collective of the step failed (the peer is gone or silent)."""
FAILED_EXIT = re.compile(r"^(?:\[rank\d+\]: )*\w*Error: ")
"""The last line of a Python traceback (``ValueError: ...``), behind torch's rank prefixes."""
NO_HANG_REPLACEMENT = (
    "a hung group is never killed or replaced: the survivor trains on alone until the "
    "end, and the job never returns to full world size"
)
NO_REJOIN = (
    "the restarted group was not back before the survivor finished (torch's start-up "
    "outlasted the rest of the job): it then formed a quorum alone and trained from step 0"
)
TORCHFT_WEIGHTS = (
    "weights differ by design: with min_replicas 1 the survivor trains alone while the "
    "failed group is away (averaging one replica's gradients), which a fault-free run "
    "never does; min_replicas 2 would keep them equal but stop the survivors too"
)


def require(dist: str) -> None:
    if version(dist) is None:
        raise RuntimeError(f"{dist} is not installed: {INSTALL_HINT}")


# --------------------------------------------------------------------------- nvrx


@asynccontextmanager
async def nvrx_launcher(
    ctx: BenchContext,
    scenario: str,
    repeat: int,
    rendezvous: Rendezvous | None = None,
    nproc: int = WORLD_SIZE,
    max_restarts: int | None = None,
) -> AsyncIterator[TorchrunRun]:
    """The example under ``ft_launcher``; every process it started is killed on exit.
    With ``rendezvous`` (multi-node) no agent is started here: the scenario starts one
    per host, ``nproc`` ranks each (:meth:`bench.torchrun.TorchrunJob.start_agent`).
    ``max_restarts``: the launcher's restart budget (default :class:`NvrxSettings`')."""
    require(NVRX_DIST)
    paths = ctx._paths("nvrx", scenario, repeat)
    settings = NvrxSettings.for_shape(ctx.shape)
    if max_restarts is not None:
        settings = replace(settings, max_restarts=max_restarts)
    job = NvrxLauncherJob(
        example_args=ctx.example_args(paths),
        log_path=paths.root / "ft_launcher.log",
        setup="best" if settings.unshared_store else "default",
        nproc=nproc,
        max_restarts=settings.max_restarts,
        monitor_interval_s=settings.monitor_interval_s,
        extra_env=dict(RANK_ENV),
        rendezvous=rendezvous,
        settings=settings,
    )
    async with ctx.watch(job, start=rendezvous is None):
        yield TorchrunRun(job, paths)


@runs(CRASH, "nvrx")
async def crash_nvrx(ctx: BenchContext, repeat: int) -> Measured:
    async with nvrx_launcher(ctx, "crash", repeat) as run:
        return await crash_under_agent(ctx, run, ctx.shape.job_timeout_s)


@runs(HANG, "nvrx")
async def hang_nvrx(ctx: BenchContext, repeat: int) -> Measured:
    settings = NvrxSettings.for_shape(ctx.shape)
    bound = settings.rank_heartbeat_timeout_s + 60.0
    async with nvrx_launcher(ctx, "hang", repeat) as run:
        return await hang_under_agent(
            ctx,
            run,
            bound,
            f"the rank heartbeat timeout is {settings.rank_heartbeat_timeout_s:.0f} s",
        )


# --------------------------------------------------------------------------- member jobs


def member_job(
    ctx: BenchContext, system: str, members: list[Member], paths: JobPaths
) -> AbstractAsyncContextManager[MemberJob]:
    """``members`` started as one job, logged to ``<system>.log``, all killed on exit."""
    return ctx.watch(MemberJob(members, paths.root / f"{system}.log"))


async def reach(ctx: BenchContext, job: MemberJob, step: int) -> int:
    timeout = ctx.shape.job_timeout_s
    if not await wait_until(lambda: (job.max_step() or 0) >= step, timeout):
        raise TimeoutError(f"step {step} not reached in {timeout:.0f} s:\n{job.tail()}")
    return job.max_step() or step


def trace_of(job: MemberJob) -> StepTrace:
    trace = StepTrace(started_at=job.started_at)
    for p in job.snapshot():
        if p.committed:
            trace.add(p.t, p.generation, p.step)
    return trace


# --------------------------------------------------------------------------- nvrx in-process


def inprocess_members(
    ctx: BenchContext,
    paths: JobPaths,
    prefixes: Sequence[Sequence[str]] | None = None,
    active: int | None = None,
    master_addr: str = "127.0.0.1",
    env: dict[str, str] | None = None,
) -> list[Member]:
    """One process per rank plus the spares: ``settings.processes`` on this machine, or
    one per entry of ``prefixes`` (each runs its process inside a host), ``active`` of
    them training (default ``settings.active_world_size``)."""
    defaults = NvrxInprocessSettings.for_shape(ctx.shape)
    settings = replace(
        defaults,
        processes=len(prefixes) if prefixes is not None else defaults.processes,
        active_world_size=active or defaults.active_world_size,
    )
    where: Sequence[Sequence[str]] = prefixes or [()] * settings.processes
    args = ctx.example_args(paths)[1:]
    shared = {
        **RANK_ENV,
        "WORLD_SIZE": str(settings.processes),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(free_port()),
        "BENCH_NVRX_INPROCESS": json.dumps(
            {k: v for k, v in vars(settings).items() if not isinstance(v, str)}
        ),
        **(env or {}),
    }
    script = str(PEERS_DIR / "nvrx_inprocess_train.py")
    return [
        Member(
            f"rank{rank}",
            [*prefix, sys.executable, "-u", script, *args],
            {**shared, "RANK": str(rank)},
            up_line=NVRX_UP,
        )
        for rank, prefix in enumerate(where)
    ]


@dataclass(frozen=True)
class InprocessFault:
    """A fault to NVRx's in-process job and what its measure needs."""

    victims: list[str]
    """The members it takes out: the rest must finish."""
    inject: Callable[[MemberJob], Awaitable[None]]
    bound_s: float
    """How long a restart iteration's first step may take."""
    why_not: str
    """The note when no restart iteration began."""
    world_size: int = WORLD_SIZE
    """The reference's world size (the active ranks)."""


async def inprocess_run(
    ctx: BenchContext,
    repeat: int,
    scenario: str,
    paths: JobPaths,
    members: list[Member],
    fault: InprocessFault,
) -> Measured:
    """Run the in-process job, ``fault`` at the fault step; fault to the first step of
    a later restart iteration, steps lost, the weights of the finished job."""
    async with member_job(ctx, "nvrx_inprocess", members, paths) as job:
        step = await reach(ctx, job, ctx.shape.fault_step)
        generation = job.generation(members[0].name)
        fault_at = time.time()
        await fault.inject(job)
        recovered = await wait_until(
            lambda: trace_of(job).first_of_later_generation(generation, fault_at) is not None,
            fault.bound_s,
        )
        detected = job.line_after(INPROCESS_DETECTION, fault_at)
        metrics: dict[str, Metric] = {
            "fault_step": step,
            "detected": detected is not None,
            "detection_from_injection_s": detected - fault_at if detected is not None else None,
        }
        if not recovered:
            metrics |= {
                **recovery_metrics(trace_of(job), fault_at, generation, None),
                "completed": False,
                "weights_ok": False,
            }
            note = f"not recovered within {fault.bound_s:.0f} s: {fault.why_not}"
            return Measured(metrics, {"tail": job.tail()}, note=note)
        others = [m.name for m in members if m.name not in fault.victims]

        def failed() -> bool:
            return any(job.returncode(n) not in (None, 0) for n in others)

        # One survivor failing leaves the rest waiting on it in the Wrapper's barriers.
        ended = await wait_until(lambda: job.exited(others) or failed(), ctx.shape.job_timeout_s)
        first = trace_of(job).first_of_later_generation(generation, fault_at)
        resumed = job.resumed_from.get(first.generation) if first is not None else None
        completed = ended and not failed()
        # The job's weights are rank 0's last save, written when training ended, before
        # the Wrapper's own shutdown: checked even when that shutdown failed.
        weights_ok = paths.weights.exists() and await ctx.weights_ok(
            paths.weights, world_size=fault.world_size
        )
        metrics |= {
            **recovery_metrics(trace_of(job), fault_at, generation, None, resumed),
            "completed": completed,
            "weights_ok": weights_ok,
            "wall_s": time.time() - job.started_at,
            "generations": max(job.generations.values(), default=1),
        }
        error = job.line_after(FAILED_EXIT, fault_at)
        ending = None if completed else job.last_line(FAILED_EXIT)
    details = {} if error is None else {"tail": job.tail()}
    ended_note = None if completed else f"a surviving process did not exit 0: {ending}"
    return Measured(metrics, details, note=ended_note)


async def _inprocess_fault(
    ctx: BenchContext, repeat: int, scenario: str, rank: int, sig: signal.Signals
) -> Measured:
    require(NVRX_DIST)
    paths = ctx._paths("nvrx-inprocess", scenario, repeat)
    settings = NvrxInprocessSettings.for_shape(ctx.shape)
    victim = f"rank{rank}"

    async def inject(job: MemberJob) -> None:
        job.signal_member(victim, sig)

    fault = InprocessFault(
        victims=[victim],
        inject=inject,
        bound_s=ctx.shape.job_timeout_s
        if sig == signal.SIGKILL
        else settings.hard_timeout_s + 60.0,
        why_not=(
            "no restart iteration began; rank 0 hosts the Wrapper's store and the "
            "job's, so while it is stopped (or once killed) every other rank waits on it"
            if rank == 0
            else "no restart iteration"
        ),
    )
    return await inprocess_run(ctx, repeat, scenario, paths, inprocess_members(ctx, paths), fault)


@runs(CRASH, "nvrx_inprocess")
async def crash_nvrx_inprocess(ctx: BenchContext, repeat: int) -> Measured:
    return await _inprocess_fault(ctx, repeat, "crash", 1, signal.SIGKILL)


@runs(HANG, "nvrx_inprocess")
async def hang_nvrx_inprocess(ctx: BenchContext, repeat: int) -> Measured:
    return await _inprocess_fault(ctx, repeat, "hang", 0, signal.SIGSTOP)


# --------------------------------------------------------------------------- torchft


def torchft_members(
    ctx: BenchContext, paths: JobPaths, max_restarts: int | None = None
) -> list[Member]:
    """The Lighthouse and one group per replica, all on this machine; ``max_restarts``:
    each group's torchrun restart budget (default :class:`TorchftSettings`')."""
    settings = TorchftSettings.for_shape(ctx.shape)
    if max_restarts is not None:
        settings = replace(settings, max_restarts=max_restarts)
    lighthouse_port = free_port()
    url = f"http://127.0.0.1:{lighthouse_port}"
    script = torchft_script(ctx, paths, settings)
    groups = [
        torchft_group(f"group{group}", group, script, url, settings)
        for group in range(settings.groups)
    ]
    return [torchft_lighthouse(settings, f"127.0.0.1:{lighthouse_port}"), *groups]


def torchft_lighthouse(settings: TorchftSettings, bind: str, prefix: Sequence[str] = ()) -> Member:
    """The Lighthouse serving ``bind`` (``host:port``); ``prefix``: runs it inside a host."""
    argv = [_bin("torchft_lighthouse"), "--bind", bind, *settings.lighthouse_flags()]
    return Member("lighthouse", [*prefix, *argv], {})


def torchft_script(ctx: BenchContext, paths: JobPaths, settings: TorchftSettings) -> list[str]:
    """``torchft_train.py`` with the job's shape and the settings (every group's)."""
    shape = ctx.shape
    return [
        str(PEERS_DIR / "torchft_train.py"),
        *flags(
            steps=shape.steps,
            step_time=shape.step_time_s,
            ckpt_every=shape.ckpt_every,
            out=paths.weights,
            checkpoint_dir=paths.checkpoints,
            timeout_s=settings.timeout_s,
            quorum_timeout_s=settings.quorum_timeout_s,
            min_replica_size=settings.min_replicas,
            start_together=paths.root / "started",
            groups=settings.groups,
        ),
    ]


def torchft_group(
    name: str,
    group: int,
    script: list[str],
    lighthouse_url: str,
    settings: TorchftSettings,
    prefix: Sequence[str] = (),
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Member:
    """Replica group ``group`` under its own torchrun; ``prefix`` runs it inside a host,
    ``extra_args`` go to the script, ``env`` over the group's own."""
    argv = [
        sys.executable,
        "-u",
        "-m",
        "torch.distributed.run",
        "--standalone",
        *flags(
            nproc_per_node=1,
            max_restarts=settings.max_restarts,
            monitor_interval=settings.monitor_interval_s,
        ),
        *script,
        *extra_args,
    ]
    return Member(
        name,
        [*prefix, *argv],
        {
            **RANK_ENV,
            "REPLICA_GROUP_ID": str(group),
            "TORCHFT_LIGHTHOUSE": lighthouse_url,
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            **(env or {}),
        },
        up_line=TORCHFT_UP,
        rank_is_child=True,
    )


def _bin(name: str) -> str:
    """A console script of this interpreter's environment (else on the PATH)."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or name)


def torchft_figures(
    job: MemberJob,
    victim: str,
    survivor: str,
    fault_at: float,
    max_before: int,
    generation: int,
    replacement: str | None = None,
) -> dict[str, Metric]:
    """The figures of a fault to ``victim``; it is back in the job once it (a later
    generation) or its ``replacement`` (another member: a group started elsewhere)
    commits a step past the fault."""
    points = job.snapshot()
    after = [p for p in points if p.t >= fault_at]
    survivor_first = _first(
        [p for p in after if p.member == survivor and p.committed and p.step > max_before]
    )
    # Back in the job: a step of the restarted group past the fault, so healed from a
    # live peer (one that comes back after the survivor has finished starts alone
    # from step 0: that is no rejoin).
    rejoined = _first(
        [
            p
            for p in after
            if p.committed and p.step > max_before
            if (p.member == victim and p.generation > generation) or p.member == replacement
        ]
    )
    discarded = {p.step for p in after if not p.committed}
    redone = max(0, max_before - (survivor_first.step - 1)) if survivor_first else 0
    detected = job.line_after(TORCHFT_DETECTION, fault_at)
    return {
        "detected": detected is not None,
        "detection_from_injection_s": detected - fault_at if detected is not None else None,
        "survivors_first_step_s": survivor_first.t - fault_at if survivor_first else None,
        "recovered": rejoined is not None,
        "recovery_outside_s": rejoined.t - fault_at if rejoined else None,
        "steps_lost": len(discarded) + redone if survivor_first else None,
    }


def _first(points: list[MemberPoint]) -> MemberPoint | None:
    return min(points, key=lambda p: p.t) if points else None


@dataclass(frozen=True)
class TorchftFault:
    """A fault to one of torchft's replica groups and what its measure needs."""

    victim: str
    survivor: str
    inject: Callable[[MemberJob], Awaitable[None]]
    finish: list[str]
    """The groups that must exit 0 for the job to count as completed."""
    why_not: str
    """The note when neither the victim nor ``replacement`` commits a step past the fault."""
    wait_for: list[str] | None = None
    """The groups the run waits on (default ``finish``): a hung group never exits."""
    replacement: str | None = None
    """A group started elsewhere in the victim's place (node loss)."""


async def torchft_run(
    ctx: BenchContext,
    repeat: int,
    scenario: str,
    paths: JobPaths,
    members: list[Member],
    fault: TorchftFault,
) -> Measured:
    """Run torchft's job, ``fault`` at the fault step; :func:`torchft_figures` and the
    finished job's weights. The fault is dated before it is injected, as in
    :func:`inprocess_run` (a host kill takes a while; a signal does not)."""
    async with member_job(ctx, "torchft", members, paths) as job:
        step = await reach(ctx, job, ctx.shape.fault_step)
        generation = job.generation(fault.victim)
        fault_at = time.time()
        await fault.inject(job)
        max_before = job.max_step(before=fault_at) or step
        waiting = fault.wait_for or fault.finish
        exited = await wait_until(lambda: job.exited(waiting), ctx.shape.job_timeout_s)
        ended = time.time() if exited else None
        figures = torchft_figures(
            job, fault.victim, fault.survivor, fault_at, max_before, generation, fault.replacement
        )
        completed = ended is not None and all(job.returncode(g) == 0 for g in fault.finish)
        weights_ok = completed and await ctx.weights_ok(paths.weights)
        metrics: dict[str, Metric] = {
            "fault_step": step,
            **figures,
            "completed": completed,
            "weights_ok": weights_ok,
            "wall_s": (ended or time.time()) - job.started_at,
        }
        tail = job.tail()
    notes = [] if figures["recovered"] else [fault.why_not]
    if completed and not weights_ok:
        notes.append(TORCHFT_WEIGHTS)
    details = {"settings_note": TORCHFT_WEIGHTS, **({} if figures["recovered"] else {"tail": tail})}
    return Measured(metrics, details, note="; ".join(notes) or None)


async def _torchft_fault(
    ctx: BenchContext, repeat: int, scenario: str, group: int, sig: signal.Signals
) -> Measured:
    require(TORCHFT_DIST)
    paths = ctx._paths("torchft", scenario, repeat)
    members = torchft_members(ctx, paths)
    groups = [m.name for m in members if m.name.startswith("group")]
    victim = f"group{group}"
    survivor = next(g for g in groups if g != victim)

    async def inject(job: MemberJob) -> None:
        job.signal_member(victim, sig)

    hang = sig == signal.SIGSTOP
    fault = TorchftFault(
        victim,
        survivor,
        inject,
        finish=groups,
        why_not=NO_HANG_REPLACEMENT if hang else NO_REJOIN,
        wait_for=[survivor] if hang else None,
    )
    return await torchft_run(ctx, repeat, scenario, paths, members, fault)


@runs(CRASH, "torchft")
async def crash_torchft(ctx: BenchContext, repeat: int) -> Measured:
    return await _torchft_fault(ctx, repeat, "crash", 1, signal.SIGKILL)


@runs(HANG, "torchft")
async def hang_torchft(ctx: BenchContext, repeat: int) -> Measured:
    return await _torchft_fault(ctx, repeat, "hang", 0, signal.SIGSTOP)


# --------------------------------------------------------------------------- the rest

NOT_RUN: dict[str, dict[System, str]] = {
    "node_loss": {
        system: "not measured on this 3 x 1 layout: the peers' node loss is measured side "
        "by side with Lazarus and torchrun on 2 hosts x 2 ranks in multinode_node_loss"
        for system in PEER_SYSTEMS
    },
    "multinode_crash": {
        system: "not measured: the peers' crash runs on one host (crash); their multi-node "
        "run is multinode_node_loss"
        for system in PEER_SYSTEMS
    },
    "pause_resume": {
        system: "not possible: the peer has no pause; stopping it ends the job"
        for system in PEER_SYSTEMS
    },
    "controller_crash": {
        "nvrx": "not measured: SIGKILLing ft_launcher orphans its ranks as torchrun's do",
        "nvrx_inprocess": "not possible: there is no controller process apart from the ranks",
        "torchft": "not measured: the Lighthouse's own loss (survivors cannot form quorums)",
    },
    "straggler": {
        "nvrx": "not measured: NVRx straggler detection needs CUDA",
        "nvrx_inprocess": "not measured: NVRx straggler detection needs CUDA",
        "torchft": "not possible: torchft has no straggler detection",
    },
    "clean": {
        system: "not measured yet: the peers run the fault scenarios only (no "
        "fault-free baseline, so no wall_vs_clean)"
        for system in PEER_SYSTEMS
    },
}
"""Why a peer does not run a scenario of ``compare`` (reported in every table)."""


def mark_not_run() -> None:
    """File :data:`NOT_RUN` with the scenarios (:mod:`bench.catalog` calls it once
    every scenario module is imported)."""
    for name, reasons in NOT_RUN.items():
        if name in SCENARIOS:
            for system, reason in reasons.items():
                SCENARIOS[name].not_possible.setdefault(system, reason)
