"""The timeline as one durable record, on the real ``JobWorkflow`` (issue 37).

The fake search chooses with the product's rules (:mod:`tests.workflow.fake_checkpoints`:
the real ``memory_tier.choose``, the request's cuts, bound and retired checkpoints),
so what these tests see is what the real search would resume from.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lazarus.domain.api import SIGNAL_RESUME, UPDATE_RETURN
from lazarus.domain.contracts import FailureReport
from lazarus.domain.timeline import RetiredCheckpoint
from tests.workflow.conftest import FakeJob, StartFakeJob, fake_spec
from tests.workflow.fake_checkpoints import holdings_for
from tests.workflow.test_fleet import Cluster, cluster, fleet_job
from workflows.state import NodeRequest, Phase

pytestmark = pytest.mark.timeout(180)
__all__ = ["cluster"]  # the fleet tests' fixture: one worker hosting jobs and fleets


def failure(failure_class: str, step: int) -> FailureReport:
    now = time.time()
    return FailureReport(
        kind="crash",
        failure_class=failure_class,
        rank=0,
        node="a",
        exit_code=1,
        step_at_failure=step,
        fault_at=now,
        detected_at=now,
        evidence=[f"{failure_class} at step {step}"],
    )


def resumes(job: FakeJob) -> list[int | None]:
    """Each launch's resume step, in order (None: from scratch)."""
    return [launch.resume.step if launch.resume else None for launch in job.script.launches]


async def test_a_rollback_beside_a_preflight_that_escalates_is_kept_for_the_next_launch(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    """The audit's N1, as it reproduced it: generation 1 resumes from disk 150, writes
    memory snapshots 151 to 159 and diverges at 159. The rollback runs beside the
    relaunch's preflight, which finds node b bad with no spare: NEEDS_OPERATOR. The
    operator returns b and resumes. That relaunch must still go back below the
    retired 150 (to 100), not resume the NaN timeline's snapshot 159."""
    spec = fake_spec(
        tmp_path, nodes=[{"name": "a"}, {"name": "b"}], checkpoints={"memory_every_steps": 1}
    )
    job = await start_fake_job(spec)
    holdings = holdings_for(spec.job_id)
    holdings.checkpoint_writer = 0  # disk 100 and 150: written before this start's runs
    holdings.memory_by_generation[1] = list(range(151, 160))
    job.script.checkpoint_steps = [100, 150]
    job.script.retire_on_rollback = [150]
    job.script.preflight_lost[2] = {"b"}  # the rollback's relaunch; no spare
    job.script.failures[1] = failure("numerical", 159)

    waiting = await job.wait_phase(Phase.NEEDS_OPERATOR)
    assert "no spare left" in (waiting.operator_reason or "")
    assert resumes(job) == [150]
    await job.handle.execute_update(UPDATE_RETURN, NodeRequest(node="b"), result_type=str)
    await job.handle.signal(SIGNAL_RESUME)
    status = await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 2, "generation 2 running"
    )

    assert resumes(job) == [150, 100], "the relaunch after the resume left the NaN timeline"
    relaunch = job.script.searches[-1]
    assert relaunch.below_step == 150 and relaunch.memory_dir is None
    assert relaunch.retired == [RetiredCheckpoint(step=150, generation=0)]
    assert relaunch.off_timeline(1, 159) is not None, "the NaN timeline is cut off"
    assert status.retired_steps == [150]


async def test_the_new_timelines_own_checkpoint_of_a_rolled_back_step_is_resumed(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    """N10: the rollback retires generation 1's checkpoint of step 150, generation 2
    writes its own fresh checkpoint of step 150, then crashes: the relaunch resumes
    from it (generation 2's state), not from 100 an interval further back; the
    diverged copy of 150 (its durable upload stays) never comes back."""
    spec = fake_spec(tmp_path, nodes=[{"name": "a"}, {"name": "b"}])
    job = await start_fake_job(spec)
    holdings = holdings_for(spec.job_id)
    holdings.checkpoint_writer = 0
    holdings.disk_by_generation = {1: [150], 2: [150]}
    job.script.checkpoint_steps = [100]
    job.script.retire_on_rollback = [150]
    job.script.failures[1] = failure("numerical", 159)
    job.script.failures[2] = failure("unknown", 162)

    # The generation is counted before its launch runs: wait for the launch itself.
    await job.wait_for(
        lambda s: s.generation == 3 and len(job.script.launches) == 3,
        "the relaunch after generation 2's crash",
    )

    assert resumes(job) == [100, 100, 150]
    assert job.script.searches[-1].retired == [RetiredCheckpoint(step=150, generation=1)]
    assert job.script.searches[-1].exclude_steps == []


async def test_a_fleet_jobs_rollback_is_kept_when_its_fleet_grants_a_node_later(
    cluster: Cluster, tmp_path: Path
) -> None:
    """N1's other road: a fleet job whose rollback's preflight fails a node, with no
    node left in its fleet, waits for one; when another job ends and frees one, the
    job relaunches by itself (no person) and must still go back below 150."""
    fleet = await cluster.start_fleet(nodes=[{"name": f"n{i}"} for i in range(3)], spares=[])
    other = await cluster.start_job(fleet_job(tmp_path, fleet.name, nodes=1))
    spec = fake_spec(
        tmp_path,
        fleet={"name": fleet.name, "nodes": 2, "retry_s": 10},
        checkpoints={"memory_every_steps": 1},
    )
    job = await cluster.start_job(spec)
    holdings = holdings_for(spec.job_id)
    holdings.checkpoint_writer = 0
    holdings.memory_by_generation[1] = list(range(151, 160))
    job.script.checkpoint_steps = [100, 150]
    job.script.retire_on_rollback = [150]
    await other.wait_phase(Phase.RUNNING)
    first = await job.wait_phase(Phase.RUNNING)
    job.script.preflight_lost[2] = {first.nodes.active[1]}
    job.script.failures[1] = failure("numerical", 159)

    await job.wait_phase(Phase.NEEDS_OPERATOR)
    assert resumes(job) == [150]
    other.script.succeed_at.add(1)
    await other.wait_phase(Phase.SUCCEEDED)
    status = await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 2, "generation 2 on a freed node"
    )

    assert status.operator_reason is None
    assert resumes(job) == [150, 100], "the fleet's node relaunched the NaN timeline"
    assert job.script.searches[-1].below_step == 150
