"""The peers' node loss on the SSH test hosts (``multinode_node_loss``, issue 30 item 2).

The scenario is :mod:`bench.scenarios_multinode_compare`'s (h1, h2 the job, h3 the
spare; ``kill_host("h2")`` at the fault step), each peer in its best documented
multi-node setup: ``nvrx``, ``ft_launcher`` per host with ``--nnodes 2:3`` (h3 a hot
spare); ``torchft``, one replica group per host, and the bench as the scheduler that
starts a replacement group on h3 ``node_timeout_s`` after the kill; ``nvrx_inprocess``,
6 processes over 3 hosts, 4 active (``MaxActiveWorldSize(4)``, ``ShiftRanks``). The
setups and why: docs/results/2026-12-peers.md.
"""

from __future__ import annotations

import asyncio
import re
import time

from bench import multinode
from bench.harness import BenchContext
from bench.jobs import REPO
from bench.peers.jobs import Member, MemberJob
from bench.peers.scenarios import (
    InprocessFault,
    TorchftFault,
    inprocess_members,
    inprocess_run,
    nvrx_launcher,
    require,
    torchft_group,
    torchft_lighthouse,
    torchft_run,
    torchft_script,
)
from bench.peers.settings import NVRX_DIST, TORCHFT_DIST, NvrxSettings, TorchftSettings
from bench.registry import runs
from bench.scenarios_multinode_compare import (
    MULTINODE_NODE_LOSS,
    NODE_LOSS_LAYOUT,
    NODES,
    RANKS_PER_NODE,
    SPARE,
    VICTIM,
    AgentNodeLoss,
    node_loss_under_agents,
)
from bench.systems import Measured
from infra.testhosts import TestHosts

NVRX_STANDBY_WAITS = re.compile(
    r"attempts to join the next round|closed \(training in progress\)|Standby \(rank="
)
"""NVRx's line as an agent goes to the rendezvous; after the first round formed only
the hot spare prints it (then it waits, silently, for the next round to open)."""
LIGHTHOUSE_PORT = 29510
"""torchft's default Lighthouse port, on h1 (each host has a network of its own)."""


# --------------------------------------------------------------------------- nvrx


def nvrx_node_loss(ctx: BenchContext) -> AgentNodeLoss:
    settings = NvrxSettings.for_shape(ctx.shape)
    return AgentNodeLoss(
        nnodes=settings.node_loss_nnodes,
        conf=(f"last_call_timeout={settings.last_call_timeout_s}",),
        standby_waits=NVRX_STANDBY_WAITS,
        open_run=lambda label, repeat, rendezvous: nvrx_launcher(
            ctx, label, repeat, rendezvous, nproc=RANKS_PER_NODE
        ),
        per_agent_line=False,
    )


@runs(MULTINODE_NODE_LOSS, "nvrx")
async def multinode_node_loss_nvrx(ctx: BenchContext, repeat: int) -> Measured:
    return await node_loss_under_agents(ctx, repeat, nvrx_node_loss(ctx))


# --------------------------------------------------------------------------- torchft


def torchft_on_hosts(
    ctx: BenchContext, hosts: TestHosts, script: list[str], gate: str
) -> list[Member]:
    """The Lighthouse and group 0 on h1, group 1 on h2, its replacement (``spare``) on
    h3 held at ``gate``; gloo over the hosts' interface, each group advertising its
    host's address."""
    settings = TorchftSettings.for_shape(ctx.shape)
    first = hosts.hosts[0]
    url = f"http://{first.address}:{LIGHTHOUSE_PORT}"
    env = {"GLOO_SOCKET_IFNAME": first.interface}
    workdir = str(REPO)

    def group(name: str, replica: int, host: str, *extra: str) -> Member:
        return torchft_group(
            name,
            replica,
            script,
            url,
            settings,
            prefix=hosts.command_inside(host, workdir),
            extra_args=["--advertise", hosts.host(host).address, *extra],
            env=env,
        )

    lighthouse = torchft_lighthouse(
        settings,
        f"{first.address}:{LIGHTHOUSE_PORT}",
        prefix=hosts.command_inside(first.name, workdir),
    )
    groups = [group(f"group{i}", i, h.name) for i, h in enumerate(hosts.hosts[:NODES])]
    return [lighthouse, *groups, group("spare", 1, SPARE, "--wait-for", gate)]


