"""A launch asked to carry survivors onto nodes other than the ones they ran on (issue
26; the audit of 2026-12-03, defect 11 and the "preflight swap" suspicion), with real
processes: a torch-free stand-in rank on logical local nodes.

- A carried rank with no slot in the new world (the pool shrank after the plan)
  refuses the launch with ``LaunchRefused`` naming it, before anything is fenced or
  started; the activity makes it non-retryable. It used to raise IndexError, which was
  retried five times and ended the job FAILED.
- A survivor whose slot now names another node (a spare swapped in after the plan)
  is not carried: it is fenced and its rank starts afresh on the new node.

The workflow no longer asks for either (tests/workflow/test_launch_order.py): this is
the launcher's own guard."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.launcher import LaunchRefused, launch, launch_generation
from activities.nodes.procfs import is_alive
from activities.nodes.rundir import GenerationDir
from activities.stop import stop_generations
from infra import chaos
from lazarus.domain.contracts import LaunchRequest, LaunchResult, RankProcess, StopRequest
from lazarus.domain.spec import JobSpec, NodeSpec, parse_spec
from tests.integration.test_rejoin_launch import FAKE_RANK, kill_and_wait

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[JobSpec]:
    spec = parse_spec(
        {
            "name": "moved",
            "command": [sys.executable, str(FAKE_RANK)],
            "nodes": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
            "spares": [{"name": "s"}],
            "min_nodes": 2,
            "checkpoint_dir": "ckpt",
            "env": {"FAKE_STEPS": "100000"},
            "rejoin": {"timeout_s": 45},
        },
        "<test>",
    ).resolved(tmp_path)
    yield spec
    asyncio.run(
        stop_generations(
            StopRequest(job_id=spec.job_id, run_root=str(Path(spec.run_dir) / "moved"), grace_s=0)
        )
    )


def on(job: JobSpec, *names: str) -> list[NodeSpec]:
    every = {n.name: n for n in (*job.nodes, *job.spares)}
    return [every[name] for name in names]


def crash(first: LaunchResult, rank: int) -> RankProcess:
    """SIGKILL one rank of ``first`` and wait for its wrapper's exit record."""
    dead = first.ranks[rank]
    kill_and_wait(dead.pid, dead.start_ticks)
    gen = GenerationDir.of(Path(first.run_dir).parent, first.generation)
    deadline = time.monotonic() + 30
    while not gen.exit_file(rank).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return dead


def test_a_carried_rank_outside_a_shrunk_world_refuses_the_launch(job: JobSpec) -> None:
    first = launch_generation(LaunchRequest(spec=job, generation=1, nodes=on(job, "a", "b", "c")))
    crash(first, 1)
    shrunk = LaunchRequest(spec=job, generation=2, nodes=on(job, "a", "c"), rejoin_ranks=[0, 2])

    with pytest.raises(LaunchRefused, match=r"rejoin: rank 2 cannot be carried into a world of 2"):
        launch_generation(shrunk)

    root = Path(first.run_dir).parent
    assert not GenerationDir.of(root, 2).path.exists(), "refused before anything was done"
    survivors = [first.ranks[0], first.ranks[2]]
    assert all(is_alive(r.pid, r.start_ticks) for r in survivors), "nothing was fenced"
    # As the activity: non-retryable, so LAUNCH_RETRY does not repeat it.
    with pytest.raises(ApplicationError) as refused:
        asyncio.run(ActivityEnvironment().run(launch, shrunk))
    assert refused.value.type == "LaunchRefused" and refused.value.non_retryable
    assert "rank 2" in str(refused.value)


def test_a_survivor_whose_node_left_the_pool_is_fenced_and_started_afresh(job: JobSpec) -> None:
    first = launch_generation(LaunchRequest(spec=job, generation=1, nodes=on(job, "a", "b", "c")))
    crash(first, 0)
    on_b, on_c = first.ranks[1], first.ranks[2]

    # The preflight swapped b for spare s after the plan kept ranks 1 (on b) and 2.
    second = launch_generation(
        LaunchRequest(spec=job, generation=2, nodes=on(job, "a", "s", "c"), rejoin_ranks=[1, 2])
    )

    assert second.rejoined == [2]
    assert second.rejoin_refused == ["rank 1: its node b left the pool (s took its slot)"]
    assert not is_alive(on_b.pid, on_b.start_ticks), "b's survivor is fenced"
    assert is_alive(on_c.pid, on_c.start_ticks), "c's survivor is carried"
    by_rank = {r.rank: r for r in second.ranks}
    assert by_rank[1].node == "s" and by_rank[1].pid != on_b.pid
    assert is_alive(by_rank[1].pid, by_rank[1].start_ticks)
    assert by_rank[2].pid == on_c.pid and by_rank[2].node == "c"
    assert len(chaos.live_rank_processes(Path(job.run_dir) / "moved")) == 3
