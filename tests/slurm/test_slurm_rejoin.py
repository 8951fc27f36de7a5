"""Rejoin on Slurm (issue 28, item 1), end to end on the test cluster: a warm job (ranks
forked from each node's zygote, which runs as a step of its own) with ``rejoin``; one
rank SIGKILLed; the other node's rank keeps its process and rejoins, only the killed
one is forked afresh, and the job ends with the weights of a fault-free run.

Why warm: a cold rank runs in its generation's step, which the next generation must
not outlive; a forked rank lives in the zygote's step, so it can be carried.

Both tests sample the fencing invariant throughout the recovery (never two live
processes of one rank). The twin without ``rejoin`` (``make test-all``) is the
baseline of the measurement in docs/guides/rejoin.md: each prints fault → first new
step with ``-s``."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from activities.nodes.rundir import read_json
from infra import chaos
from infra.slurm import TestSlurm
from lazarus.app.devserver import DevServer
from lazarus.domain.spec import JobSpec, WarmStartSpec
from lazarus.domain.spec_sections import RejoinSpec
from tests import tiers
from tests.e2e.conftest import Job, rank_fencing
from tests.reference_weights import shared_reference
from tests.slurm.test_slurm_e2e import (
    STEPS,
    all_generations,
    assert_weights,
    harness,
    kill_node_processes,
    reference,  # noqa: F401 - the module's fault-free weights fixture
    slurm_job_spec,
)
from workflows.state import Incident, JobStatus, Phase

pytestmark = pytest.mark.e2e


def warm_spec(
    tmp_path: Path,
    allocation: int,
    rejoin: bool,
    ranks_per_node: int = 1,
    node_loss: bool = False,
) -> JobSpec:
    """The module's job, warm, its script under ``run_resilient``; with or without
    ``rejoin`` (the measurement's twin restarts the whole generation)."""
    spec = slurm_job_spec(tmp_path, allocation, step_time=0.1)
    return spec.model_copy(
        update={
            "nproc_per_node": ranks_per_node,
            "command": [*spec.command, "--resilient", "--pg-timeout-s", "30"],
            "warm_start": WarmStartSpec(preload=["torch"], standby=1),
            "rejoin": RejoinSpec(enabled=True, timeout_s=45, node_loss=node_loss)
            if rejoin
            else None,
            "straggler": spec.straggler.model_copy(update={"enabled": False}),
        }
    )


def since_fault(incident: Incident) -> str:
    """The incident's phases, each as seconds after the fault, on one line."""
    phases = incident.timeline.durations() if incident.timeline is not None else []
    return ", ".join(f"{p.phase} +{p.since_fault_s:.2f} s" for p in phases)


async def crash_rank(job: Job, rank: int = 1) -> tuple[JobStatus, Incident]:
    """SIGKILL ``rank`` (on node n2) at step 25 and wait for the job: it succeeds after
    one crash of that rank, and no rank was ever alive in two processes at once. Prints
    fault → first new step (run with ``-s`` to see it)."""
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 25, 240.0)
    with rank_fencing(job) as twice:
        chaos.signal_rank(job.run_root, rank=rank, sig=signal.SIGKILL)
        status = await job.result(timeout_s=300)
    assert not any(twice), f"a rank alive twice: {[s for s in twice if s]}"
    assert status.phase == Phase.SUCCEEDED, status
    seen = [(i.kind, i.rank, i.restart_path, i.evidence) for i in status.incidents]
    assert len(status.incidents) == 1, seen
    [incident] = status.incidents
    assert incident.kind == "crash" and incident.rank == rank, incident
    print(
        f"slurm rank crash, rejoin={job.spec.rejoins is not None}: after the fault: "
        f"{since_fault(incident)}; restart_path={incident.restart_path}, "
        f"steps_lost={incident.steps_lost}"
    )
    return status, incident


@pytest.mark.timeout(500)
async def test_a_killed_rank_restarts_alone_and_the_other_node_rejoins_on_slurm(
    slurm: TestSlurm,
    allocation: int,
    dev_server: DevServer,
    tmp_path: Path,
    reference: Path,  # noqa: F811
) -> None:
    async with harness(dev_server, tmp_path, slurm) as h:
        job = await h.start(warm_spec(tmp_path, allocation, rejoin=True))
        await asyncio.to_thread(chaos.wait_for_step, job.run_root, 1, 240.0)
        [first] = all_generations(job)
        before = {r: (read_json(first.pid_file(r)) or {}).get("pid") for r in (0, 1)}
        _, incident = await crash_rank(job)
        assert incident.restart_path == "rejoin", incident.evidence
        _, second = all_generations(job)
        after = {r: (read_json(second.pid_file(r)) or {}).get("pid") for r in (0, 1)}
        assert after[0] == before[0], "rank 0 (node n1) kept its process"
        assert after[1] != before[1]
        for rank in (0, 1):
            assert "slurm_step" not in (read_json(second.pid_file(rank)) or {}), "forked"
        assert_weights(job, reference)


