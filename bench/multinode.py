"""What the multi-node scenarios share: real SSH test hosts, ssh job specs, measuring
an SSH poll, and the controller worker's CPU time.

The hosts are :class:`infra.testhosts.TestHosts`: one network namespace per host,
each running its own sshd, reachable from the controller (which stays in the root
namespace) across a bridge, each with its own ``/dev/shm`` (a private tmpfs that a
killed host loses, so the memory tier is measured as on real nodes). They share
this machine's filesystem and PID space, so a job's run directory (and the monitor
reading it) is the same on every node, exactly as the product expects of nodes with
a shared or synced training tree.
They need root with CAP_NET_ADMIN and CAP_SYS_ADMIN, ``ip`` and ``sshd``:
:func:`netns_unavailable_reason` says what is missing, and the scenarios are then
skipped with that reason in the results.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from activities.nodes.agent import NodeAgent, NodeStatus
from activities.nodes.factory import agents, on_each
from activities.nodes.node_records import RankLaunch
from activities.nodes.rundir import GenerationDir, write_json_atomic
from bench.harness import BenchContext
from bench.jobs import JobPaths, JobShape, build_spec
from infra.testhost_network import nameservers, unavailable_reason
from infra.testhosts import TestHosts
from lazarus.domain.contracts import NodeAccess
from lazarus.domain.spec import JobSpec, NodeSpec, SSHSpec


# Capability bits from <linux/capability.h>.
@functools.cache
def netns_unavailable_reason() -> str | None:
    """Why SSH test hosts cannot run on this machine, or None when they can."""
    reason = unavailable_reason()
    return None if reason is None else f"SSH test hosts (network namespaces) unavailable: {reason}"


def node_specs(hosts: TestHosts) -> list[NodeSpec]:
    """The test hosts as ssh nodes whose Python is this venv's (the hosts share this
    machine's filesystem): a node's own work (a replica's restore) runs on the node's
    interpreter, ``python3`` on its PATH unless the node names one (issue 39), and the
    system's has no Lazarus; the ranks get the venv first on their PATH, as a node
    whose environment has the job's venv."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return [
        NodeSpec(
            name=h.name,
            launcher="ssh",
            host=h.address,
            port=h.port,
            user=hosts.user,
            identity_file=str(hosts.identity_file),
            python=sys.executable,
            env={"PATH": path},
        )
        for h in hosts.hosts
    ]


def ssh_settings(shape: JobShape, hosts: TestHosts) -> SSHSpec:
    return SSHSpec(
        known_hosts=str(hosts.known_hosts),
        connect_timeout_s=shape.ssh_connect_timeout_s,
        command_timeout_s=shape.ssh_command_timeout_s,
    )


def ssh_spec(
    name: str,
    paths: JobPaths,
    shape: JobShape,
    hosts: TestHosts,
    nodes: int,
    spares: int = 0,
    steps: int | None = None,
    setup: Mapping[str, object] | None = None,
    nproc_per_node: int = 1,
) -> JobSpec:
    """The example with ``nproc_per_node`` ranks on each of the first ``nodes`` hosts
    and the next ``spares`` hosts held in reserve; gloo talks over the hosts' own
    interface. ``setup``: more top-level spec fields (a system's warm start and memory
    tier, a command line); its ``env`` is kept beside gloo's interface."""
    entries = [n.model_dump(mode="json") for n in node_specs(hosts)]
    if nodes + spares > len(entries):
        raise ValueError(f"{nodes} nodes + {spares} spares need more than {len(entries)} hosts")
    return build_spec(
        name,
        paths,
        shape,
        nproc_per_node=nproc_per_node,
        steps=steps,
        extra={
            **(setup or {}),
            "nodes": entries[:nodes],
            "spares": entries[nodes : nodes + spares],
            "env": {
                **dict((setup or {}).get("env") or {}),  # type: ignore[call-overload]
                "GLOO_SOCKET_IFNAME": hosts.hosts[0].interface,
            },
            "node_timeout_s": shape.node_timeout_s,
            "ssh": ssh_settings(shape, hosts).model_dump(mode="json"),
        },
    )


# --------------------------------------------------------------------------- statistics


