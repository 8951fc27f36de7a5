"""The supervisor's scale changes (issue 14 part 4): rounds that do not wait for a
silent node, unchanged ranks reused without going stale, and outcomes that keep
history small for large jobs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from activities.nodes.factory import agents
from activities.nodes.simulated.agent import SimulatedCluster, simulate
from activities.supervise import RANKS_IN_FULL, for_history
from activities.supervise_observer import GenerationObserver
from activities.supervise_rules import evaluate
from lazarus.domain.contracts import NodeAccess, RankStatus, SuperviseOutcome, SuperviseRequest
from lazarus.domain.spec import HealthSpec, NodeSpec

NAMES = ["n0", "n1", "n2"]


def _generation(tmp_path: Path, cluster: SimulatedCluster) -> SuperviseRequest:
    gen = tmp_path / "gen-00001"
    gen.mkdir()
    (gen / "launch.json").write_text(json.dumps({"launched_at": time.time()}))
    for index, name in enumerate(NAMES):
        cluster.start(str(gen), name, [2 * index, 2 * index + 1])
    return SuperviseRequest(
        job_id="scale",
        generation=1,
        run_dir=str(gen),
        world_size=2 * len(NAMES),
        nproc_per_node=2,
        health=HealthSpec(poll_interval_s=0.1),
        access=NodeAccess(nodes=[NodeSpec(name=name) for name in NAMES]),
        node_timeout_s=1,
    )


@pytest.mark.timeout(60)
def test_a_crash_is_seen_while_a_silent_nodes_poll_is_still_out(tmp_path: Path) -> None:
    # The silent node's poll blocks far longer than the test waits for the crash: a
    # round that waited for it could not report the crash in time.
    cluster = SimulatedCluster(NAMES, seconds_per_step=0.05, silent_poll_s=120.0)
    request = _generation(tmp_path, cluster)
    with simulate(cluster), agents(request.access) as opened:
        observer = GenerationObserver(request, opened)
        try:
            observer.observe()
            cluster.silence("n2")
            cluster.crash(request.run_dir, "n0", 1)
            deadline = time.monotonic() + 30
            outcome = None
            while outcome is None and time.monotonic() < deadline:
                obs = observer.observe()
                outcome = evaluate(request, obs, started_at=time.time())
            assert outcome is not None and outcome.failure is not None
            assert (outcome.failure.kind, outcome.failure.rank) == ("crash", 1)
            waiting = obs.nodes["n2"]
            assert waiting.waiting and waiting.reachable  # its last answer stands
        finally:
            observer.close()
            cluster.close()


@pytest.mark.timeout(60)
def test_a_silent_node_is_lost_after_two_verdicts_and_node_timeout(tmp_path: Path) -> None:
    cluster = SimulatedCluster(NAMES, seconds_per_step=0.05, silent_poll_s=0.2)
    request = _generation(tmp_path, cluster)
    with simulate(cluster), agents(request.access) as opened:
        observer = GenerationObserver(request, opened)
        try:
            observer.observe()
            silenced_at = cluster.silence("n1")
            deadline = time.monotonic() + 30
            outcome = None
            while outcome is None and time.monotonic() < deadline:
                outcome = evaluate(request, observer.observe(), started_at=time.time())
            assert outcome is not None and outcome.failure is not None
            assert (outcome.failure.kind, outcome.failure.node) == ("node_lost", "n1")
            # Silent since its last answer, which came before the silence: node_timeout_s
            # counts from there (as a keep-alive does), never from a later failed poll.
            assert outcome.failure.fault_at <= silenced_at
            assert outcome.failure.detected_at - outcome.failure.fault_at >= request.node_timeout_s
            assert cluster.polls("n1") >= 3  # the first answer, then two failed polls
        finally:
            observer.close()
            cluster.close()


@pytest.mark.timeout(60)
def test_an_unchanged_rank_after_a_silence_is_not_the_placeholder(tmp_path: Path) -> None:
    cluster = SimulatedCluster(NAMES, seconds_per_step=3600.0, silent_poll_s=0.0)
    request = _generation(tmp_path, cluster)
    with simulate(cluster), agents(request.access) as opened:
        observer = GenerationObserver(request, opened)
        try:
            before = {r.rank: r for r in observer.observe().ranks}
            cluster.silence("n1")
            unreachable = observer.observe()
            assert not unreachable.nodes["n1"].reachable
            cluster.heal("n1")
            after = {r.rank: r for r in observer.observe().ranks}
            # The same heartbeat as before the silence: the real status, not the
            # node-did-not-answer stand-in (pid 0, no step).
            assert after[2].pid == before[2].pid != 0
            assert after[2].step == before[2].step == 0
            assert after[2].last_progress_at == pytest.approx(before[2].last_progress_at)
        finally:
            observer.close()
            cluster.close()


def _outcome(ranks: list[RankStatus]) -> SuperviseOutcome:
    return SuperviseOutcome(kind="progress", generation=1, observed_at=0.0, ranks=ranks)


def test_small_jobs_keep_every_rank_in_history() -> None:
    ranks = [RankStatus(rank=i, pid=10 + i, alive=True) for i in range(RANKS_IN_FULL)]
    assert for_history(_outcome(ranks)).ranks == ranks


def test_large_jobs_keep_the_ranks_that_say_something() -> None:
    ranks = [RankStatus(rank=i, pid=10 + i, alive=i != 0) for i in range(RANKS_IN_FULL + 10)]
    ranks[7] = RankStatus(rank=7, pid=17, alive=False, exit_code=1)
    ranks[9] = RankStatus(rank=9, pid=19, alive=True, stopped_by_signal=True)
    kept = for_history(_outcome(ranks)).ranks
    # rank 0 (dead), the first live rank (1), the crashed one, the stopped one.
    assert [r.rank for r in kept] == [0, 1, 7, 9]
    assert any(r.alive for r in kept)