@tiers.twin_of(
    "test_a_killed_rank_restarts_alone_and_the_other_node_rejoins_on_slurm",
    "without rejoin (the whole generation restarts warm): the measurement's baseline",
)
@pytest.mark.timeout(500)
async def test_without_rejoin_the_whole_generation_restarts_warm_on_slurm(
    slurm: TestSlurm,
    allocation: int,
    dev_server: DevServer,
    tmp_path: Path,
    reference: Path,  # noqa: F811
) -> None:
    async with harness(dev_server, tmp_path, slurm) as h:
        job = await h.start(warm_spec(tmp_path, allocation, rejoin=False))
        await crash_rank(job)
        assert len(all_generations(job)) == 2
        assert_weights(job, reference)


@tiers.twin_of(
    "test_a_killed_rank_restarts_alone_and_the_other_node_rejoins_on_slurm",
    "with two ranks a node (the killed rank's node-mate is carried too)",
)
@pytest.mark.timeout(500)
async def test_with_two_ranks_a_node_only_the_killed_rank_restarts_on_slurm(
    slurm: TestSlurm,
    allocation: int,
    dev_server: DevServer,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    reference_4 = shared_reference(tmp_path_factory, STEPS, world_size=4)
    async with harness(dev_server, tmp_path, slurm) as h:
        job = await h.start(warm_spec(tmp_path, allocation, rejoin=True, ranks_per_node=2))
        await asyncio.to_thread(chaos.wait_for_step, job.run_root, 1, 240.0)
        [first] = all_generations(job)
        ranks = range(4)
        before = {r: (read_json(first.pid_file(r)) or {}).get("pid") for r in ranks}
        _, incident = await crash_rank(job, rank=3)  # n2's second rank
        assert incident.restart_path == "rejoin", incident.evidence
        _, second = all_generations(job)
        after = {r: (read_json(second.pid_file(r)) or {}).get("pid") for r in ranks}
        assert [after[r] == before[r] for r in ranks] == [True, True, True, False], (
            before,
            after,
        )
        assert_weights(job, reference_4)


@pytest.mark.timeout(600)
async def test_a_lost_node_restarts_on_the_spare_and_the_other_node_rejoins_on_slurm(
    own_slurm: Callable[[], TestSlurm],
    dev_server: DevServer,
    tmp_path: Path,
    reference: Path,  # noqa: F811
) -> None:
    """``rejoin.node_loss`` on Slurm: n2 dies whole (slurmd, zygote, rank); its rank
    starts on the spare n3, warm, and rank 0 on n1 keeps its process."""
    cluster = own_slurm()
    allocation = cluster.allocate(3)
    async with harness(dev_server, tmp_path, cluster) as h:
        spec = warm_spec(tmp_path, allocation, rejoin=True, node_loss=True)
        job = await h.start(spec)
        await asyncio.to_thread(chaos.wait_for_step, job.run_root, 25, 240.0)
        [first] = all_generations(job)
        kept = (read_json(first.pid_file(0)) or {}).get("pid")
        with rank_fencing(job) as twice:
            killed_at = time.time()
            kill_node_processes(cluster, "n2")
            status = await job.result(timeout_s=400)
        assert not any(twice), f"a rank alive twice: {[s for s in twice if s]}"
        assert status.phase == Phase.SUCCEEDED, status
        assert status.nodes.active == ["n1", "n3"], status.incidents
        seen = [(i.kind, i.node, i.restart_path, i.evidence) for i in status.incidents]
        assert len(status.incidents) == 1, seen
        [incident] = status.incidents
        assert incident.restart_path == "rejoin", seen
        last = all_generations(job)[-1]
        assert (read_json(last.pid_file(0)) or {}).get("pid") == kept, "n1's rank was carried"
        launched = read_json(last.path / "launch.json") or {}
        assert {r["rank"]: r["node"] for r in launched["ranks"]} == {0: "n1", 1: "n3"}
        assert launched["rejoined"] == [0]
        assert_weights(job, reference)
        print(
            f"slurm node loss with rejoin ({incident.kind} on {incident.node}): after the "
            f"fault: {since_fault(incident)}; first step on the spare "
            f"{(incident.first_step_at or 0) - killed_at:.2f} s after the kill; "
            f"steps_lost={incident.steps_lost}"
        )
