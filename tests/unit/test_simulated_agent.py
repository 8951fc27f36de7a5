"""Simulated nodes (the scale bench's): faults as the supervisor would see them on
real nodes, and a substitution that only the process running the worker can make."""

from __future__ import annotations

import time

import pytest

from activities.nodes.factory import agent_for
from activities.nodes.local.agent import LocalAgent
from activities.nodes.simulated.agent import SimulatedAgent, SimulatedCluster, simulate
from lazarus.domain.spec import NodeSpec, SSHSpec

GEN = "/sim/run/gen-00001"


def _cluster(silent_poll_s: float = 0.05) -> SimulatedCluster:
    cluster = SimulatedCluster(["a", "b"], seconds_per_step=0.01, silent_poll_s=silent_poll_s)
    cluster.start(GEN, "a", [0, 1])
    cluster.start(GEN, "b", [2, 3])
    return cluster


@pytest.mark.timeout(30)
def test_ranks_run_and_a_crash_leaves_an_exit_record() -> None:
    cluster = _cluster()
    time.sleep(0.05)
    status = cluster.poll("a", GEN, [0, 1])
    assert status.reachable and all(r.alive for r in status.ranks)
    assert all(r.heartbeat is not None and r.heartbeat["step"] >= 1 for r in status.ranks)
    at = cluster.crash(GEN, "a", 1, exit_code=3)
    crashed = cluster.poll("a", GEN, [0, 1]).ranks[1]
    assert not crashed.alive
    assert crashed.exit == {"exit_code": 3, "signal": None, "ended_at": at}
    assert cluster.poll("a", GEN, [0, 1]).ranks[0].alive


@pytest.mark.timeout(30)
def test_a_silent_node_times_out_unreachable_until_healed() -> None:
    cluster = _cluster(silent_poll_s=0.2)
    cluster.silence("b")
    started = time.monotonic()
    status = cluster.poll("b", GEN, [2, 3])
    assert not status.reachable and status.ranks == []
    assert "silent" in (status.error or "")
    assert time.monotonic() - started >= 0.2  # it blocked like an SSH command timeout
    cluster.heal("b")
    assert cluster.poll("b", GEN, [2, 3]).reachable
    assert cluster.polls("b") == 2


@pytest.mark.timeout(30)
def test_stop_ends_every_generation_but_the_kept_one() -> None:
    cluster = _cluster()
    newer = "/sim/run/gen-00002"
    cluster.start(newer, "a", [0])
    agent = cluster.agent(NodeSpec(name="a"))
    result = agent.stop("/sim/run", keep_generation=2, grace_s=0)
    assert result.signalled_groups == 2
    assert not any(r.alive for r in cluster.poll("a", GEN, [0, 1]).ranks)
    assert cluster.poll("a", newer, [0]).ranks[0].alive


@pytest.mark.timeout(30)
def test_only_known_nodes_are_simulated_and_only_inside_the_block() -> None:
    cluster = _cluster()
    with simulate(cluster):
        assert isinstance(agent_for(NodeSpec(name="a"), SSHSpec()), SimulatedAgent)
        assert isinstance(agent_for(NodeSpec(name="other"), SSHSpec()), LocalAgent)
    assert isinstance(agent_for(NodeSpec(name="a"), SSHSpec()), LocalAgent)
