"""Issue 26: a dead rank is reported as soon as its exit record exists, and its end
wakes the supervisor instead of waiting for the next round.

No assertion here is about time: each checks *what* ended a wait or a round (a
pidfd that fired, an exit record that arrived), so the tests hold on a busy machine.
Waits are bounded generously only so that a broken notice fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.nodes.agent import NodeStatus, RankRecord
from activities.nodes.exit_watch import ExitWatch, recorded_processes
from activities.nodes.local.agent import LocalAgent
from activities.nodes.node_records import RankLaunch
from activities.nodes.procfs import read_stat, signal_group
from activities.supervise import until_an_exit
from activities.supervise_observer import GenerationObserver
from activities.supervise_rules import (
    VANISHED_GRACE_S,
    Observation,
    awaiting_exit_record,
    evaluate,
)
from lazarus.domain.contracts import RankStatus, SuperviseRequest
from lazarus.domain.spec import HealthSpec, NodeSpec
from tests.fake_nodes import FakeAgent, FakeClock

needs_pidfd = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd_open")

GUARD_S = 60.0
"""Only so that a notice that never comes fails the test instead of hanging it."""


def request(tmp_path: Path) -> SuperviseRequest:
    return SuperviseRequest.model_validate(
        {
            "job_id": "j",
            "generation": 1,
            "run_dir": str(tmp_path / "gen-00001"),
            "world_size": 2,
            "nproc_per_node": 2,
            "health": HealthSpec(hang_timeout_s=30, startup_timeout_s=60),
            "report_after_s": 1e9,
        }
    )


def status(records: list[RankRecord], at: float) -> NodeStatus:
    return NodeStatus(node="local", reachable=True, observed_at=at, ranks=records)


def live(rank: int) -> RankRecord:
    return RankRecord(rank=rank, pid=100 + rank, alive=True, heartbeat={"step": 5, "time": 1.0})


def test_a_crash_caught_before_its_exit_record_is_reported_when_the_record_lands(
    tmp_path: Path,
) -> None:
    """The cause of issue 26: the first poll saw rank 1 dead before its wrapper wrote
    the record; the next one found the record, yet the crash waited out the whole
    vanished-rank grace (1.5 s) before it was reported."""
    clock = FakeClock()
    agent = FakeAgent(NodeSpec())
    observer = GenerationObserver(request(tmp_path), [agent], clock=clock)
    dead = RankRecord(rank=1, pid=101, alive=False, heartbeat={"step": 5, "time": 1.0})
    agent.reply = status([live(0), dead], clock.wall())
    first = observer.observe()
    assert awaiting_exit_record(first)
    assert evaluate(request(tmp_path), first, started_at=clock.wall()) is None

    clock.advance(VANISHED_GRACE_S / 30)
    ended = {"exit_code": -9, "signal": "SIGKILL", "ended_at": clock.wall() - 0.01}
    agent.reply = status([live(0), dead.model_copy(update={"exit": ended})], clock.wall())
    second = observer.observe()
    assert not awaiting_exit_record(second)
    outcome = evaluate(request(tmp_path), second, started_at=clock.wall())
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "crash" and outcome.failure.rank == 1


def test_a_record_that_arrived_ends_the_wait_even_with_an_old_dead_since() -> None:
    """The pure rule, for observations restored from an older worker's memory."""
    ranks = [
        RankStatus(rank=0, pid=100, alive=True, step=5, last_progress_at=999.0),
        RankStatus(rank=1, pid=101, alive=False, exit_code=-9, signal="SIGKILL", ended_at=999.9),
    ]
    obs = Observation(now=1000.0, launched_at=900.0, ranks=ranks, dead_since={1: 999.95})
    assert not awaiting_exit_record(obs)
    outcome = evaluate(request(Path("/nonexistent")), obs, started_at=990.0)
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "crash"


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


def identity(pid: int) -> tuple[int, int]:
    stat = read_stat(pid)
    assert stat is not None
    return pid, stat.start_ticks


