"""Issue 37, N7: a rejoin's carry fences the older generation's other groups on each
node, and one that survives SIGKILL (uninterruptible sleep: a GPU after an Xid, a hung
mount) used to be only logged: the fresh rank started beside it. Without rejoin the
workflow's stop finds such ranks and never launches (``stuck_ranks``); a rejoin skips
that stop, so the launch must refuse in its place, before any rank starts.

Real processes (the torch-free stand-in rank on logical local nodes); the one thing
faked is the carry's answer that a group would not die, since putting a process in
state D needs root and a stuck device."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.launcher import RanksWouldNotDie, launch, launch_generation
from activities.nodes.local.agent import LocalAgent
from activities.nodes.node_records import CarryRequest, CarryResult
from activities.nodes.procfs import is_alive
from activities.nodes.rundir import GenerationDir
from infra import chaos
from lazarus.domain.contracts import LaunchRequest
from lazarus.domain.process_groups import UnkillableGroup
from lazarus.domain.spec import JobSpec
from tests.integration.test_rejoin_node_change import crash, job, on

pytestmark = pytest.mark.timeout(120)

__all__ = ["job"]  # the fixture, shared


def test_a_group_the_carry_could_not_kill_refuses_the_launch_before_any_rank_starts(
    job: JobSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = launch_generation(LaunchRequest(spec=job, generation=1, nodes=on(job, "a", "b", "c")))
    dead = crash(first, 1)
    stuck = UnkillableGroup(
        node="b", pgid=dead.pgid, pids=[dead.pid], reason="alive 2 s after SIGKILL (state D)"
    )
    carry = LocalAgent.carry_survivors

    def carry_meeting_a_stuck_rank(self: LocalAgent, request: CarryRequest) -> CarryResult:
        result = carry(self, request)
        if self.node.name != "b":
            return result
        return result.model_copy(update={"unkillable": [*result.unkillable, stuck]})

    monkeypatch.setattr(LocalAgent, "carry_survivors", carry_meeting_a_stuck_rank)
    again = LaunchRequest(spec=job, generation=2, nodes=on(job, "a", "b", "c"), rejoin_ranks=[0, 2])

    with pytest.raises(RanksWouldNotDie, match=rf"b: pgid {dead.pgid} .*state D"):
        launch_generation(again)

    gen = GenerationDir.of(Path(first.run_dir).parent, 2)
    assert not gen.pid_file(1).exists(), "no fresh rank 1 beside the stuck one"
    assert not gen.launch_file.exists()
    # The survivors alone: no rank of generation 2 was started.
    assert len(chaos.live_rank_processes(Path(job.run_dir) / "moved")) == 2
    # As the activity: non-retryable (a retry would meet the same process), naming b.
    with pytest.raises(ApplicationError) as refused:
        asyncio.run(ActivityEnvironment().run(launch, again))
    assert refused.value.type == "RanksWouldNotDie" and refused.value.non_retryable
    assert list(refused.value.details) == ["b"]
    assert all(is_alive(r.pid, r.start_ticks) for r in (first.ranks[0], first.ranks[2]))
