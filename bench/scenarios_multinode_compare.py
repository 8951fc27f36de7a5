"""Multi-node faults side by side: Lazarus and torchrun, the same job (2 hosts x 2 ranks,
the comparable command line) on the same SSH test hosts (:mod:`bench.multinode`), the
same fault at the same step, each in its best multi-node setup: Lazarus on ssh nodes
(warm start, memory tier, rejoin where the spec takes it:
:func:`bench.scenarios_multinode.ssh_builder` records which); torchrun with one agent
per host and c10d rendezvous, elastic with a standby for the node loss (the scenario
docs below). Skipped, with the reason in the results, without root, ``ip`` or ``sshd``.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from bench import multinode
from bench.harness import BenchContext, Metric, TorchrunRun, wait_until
from bench.jobs import REPO, JobShape
from bench.registry import runs, scenario
from bench.scenarios import (
    torchrun_end,
    torchrun_reach,
    torchrun_recovered,
    torchrun_recovery,
    unrecovered,
)
from bench.scenarios_multinode import Layout, run_node_loss, run_rank_crash
from bench.systems import Measured
from bench.torchrun import Rendezvous
from infra.testhosts import TestHosts

NODES, RANKS_PER_NODE = 2, 2
WORLD_SIZE = NODES * RANKS_PER_NODE
CRASH_RANK = 3
"""The rank SIGKILLed in the crash: under Lazarus on the second node (ranks 2 and 3
run on h2); under torchrun wherever the rendezvous placed it."""
VICTIM = "h2"
"""The host killed in the node loss: never the first, which serves torchrun's store."""
SPARE = "h3"
CRASH_LAYOUT = Layout(
    "multinode_crash",
    nodes=NODES,
    spares=0,
    nproc_per_node=RANKS_PER_NODE,
    victim=VICTIM,
    comparable=True,
)
NODE_LOSS_LAYOUT = replace(
    CRASH_LAYOUT,
    label="multinode_node_loss",
    spares=1,
    # Lazarus's best setting for a node loss: the lost node's memory snapshot also
    # lives on its buddy, so the spare resumes from it, not from disk. torchrun has
    # no counterpart and resumes from the newest disk checkpoint.
    replicas=True,
)
RDZV_PORT = 29400
"""The c10d store's port on the first host (each host has a network of its own)."""
ELASTIC_NNODES = f"1:{NODES}"
"""The node loss under torchrun: elastic, so the survivor may go on with the standby."""
KEEP_ALIVE_INTERVAL_S = 1
"""torchrun's rendezvous keep-alive: a node is dead after interval x attempts
without one (default 5 s x 3); set to the job's ``node_timeout_s`` (5 s: 1 s x 5)."""
STANDBY_JOIN = re.compile(r"Rendezvous'ing worker group")
"""The agent's INFO line as it goes to the rendezvous (the standby then waits, redundant)."""
STANDBY_SETTLE_S = 2.0
"""After the standby asked to join: two rendezvous syncs (1 s each) to be listed."""


MULTINODE_CRASH = scenario(
    "multinode_crash",
    f"""SIGKILL rank {CRASH_RANK} of a 2-node x 2-rank job on ssh test hosts, at the fault step.

    1. start 2 test hosts h1, h2 (network namespaces, each with its own sshd and
       /dev/shm); launch the example with 2 ranks on each (world size {WORLD_SIZE}):
       Lazarus over ssh; torchrun with one agent per host, c10d rendezvous on h1;
    2. once it reports ``shape.fault_step``: SIGKILL rank {CRASH_RANK};
    3. Lazarus: the rank's wrapper on h2 reports the death at the next poll, an
       incident opens, the generation restarts on both hosts (warm, from the memory
       tier; survivors rejoin in place where the spec takes rejoin on ssh nodes).
       torchrun: the failed rank's agent restarts its workers and re-rendezvouses,
       the other agent sees the new round and restarts its own; every rank resumes
       from the newest disk checkpoint;
    4. wait for the end; weights against a {WORLD_SIZE}-rank reference.
    """,
    unavailable=multinode.netns_unavailable_reason,
    references=lambda shape: [(WORLD_SIZE, shape.steps)],
)

MULTINODE_NODE_LOSS = scenario(
    "multinode_node_loss",
    f"""Kill host {VICTIM} of a 2-node x 2-rank job with one spare host, at the fault step.

    1. start 3 test hosts; launch the example with 2 ranks on h1 and h2, h3 the
       spare: Lazarus's ``spares``; torchrun's standby agent (elastic
       ``--nnodes {ELASTIC_NNODES}``, started once the first round formed, so it waits
       redundant), the keep-alive set to declare a silent node dead in
       ``node_timeout_s``;
    2. once it reports ``shape.fault_step`` (torchrun: and the standby asked to
       join): ``kill_host("{VICTIM}")``: link down, then SIGKILL everything there;
       the survivors block in a collective that never completes;
    3. Lazarus: polls of {VICTIM} fail until ``node_timeout_s``, a node_lost incident
       opens, the survivors are stopped and the job relaunches on h1 and {SPARE}
       (every rank warm: {SPARE}'s zygote was prewarmed with the run) from the newest
       memory snapshot, {VICTIM}'s slot from its replica on h1
       (``memory_replicas``). torchrun: {VICTIM}'s keep-alive lapses, the
       standby leaves the redundancy list for the wait list, the survivor's agent
       sees a node waiting and restarts its workers; the next round is h1 and
       {SPARE}, from the newest disk checkpoint;
    4. wait for the end; weights against a {WORLD_SIZE}-rank reference.
    """,
    unavailable=multinode.netns_unavailable_reason,
    references=lambda shape: [(WORLD_SIZE, shape.steps)],
)