@runs(MULTINODE_NODE_LOSS, "torchft")
async def multinode_node_loss_torchft(ctx: BenchContext, repeat: int) -> Measured:
    require(TORCHFT_DIST)
    layout = NODE_LOSS_LAYOUT
    shape = ctx.shape
    settings = TorchftSettings.for_shape(shape)
    released: dict[str, float] = {}
    async with multinode.hosts_for_run(ctx, layout.label, repeat, count=layout.hosts) as hosts:
        paths = ctx._paths("torchft", layout.label, repeat)
        gate = paths.root / "replace-go"
        members = torchft_on_hosts(ctx, hosts, torchft_script(ctx, paths, settings), str(gate))

        async def inject(_: MemberJob) -> None:
            killed_at = time.time()
            await asyncio.to_thread(hosts.kill_host, VICTIM)
            # The scheduler's detection: the node declared dead after node_timeout_s.
            await asyncio.sleep(max(0.0, killed_at + shape.node_timeout_s - time.time()))
            gate.touch()
            released["replacement_released_after_kill_s"] = time.time() - killed_at

        fault = TorchftFault(
            victim="group1",
            survivor="group0",
            inject=inject,
            finish=["group0", "spare"],
            why_not="the replacement group never committed a step",
            replacement="spare",
        )
        outcome = await torchft_run(ctx, repeat, layout.label, paths, members, fault)
    outcome.metrics |= {
        "node_timeout_s": shape.node_timeout_s,
        "spare_used": bool(outcome.metrics["recovered"]),
    }
    outcome.details |= {
        **released,
        "lighthouse": f"{hosts.hosts[0].address}:{LIGHTHOUSE_PORT}",
        "rig": multinode.rig_details(hosts),
    }
    return outcome


# --------------------------------------------------------------------------- nvrx in-process


@runs(MULTINODE_NODE_LOSS, "nvrx_inprocess")
async def multinode_node_loss_nvrx_inprocess(ctx: BenchContext, repeat: int) -> Measured:
    """Two processes per host on h1, h2 and h3 (world 6, 4 active: h3's two are the
    spares, ``MaxActiveWorldSize(4)``, ``ShiftRanks``); the Wrapper's and the job's
    stores on rank 0 (h1). Once h2 is killed the Wrapper misses its ranks' heartbeats,
    restarts in the four processes left, and h3's move into the gone ranks' places."""
    require(NVRX_DIST)
    layout = NODE_LOSS_LAYOUT
    async with multinode.hosts_for_run(ctx, layout.label, repeat, count=layout.hosts) as hosts:
        paths = ctx._paths("nvrx-inprocess", layout.label, repeat)
        places = [host for host in hosts.hosts for _ in range(RANKS_PER_NODE)]
        members = inprocess_members(
            ctx,
            paths,
            [hosts.command_inside(host.name, str(REPO)) for host in places],
            active=NODES * RANKS_PER_NODE,
            master_addr=hosts.hosts[0].address,
            env={"GLOO_SOCKET_IFNAME": hosts.hosts[0].interface},
        )
        on_victim = [m.name for m, host in zip(members, places, strict=True) if host.name == VICTIM]

        async def inject(_: MemberJob) -> None:
            await asyncio.to_thread(hosts.kill_host, VICTIM)

        fault = InprocessFault(
            victims=on_victim,
            inject=inject,
            bound_s=ctx.shape.job_timeout_s,
            why_not="no restart iteration after the node loss",
            world_size=NODES * RANKS_PER_NODE,
        )
        outcome = await inprocess_run(ctx, repeat, layout.label, paths, members, fault)
        outcome.details["rig"] = multinode.rig_details(hosts)
    return outcome