def percentile(values: list[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * pct / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _ms(seconds: float) -> float:
    return seconds * 1000.0


# --------------------------------------------------------------------------- ssh polls


@dataclass
class PollResults:
    """Seconds, per poll; what :func:`measure_polls` saw."""

    first: dict[str, float]
    """Each node's first poll: SSH connect, key exchange and login included."""
    per_node: dict[str, list[float]]
    """Warm polls on the reused connection, node by node, one round per poll interval."""
    reported: list[float]
    """The agent's own ``round_trip_s`` for the same warm polls."""
    concurrent: list[float]
    """One poll of every node at once (``on_each``), wall time per round, one round
    per poll interval: what the supervisor does."""
    sequential: list[float]
    """The warm polls of one round added up: every node one after another."""
    back_to_back: list[float]
    """The first node polled again as soon as the previous poll returned."""
    interval_s: float
    """The pacing of the rounds (the spec's ``health.poll_interval_s``)."""
    failures: list[str]
    """Polls that were unreachable or did not see the idle rank alive."""

    def metrics(self) -> dict[str, float | int | bool]:
        out: dict[str, float | int | bool] = {
            "polls_per_node": min((len(v) for v in self.per_node.values()), default=0),
            "polls_ok": not self.failures,
            "first_poll_with_connect_ms": _ms(statistics.median(self.first.values())),
        }
        for node, samples in self.per_node.items():
            out[f"{node}_median_ms"] = _ms(statistics.median(samples))
            out[f"{node}_p95_ms"] = _ms(percentile(samples, 95))
        out["reported_round_trip_median_ms"] = _ms(statistics.median(self.reported))
        out["all_sequential_median_ms"] = _ms(statistics.median(self.sequential))
        out["all_concurrent_median_ms"] = _ms(statistics.median(self.concurrent))
        out["all_concurrent_p95_ms"] = _ms(percentile(self.concurrent, 95))
        out["back_to_back_median_ms"] = _ms(statistics.median(self.back_to_back))
        out["back_to_back_p95_ms"] = _ms(percentile(self.back_to_back, 95))
        return out


def _check(status: NodeStatus, rank: int, failures: list[str]) -> None:
    if not status.reachable:
        failures.append(f"{status.node}: unreachable: {status.error}")
    elif not any(r.rank == rank and r.alive for r in status.ranks):
        failures.append(f"{status.node}: rank {rank} not seen alive")


def measure_polls(
    hosts: TestHosts, shape: JobShape, run_root: Path, cancel: threading.Event | None = None
) -> PollResults:
    """Start one idle rank per host (``sleep``, with a heartbeat file like a training
    rank's), then time ``SSHAgent.poll`` of it: the first poll (connecting), then
    ``shape.ssh_polls`` rounds node by node on the reused connections, then as many
    rounds of every node at once, a round starting every poll interval as under
    supervision; and last, polls of one node back to back. Every rank is stopped
    before returning. Setting ``cancel`` ends it after the current poll (the hosts
    are about to be torn down: nothing is stopped then)."""
    cancel = cancel or threading.Event()

    def check_cancel() -> None:
        if cancel.is_set():
            raise RuntimeError("poll measurement cancelled")

    gen = GenerationDir.of(run_root, 1)
    sleep = shutil.which("sleep") or "/bin/sleep"
    workdir = run_root.parent
    rank_of: dict[str, int] = {h.name: i for i, h in enumerate(hosts.hosts)}
    failures: list[str] = []

    def start(agent: NodeAgent) -> None:
        rank = rank_of[agent.node.name]
        launch = RankLaunch(rank=rank, command=[sleep, "3600"], env={}, workdir=str(workdir))
        agent.start_ranks(str(gen.path), [launch])

    def timed_poll(agent: NodeAgent) -> tuple[float, NodeStatus]:
        rank = rank_of[agent.node.name]
        started = time.perf_counter()
        status = agent.poll(str(gen.path), [rank])
        return time.perf_counter() - started, status

    interval = float(shape.health.get("poll_interval_s", 0.5))

    def pace(round_started: float) -> None:
        time.sleep(max(0.0, round_started + interval - time.perf_counter()))

    workdir.mkdir(parents=True, exist_ok=True)
    with agents(NodeAccess(nodes=node_specs(hosts), ssh=ssh_settings(shape, hosts))) as opened:
        try:
            # Starting the ranks opens every connection; close them again, so that the
            # first poll below pays for a fresh connection as after a worker restart.
            on_each(opened, start)
            for agent in opened:
                agent.close()
            for rank in rank_of.values():
                write_json_atomic(
                    gen.heartbeat_file(rank),
                    {"step": 0, "time": time.time(), "pid": 0, "metrics": {"loss": 1.0}},
                )
            first: dict[str, float] = {}
            for agent in opened:
                elapsed, status = timed_poll(agent)
                _check(status, rank_of[agent.node.name], failures)
                first[agent.node.name] = elapsed
            per_node: dict[str, list[float]] = {a.node.name: [] for a in opened}
            reported: list[float] = []
            sequential: list[float] = []
            for _ in range(shape.ssh_polls):
                check_cancel()
                round_started = time.perf_counter()
                total = 0.0
                for agent in opened:
                    elapsed, status = timed_poll(agent)
                    _check(status, rank_of[agent.node.name], failures)
                    per_node[agent.node.name].append(elapsed)
                    reported.append(status.round_trip_s)
                    total += elapsed
                sequential.append(total)
                pace(round_started)
            concurrent: list[float] = []
            for _ in range(shape.ssh_polls):
                check_cancel()
                round_started = time.perf_counter()
                results = on_each(opened, timed_poll)
                concurrent.append(time.perf_counter() - round_started)
                for agent, (_, status) in zip(opened, results, strict=True):
                    _check(status, rank_of[agent.node.name], failures)
                pace(round_started)
            back_to_back: list[float] = []
            for _ in range(shape.ssh_polls):
                check_cancel()
                elapsed, status = timed_poll(opened[0])
                _check(status, rank_of[opened[0].node.name], failures)
                back_to_back.append(elapsed)
        finally:
            # Best effort: stopping the hosts kills whatever is left in their namespaces.
            if not cancel.is_set():
                with contextlib.suppress(Exception):
                    on_each(opened, lambda agent: agent.stop(str(run_root), None, 0.0))
    return PollResults(
        first, per_node, reported, concurrent, sequential, back_to_back, interval, failures
    )


# --------------------------------------------------------------------------- CPU time

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuSample:
    """A process's CPU time (every thread, user + system) at a moment."""

    pid: int
    start_ticks: int
    cpu_s: float
    at: float
    """``time.monotonic()``"""
    children_s: float = 0.0
    """cutime + cstime: the CPU of the children it has waited for (commands it ran)."""


def cpu_sample(pid: int) -> CpuSample:
    """From ``/proc/<pid>/stat``: utime and stime (fields 14 and 15), cutime and cstime
    (16 and 17), start time (22)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    own, children = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
    return CpuSample(
        pid, int(fields[19]), own / _CLOCK_TICKS, time.monotonic(), children / _CLOCK_TICKS
    )


def cpu_rate(first: CpuSample, last: CpuSample) -> float:
    """CPU seconds per wall second between two samples of the same process."""
    if (first.pid, first.start_ticks) != (last.pid, last.start_ticks):
        raise RuntimeError(f"the worker changed between samples ({first.pid} -> {last.pid})")
    return (last.cpu_s - first.cpu_s) / (last.at - first.at)


# --------------------------------------------------------------------------- lifecycle


def rig_details(hosts: TestHosts) -> dict[str, object]:
    """What the results should say about the test hosts a run used."""
    return {
        "hosts": {h.name: h.address for h in hosts.hosts},
        "namespaces": [h.netns for h in hosts.hosts],
        "private_dev_shm": True,
        "dns_fails_fast_for": nameservers(),
    }


@contextlib.asynccontextmanager
async def hosts_for_run(
    ctx: BenchContext, scenario: str, repeat: int, count: int
) -> AsyncIterator[TestHosts]:
    """Fresh hosts h1..h<count> for one run, stopped on exit whatever happened (and
    registered with the context, so the harness's cleanup stops them too)."""
    hosts = TestHosts(count, ctx.workdir / "hosts" / f"{scenario}-{repeat}")
    ctx.resources.append(hosts)
    try:
        await asyncio.to_thread(hosts.start)
        yield hosts
    finally:
        hosts.stop()  # synchronous: it must run even when the task is being cancelled