# --------------------------------------------------------------------------- Lazarus


@runs(MULTINODE_CRASH, "lazarus")
async def multinode_crash_lazarus(ctx: BenchContext, repeat: int) -> Measured:
    # The best settings on ssh nodes: rejoin asked for by every setup that is not the
    # spec's defaults (the cold system stays cold).
    return await run_rank_crash(ctx, repeat, CRASH_LAYOUT, CRASH_RANK, ctx.setup.warm_start)


@runs(MULTINODE_NODE_LOSS, "lazarus")
async def multinode_node_loss_lazarus(ctx: BenchContext, repeat: int) -> Measured:
    return await run_node_loss(ctx, repeat, NODE_LOSS_LAYOUT, rejoin=ctx.setup.warm_start)


# --------------------------------------------------------------------------- torchrun


OpenRun = Callable[[str, int, Rendezvous], AbstractAsyncContextManager[TorchrunRun]]
"""Opens a multi-node job of a torchrun-like launcher (label, repeat, rendezvous) and
kills every process it started on exit; the agents are started by the caller."""


def torchrun_open(ctx: BenchContext) -> OpenRun:
    """torchrun's own: :meth:`BenchContext.torchrun` with ``RANKS_PER_NODE`` per agent."""
    return lambda label, repeat, rendezvous: ctx.torchrun(
        label, repeat, rendezvous=rendezvous, nproc=RANKS_PER_NODE
    )


@asynccontextmanager
async def _torchrun_on_hosts(
    ctx: BenchContext,
    hosts: TestHosts,
    label: str,
    repeat: int,
    rendezvous: Rendezvous,
    open_run: OpenRun | None = None,
) -> AsyncIterator[TorchrunRun]:
    """The example under torchrun (or ``open_run``'s launcher) with an agent on each of
    the first ``NODES`` hosts (the first serving the store); every process is killed
    on exit."""
    opened = (open_run or torchrun_open(ctx))(label, repeat, rendezvous)
    async with opened as run:
        # gloo over the hosts' own interface, as Lazarus's ssh spec sets it: the
        # hostname (shared by every test host) resolves to this machine's loopback.
        run.job.extra_env["GLOO_SOCKET_IFNAME"] = hosts.hosts[0].interface
        for index, host in enumerate(hosts.hosts[:NODES]):
            _start_agent(run, hosts, host.name, is_host=index == 0)
        yield run


def _start_agent(
    run: TorchrunRun, hosts: TestHosts, name: str, is_host: bool = False, gate: Path | None = None
) -> int:
    return run.job.start_agent(
        name,
        hosts.command_inside(name, str(REPO)),
        hosts.host(name).address,
        is_host=is_host,
        gate=gate,
    ).pid


def _rendezvous(hosts: TestHosts, nnodes: str, *conf: str) -> Rendezvous:
    return Rendezvous(
        endpoint=f"{hosts.hosts[0].address}:{RDZV_PORT}",
        run_id=f"bench-{uuid.uuid4().hex[:8]}",
        nnodes=nnodes,
        conf=conf,
    )


async def _finish_on_hosts(
    ctx: BenchContext, run: TorchrunRun, killed: str | None = None
) -> dict[str, Metric]:
    """Wait for every agent to exit; completed when each one not killed with its host
    exited 0; weights against the reference of the job's world size."""
    if not await wait_until(run.job.agents_exited, ctx.shape.job_timeout_s):
        raise TimeoutError(
            f"torchrun agents still running after {ctx.shape.job_timeout_s:.0f} s:\n"
            f"{run.job.tail()}"
        )
    ended = time.time()
    survivors = [a for a in run.job.agents if run.job.agent_hosts.get(a.pid) != killed]
    completed = bool(survivors) and all(a.returncode == 0 for a in survivors)
    weights_ok = completed and await ctx.weights_ok(run.weights, world_size=WORLD_SIZE)
    return torchrun_end(run, ended, completed, weights_ok, WORLD_SIZE)


