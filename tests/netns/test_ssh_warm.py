"""Warm starts over ssh: real sshd hosts in network namespaces, the launcher itself
(no workflow), a torch-free stand-in rank and a light preload.

The shim starts each node's zygote detached, forks the ranks through it on the node,
falls back cold (with the reason) where the zygote is dead, and end-run stops every
node's zygote. The hosts share this machine's filesystem and pid space, so the
test reads the nodes' run directories and /proc directly."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from activities.launcher import launch_generation
from activities.nodes import zygote_client
from activities.nodes.procfs import is_alive, read_stat
from activities.nodes.zygote_socket import zygote_dir
from activities.stop import stop_generations
from infra.testhosts import TestHosts
from lazarus.domain.contracts import LaunchRequest, LaunchResult, NodeAccess, StopRequest
from lazarus.domain.spec import JobSpec, NodeSpec, parse_spec
from tests.netns.conftest import HostsFactory, ssh_nodes

FAKE_RANK = Path(__file__).resolve().parents[1] / "fixtures" / "fake_rank.py"
T = TypeVar("T")


def warm_spec(tmp_path: Path, hosts: TestHosts, preload: list[str]) -> JobSpec:
    nodes = ssh_nodes(hosts)
    return parse_spec(
        {
            "name": f"sshwarm-{os.getpid()}",
            "command": [sys.executable, str(FAKE_RANK)],
            "workdir": str(tmp_path),
            "nproc_per_node": 1,
            "nodes": nodes,
            "checkpoint_dir": str(tmp_path / "ckpt"),
            "run_dir": str(tmp_path / "runs"),
            "env": {"FAKE_STEPS": "100000", "FAKE_STEP_S": "0.1"},
            "ssh": {
                "known_hosts": str(hosts.known_hosts),
                "connect_timeout_s": 5,
                "command_timeout_s": 5,
            },
            "warm_start": {"preload": preload, "standby": 1},
        },
        "<test>",
    ).resolved(tmp_path)


def wait_for(predicate: Callable[[], T], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


def launch(spec: JobSpec, generation: int) -> LaunchResult:
    run_root = Path(spec.run_dir) / spec.job_id / "run-a"
    return launch_generation(
        LaunchRequest(spec=spec, generation=generation, run_root=str(run_root))
    )


def end_of_run(spec: JobSpec) -> None:
    run_root = Path(spec.run_dir) / spec.job_id / "run-a"
    asyncio.run(
        stop_generations(
            StopRequest(
                job_id=spec.job_id,
                run_root=str(run_root),
                access=NodeAccess.of(spec),
                grace_s=0,
                end_of_run=True,
            )
        )
    )


@pytest.fixture
def hosts(test_hosts: HostsFactory) -> TestHosts:
    return test_hosts(2)


@pytest.fixture
def spec(tmp_path: Path, hosts: TestHosts) -> Iterator[JobSpec]:
    """The job; teardown ends the run (ranks and zygotes) on every node, and checks
    that no zygote outlived it."""
    job = warm_spec(tmp_path, hosts, ["json"])
    yield job
    end_of_run(job)
    run_root = Path(job.run_dir) / job.job_id / "run-a"
    for node in job.nodes:
        info = zygote_client.read_zygote(zygote_dir(run_root, node.name))
        assert info is None or not is_alive(info.pid, info.start_ticks), node.name


def zygote_of(result: LaunchResult, node: NodeSpec) -> zygote_client.ZygoteInfo:
    info = zygote_client.read_zygote(zygote_dir(Path(result.run_dir).parent, node.name))
    assert info is not None, f"no zygote for {node.name}"
    return info


def idle_standbys(directory: Path) -> list[int]:
    return zygote_client.zygote_status(directory).idle_standby_pids


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def command_of(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.timeout(180)
def test_ssh_nodes_fork_warm_fall_back_cold_and_end_run_stops_the_zygotes(
    spec: JobSpec, hosts: TestHosts
) -> None:
    first = launch(spec, 1)
    assert first.warm_start is not None, first
    assert first.warm_start.warm_ranks == [0, 1], first.warm_start
    assert first.warm_start.fallback_reasons == []
    for node in spec.nodes:
        info = zygote_of(first, node)
        # Started on its node, through the shim: in that host's network namespace.
        assert info.pid in hosts.pids(node.name), node.name
        stat = read_stat(info.pid)
        assert stat is not None and stat.pgrp == info.pid, "the zygote leads its own session"
        assert b"sshd" not in command_of(parent_of(info.pid)), "never a child of the ssh session"
        assert b"FAKE_STEPS" not in command_of(info.pid), "no environment in argv"
    for rank in first.ranks:
        assert is_alive(rank.pid, rank.start_ticks)
        assert rank.pid in hosts.pids(rank.node)
    # Wait for both standbys to refill, so the next launch is warm everywhere.
    for node in spec.nodes:
        directory = zygote_dir(Path(first.run_dir).parent, node.name)
        wait_for(functools.partial(idle_standbys, directory), 30, "refill")

    # A killed zygote on h2: h2 starts cold with the reason, h1 stays warm.
    h2 = spec.nodes[1]
    dead = zygote_of(first, h2)
    os.kill(dead.pid, signal.SIGKILL)
    wait_for(lambda: not is_alive(dead.pid, dead.start_ticks), 10, "the zygote to die")
    second = launch(spec, 2)
    assert not any(is_alive(r.pid, r.start_ticks) for r in first.ranks), "gen 1 fenced"
    assert second.warm_start is not None
    assert second.warm_start.warm_ranks == [0] and second.warm_start.cold_ranks == [1]
    [reason] = second.warm_start.fallback_reasons
    assert reason.startswith("h2: ") and "dead" in reason and "restarted" in reason, reason
    assert all(is_alive(r.pid, r.start_ticks) for r in second.ranks)

    # Restarted by that launch: the next one is warm on both nodes again.
    restarted = zygote_dir(Path(first.run_dir).parent, h2.name)
    zygote_client.wait_serving(restarted, 60)
    third = launch(spec, 3)
    assert third.warm_start is not None and third.warm_start.warm_ranks == [0, 1], third
    assert third.warm_start.fallback_reasons == []

    # The end of the run stops both nodes' zygotes, through the shim.
    zygotes = [zygote_of(third, node) for node in spec.nodes]
    end_of_run(spec)
    for info in zygotes:
        assert not is_alive(info.pid, info.start_ticks)
    assert not any(is_alive(r.pid, r.start_ticks) for r in third.ranks)


@pytest.mark.timeout(120)
def test_a_failed_preload_on_ssh_nodes_starts_cold_and_says_why(
    tmp_path: Path, hosts: TestHosts
) -> None:
    spec = warm_spec(tmp_path, hosts, ["no_such_module_for_lazarus"])
    try:
        result = launch(spec, 1)
        assert result.warm_start is not None and result.warm_start.cold_ranks == [0, 1]
        assert len(result.warm_start.fallback_reasons) == 2
        for reason in result.warm_start.fallback_reasons:
            assert "preload failed" in reason and "no_such_module_for_lazarus" in reason
        assert all(is_alive(r.pid, r.start_ticks) for r in result.ranks)
    finally:
        end_of_run(spec)