@needs_pidfd
@pytest.mark.slow  # starts a process
def test_a_pidfd_fires_when_its_process_ends_and_is_not_offered_again(
    sleeper: subprocess.Popen[bytes],
) -> None:
    watch = ExitWatch()
    watch.track([identity(sleeper.pid)])
    fds = watch.fds()
    assert len(fds) == 1
    assert select.select(fds, [], [], 0)[0] == []  # alive: nothing to say
    sleeper.kill()
    assert select.select(fds, [], [], GUARD_S)[0] == fds
    watch.ended(fds)
    assert watch.fds() == []
    watch.track([identity_or_gone(sleeper.pid)])
    assert watch.fds() == []
    watch.close()


def identity_or_gone(pid: int) -> tuple[int, int]:
    stat = read_stat(pid)
    return (pid, stat.start_ticks) if stat is not None else (pid, 0)


@needs_pidfd
@pytest.mark.slow  # starts a process
def test_a_pid_whose_start_ticks_differ_is_not_watched(
    sleeper: subprocess.Popen[bytes],
) -> None:
    """The pid file names another process (its pid was reused): never watch it."""
    pid, ticks = identity(sleeper.pid)
    watch = ExitWatch()
    watch.track([(pid, ticks + 1)])
    assert watch.fds() == []
    watch.close()


def test_a_pid_record_names_the_rank_and_its_recorder() -> None:
    record: dict[str, object] = {
        "pid": 4242,
        "start_ticks": 7,
        "wrapper_pid": 4241,
        "wrapper_start_ticks": 6,
    }
    assert recorded_processes(record) == [(4242, 7), (4241, 6)]
    assert recorded_processes({"pid": 4242, "start_ticks": 7}) == [(4242, 7)]
    assert recorded_processes({"pid": "x"}) == []


class NoticingAgent(FakeAgent):
    """A scripted agent whose exit notices are real pidfds."""

    def __init__(self, watch: ExitWatch) -> None:
        super().__init__(NodeSpec())
        self.watch = watch
        self.seen: list[int] = []

    def exit_fds(self) -> list[int]:
        return self.watch.fds()

    def exits_seen(self, fds: list[int]) -> None:
        self.seen.extend(fds)
        self.watch.ended(fds)


@needs_pidfd
@pytest.mark.slow  # starts a process
def test_the_supervisor_wakes_on_a_rank_exit_not_on_its_round(
    sleeper: subprocess.Popen[bytes],
) -> None:
    watch = ExitWatch()
    watch.track([identity(sleeper.pid)])
    agent = NoticingAgent(watch)
    (fd,) = watch.fds()

    async def scenario() -> None:
        waiting = asyncio.create_task(until_an_exit([agent], GUARD_S))
        await asyncio.sleep(0)
        sleeper.kill()
        await waiting

    asyncio.run(scenario())
    assert agent.seen == [fd]  # the exit ended the wait, and its pidfd was handed back
    assert watch.fds() == []
    watch.close()


def test_without_notices_the_wait_is_a_plain_sleep() -> None:
    agent = FakeAgent(NodeSpec())
    asyncio.run(until_an_exit([agent], 0.01))
    asyncio.run(until_an_exit([agent], 0.0))


@needs_pidfd
@pytest.mark.slow  # starts a process
def test_the_local_agent_watches_each_rank_and_its_wrapper(tmp_path: Path) -> None:
    """Through the real wrapper: both ends are watched (the rank's death, and the
    wrapper's exit right after it wrote the record), and a SIGKILLed rank's record is
    there once the wrapper's pidfd has fired."""
    agent = LocalAgent(NodeSpec())
    gen = tmp_path / "gen-00001"
    launch = RankLaunch(rank=0, command=["sleep", "600"], env=dict(os.environ), workdir=".")
    (started,) = agent.start_ranks(str(gen), [launch])
    try:
        assert agent.poll(str(gen), [0]).ranks[0].alive
        fds = agent.exit_fds()
        assert len(fds) == 2
        os.kill(started.pid, signal.SIGKILL)
        pending = list(fds)
        while pending:  # the rank's pidfd, then its wrapper's, once the record is written
            ready, _, _ = select.select(pending, [], [], GUARD_S)
            assert ready, "no exit notice"
            pending = [fd for fd in pending if fd not in ready]
        agent.exits_seen(fds)
        record = agent.poll(str(gen), [0]).ranks[0]
        assert record.exit is not None and record.exit["signal"] == "SIGKILL"
        assert agent.exit_fds() == []
    finally:
        signal_group(started.pgid, signal.SIGKILL)
        agent.close()