@runs(MULTINODE_CRASH, "torchrun")
async def multinode_crash_torchrun(ctx: BenchContext, repeat: int) -> Measured:
    layout = CRASH_LAYOUT
    async with multinode.hosts_for_run(ctx, layout.label, repeat, count=layout.hosts) as hosts:
        rendezvous = _rendezvous(hosts, str(NODES))
        async with _torchrun_on_hosts(ctx, hosts, layout.label, repeat, rendezvous) as run:
            step = await torchrun_reach(ctx, run, ctx.shape.fault_step)
            generation = run.job.generation
            run.job.signal_rank(CRASH_RANK, signal.SIGKILL)
            fault_at = time.time()
            recovered = await torchrun_recovered(run, generation, fault_at, ctx.shape.job_timeout_s)
            metrics: dict[str, Metric] = {
                "fault_step": step,
                **torchrun_recovery(run, fault_at, generation),
            }
            if not recovered:
                return unrecovered(metrics, run, ctx.shape.job_timeout_s)
            metrics |= await _finish_on_hosts(ctx, run)
    details = {"rendezvous": _rendezvous_details(rendezvous), "rig": multinode.rig_details(hosts)}
    return Measured(metrics, details)


@dataclass(frozen=True)
class AgentNodeLoss:
    """How a launcher with one agent per host (torchrun, NVRx's ``ft_launcher``) runs
    the node loss: its elastic ``--nnodes``, its rendezvous settings, and the line its
    standby agent prints once it waits for a round (released after the first round
    formed, so that it is the spare that waits)."""

    nnodes: str
    conf: tuple[str, ...]
    standby_waits: re.Pattern[str]
    open_run: OpenRun | None = None
    """None: torchrun's (:func:`torchrun_open`)."""
    per_agent_line: bool = True
    """The standby's line carries its pid (torch's glog prefix); NVRx's lines do not."""


def torchrun_node_loss(shape: JobShape) -> AgentNodeLoss:
    attempts = max(1, round(shape.node_timeout_s / KEEP_ALIVE_INTERVAL_S))
    return AgentNodeLoss(
        nnodes=ELASTIC_NNODES,
        conf=(
            f"keep_alive_interval={KEEP_ALIVE_INTERVAL_S}",
            f"keep_alive_max_attempt={attempts}",
        ),
        standby_waits=STANDBY_JOIN,
    )


@runs(MULTINODE_NODE_LOSS, "torchrun")
async def multinode_node_loss_torchrun(ctx: BenchContext, repeat: int) -> Measured:
    return await node_loss_under_agents(ctx, repeat, torchrun_node_loss(ctx.shape))


async def node_loss_under_agents(ctx: BenchContext, repeat: int, how: AgentNodeLoss) -> Measured:
    """The node loss under a launcher with one agent per host: agents on h1 and h2, a
    standby on the spare released once the first round formed, ``kill_host`` of the
    victim at the fault step; fault to the first step of the next generation."""
    layout = NODE_LOSS_LAYOUT
    shape = ctx.shape
    async with multinode.hosts_for_run(ctx, layout.label, repeat, count=layout.hosts) as hosts:
        rendezvous = _rendezvous(hosts, how.nnodes, *how.conf)
        async with _torchrun_on_hosts(
            ctx, hosts, layout.label, repeat, rendezvous, how.open_run
        ) as run:
            # The standby starts with the others but is released only once the first
            # round formed (every rank running), so that it is the spare that waits.
            gate = run.paths.root / "standby-go"
            standby = _start_agent(run, hosts, SPARE, gate=gate)
            if not await wait_until(
                lambda: len(run.job.live_ranks()) >= WORLD_SIZE, shape.job_timeout_s
            ):
                raise TimeoutError(f"the first round never formed:\n{run.job.tail()}")
            standby_at = time.time()
            gate.touch()
            joining = (
                re.compile(rf" {standby} .*{how.standby_waits.pattern}")
                if how.per_agent_line
                else how.standby_waits
            )
            if not await wait_until(
                lambda: run.job.line_after(joining, standby_at) is not None,
                shape.job_timeout_s,
            ):
                raise TimeoutError(f"the standby never asked to join:\n{run.job.tail()}")
            await asyncio.sleep(STANDBY_SETTLE_S)
            step = await torchrun_reach(ctx, run, shape.fault_step)
            generation = run.job.generation
            killed_at = time.time()
            await asyncio.to_thread(hosts.kill_host, VICTIM)
            recovered = await torchrun_recovered(run, generation, killed_at, shape.job_timeout_s)
            later = [r for r in run.job.ranks if r.generation > generation]
            metrics: dict[str, Metric] = {
                "fault_step": step,
                "node_timeout_s": shape.node_timeout_s,
                **torchrun_recovery(run, killed_at, generation),
                "spare_used": any(run.job.agent_hosts.get(r.agent) == SPARE for r in later),
            }
            if not recovered:
                return unrecovered(metrics, run, shape.job_timeout_s)
            metrics |= await _finish_on_hosts(ctx, run, killed=VICTIM)
    details = {
        "rendezvous": _rendezvous_details(rendezvous),
        "standby_released_after_launch_s": standby_at - run.job.trace.started_at,
        "rig": multinode.rig_details(hosts),
    }
    return Measured(metrics, details)


def _rendezvous_details(rendezvous: Rendezvous) -> dict[str, object]:
    return {
        "backend": "c10d",
        "endpoint": rendezvous.endpoint,
        "nnodes": rendezvous.nnodes,
        "conf": list(rendezvous.conf),
        "nproc_per_node": RANKS_PER_NODE,
    }
