"""What the multi-node scenarios share: real SSH test hosts, ssh job specs, and a
process's CPU time (the controller worker's, torchrun's agent's).

The hosts (:class:`infra.testhosts.TestHosts`, described in
docs/results/2026-12-bench-notebook-3.md, "Multi-node figures") each have their own
``/dev/shm``, so a killed host's memory tier dies with it, as on a real node, and share
this machine's filesystem, as nodes with a shared training tree do. Without root,
``ip`` or ``sshd`` the scenarios are skipped with :func:`netns_unavailable_reason`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.harness import BenchContext
from bench.jobs import JobPaths, JobShape, build_spec
from bench.torchrun import CLOCK_TICKS
from infra.testhost_network import nameservers, unavailable_reason
from infra.testhosts import TestHosts
from lazarus.domain.spec import JobSpec, NodeSpec


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


def ssh_spec(
    name: str,
    paths: JobPaths,
    shape: JobShape,
    hosts: TestHosts,
    nodes: int,
    spares: int = 0,
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
        extra={
            **(setup or {}),
            "nodes": entries[:nodes],
            "spares": entries[nodes : nodes + spares],
            "env": {
                **dict((setup or {}).get("env") or {}),  # type: ignore[call-overload]
                "GLOO_SOCKET_IFNAME": hosts.hosts[0].interface,
            },
            "node_timeout_s": shape.node_timeout_s,
            "ssh": {
                "known_hosts": str(hosts.known_hosts),
                "connect_timeout_s": shape.ssh_connect_timeout_s,
                "command_timeout_s": shape.ssh_command_timeout_s,
            },
        },
    )


# --------------------------------------------------------------------------- CPU time


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
        pid, int(fields[19]), own / CLOCK_TICKS, time.monotonic(), children / CLOCK_TICKS
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
