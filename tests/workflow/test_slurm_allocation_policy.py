"""The workflow's side of changing a Slurm allocation (fake activities, real server).

A preemption with ``slurm.resubmit`` goes on in the allocation Slurm grants next,
and a lost node with no spare and ``slurm.grow`` is replaced by the node Slurm adds;
when Slurm says no, the job pauses (resubmit) or shrinks / asks a person (grow),
with Slurm's answer in the incident. The real Slurm side is in tests/slurm.

A job in submit mode (``slurm.nodes``) gets its first allocation the same way: the
workflow's first step submits it, waits, and launches there; Slurm's refusal fails
the job, and a cancellation while it waits gives the allocation back.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError

from lazarus.domain.contracts import AllocationGranted, FailureReport, SubmitAllocationRequest
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.spec import JobSpec
from tests.workflow import fakes
from tests.workflow.conftest import StartFakeJob, fake_spec
from workflows.playbook import Action
from workflows.state import Phase

pytestmark = pytest.mark.timeout(120)


def notice(job_id: int) -> FailureReport:
    now = time.time()
    return FailureReport(
        kind="preempted",
        failure_class=FailureClass.PREEMPTED,
        rank=0,
        fault_at=now,
        detected_at=now,
        evidence=[f"Slurm signalled the holder of job {job_id}"],
    )


def node_lost(node: str, rank: int) -> FailureReport:
    now = time.time()
    return FailureReport(
        kind="node_lost",
        failure_class=FailureClass.NODE_LOST,
        rank=rank,
        node=node,
        fault_at=now,
        detected_at=now,
        evidence=[f"Slurm reports {node} DOWN"],
    )


def slurm_nodes(*names: str) -> list[dict[str, str]]:
    return [{"name": n, "launcher": "slurm"} for n in names]


def submitted_spec(tmp_path: Path, resubmit: bool) -> object:
    """A job in an allocation Lazarus submitted (as ``lazarus start`` leaves it)."""
    slurm = {"job_id": 7, "nodes": 2, "submitted": True, "resubmit": resubmit}
    return fake_spec(tmp_path, nodes=slurm_nodes("n1", "n2"), slurm=slurm)


async def test_a_preempted_job_goes_on_in_the_resubmitted_allocation(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    job = await start_fake_job(submitted_spec(tmp_path, resubmit=True))
    job.script.allocations = [AllocationGranted(job_id=8, nodes=["n4", "n5"], waited_s=3)]
    job.script.preempted[1] = notice(7)
    status = await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 2, "generation 2 in job 8"
    )
    assert status.nodes.active == ["n4", "n5"]
    (asked,) = job.script.allocation_requests
    assert isinstance(asked, SubmitAllocationRequest) and asked.slurm.job_id == 7
    relaunch = job.script.launches[-1]
    assert relaunch.spec.slurm is not None and relaunch.spec.slurm.job_id == 8
    assert [n.name for n in relaunch.spec.nodes] == ["n4", "n5"]
    incident = status.incidents[-1]
    assert incident.failure_class == FailureClass.PREEMPTED
    assert incident.action == Action.RESUBMIT
    assert any("Slurm job 8" in line for line in incident.evidence)


async def test_a_refused_resubmission_pauses_with_slurms_answer(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    job = await start_fake_job(submitted_spec(tmp_path, resubmit=True))
    job.script.preempted[1] = notice(7)
    status = await job.wait_phase(Phase.PAUSED)
    incident = status.incidents[-1]
    assert incident.action == Action.PAUSE
    assert incident.reason is not None and "no nodes" in incident.reason
    assert len(job.script.launches) == 1


async def test_a_resubmitted_allocation_too_small_pauses_with_the_reason(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    """Issue 26: a grant smaller than the job's nodes and spares (an adopted job of
    another size) is refused in the workflow too, never raised in workflow code,
    which wedged the job in RECOVERING."""
    job = await start_fake_job(submitted_spec(tmp_path, resubmit=True))
    job.script.allocations = [AllocationGranted(job_id=777, nodes=["bobn1"])]
    job.script.preempted[1] = notice(7)
    status = await job.wait_phase(Phase.PAUSED, timeout_s=30)
    incident = status.incidents[-1]
    assert incident.reason is not None and "Slurm job 777 holds 1 node(s), not the 2" in (
        incident.reason
    )
    assert len(job.script.launches) == 1
    (asked,) = job.script.allocation_requests
    assert isinstance(asked, SubmitAllocationRequest)
    # The run's own names and the allocation it recorded go to the activity.
    assert asked.run_key and asked.run_key.startswith("run-") and asked.known_job_ids == [7]


async def test_without_resubmit_a_preempted_job_pauses_and_asks_slurm_nothing(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    job = await start_fake_job(submitted_spec(tmp_path, resubmit=False))
    job.script.preempted[1] = notice(7)
    await job.wait_phase(Phase.PAUSED)
    assert job.script.allocation_requests == []


async def test_a_lost_node_with_no_spare_is_replaced_by_the_node_slurm_adds(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(tmp_path, nodes=slurm_nodes("n1", "n2"), slurm={"job_id": 7, "grow": True})
    job = await start_fake_job(spec)
    job.script.allocations = [AllocationGranted(job_id=7, nodes=["n3"])]
    job.script.failures[1] = node_lost("n2", rank=1)
    status = await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 2, "generation 2 on n3"
    )
    assert status.nodes.active == ["n1", "n3"]  # n3 takes n2's rank slot
    (asked,) = job.script.allocation_requests
    assert not isinstance(asked, SubmitAllocationRequest)
    assert set(asked.known_nodes) == {"n1", "n2"} and asked.exclude == ["n2"]
    assert asked.run_key and asked.known_job_ids == [7]
    assert [n.name for n in job.script.launches[-1].spec.spares] == ["n3"]
    assert status.incidents[-1].action == Action.GROW


async def test_a_node_found_lost_by_the_relaunchs_preflight_is_replaced_by_growing(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    """The peer crashes first (its collective sees the dead node's connection drop);
    the relaunch's preflight then finds the node gone, with no spare left."""
    spec = fake_spec(tmp_path, nodes=slurm_nodes("n1", "n2"), slurm={"job_id": 7, "grow": True})
    job = await start_fake_job(spec)
    job.script.allocations = [AllocationGranted(job_id=7, nodes=["n3"])]
    job.script.preflight_lost = {2: {"n2"}}  # the relaunch's
    now = time.time()
    job.script.failures[1] = FailureReport(
        kind="crash", failure_class=FailureClass.NCCL_ERROR, rank=0, node="n1",
        exit_code=1, fault_at=now, detected_at=now, evidence=["gloo: connection reset"],
    )  # fmt: skip
    status = await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 2, "generation 2 on n3"
    )
    assert status.nodes.active == ["n1", "n3"]
    assert status.incidents[-1].action == Action.GROW


async def test_when_slurm_adds_no_node_the_job_shrinks_within_min_nodes(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(
        tmp_path,
        nodes=slurm_nodes("n1", "n2"),
        slurm={"job_id": 7, "grow": True},
        min_nodes=1,
    )
    job = await start_fake_job(spec)
    job.script.failures[1] = node_lost("n2", rank=1)
    status = await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 2, "generation 2 on n1 alone"
    )
    assert status.nodes.active == ["n1"]
    incident = status.incidents[-1]
    assert incident.action == Action.SHRINK
    assert any("Slurm added no node" in line for line in incident.evidence)


async def test_when_slurm_adds_no_node_and_no_shrink_is_allowed_a_person_is_asked(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(tmp_path, nodes=slurm_nodes("n1", "n2"), slurm={"job_id": 7, "grow": True})
    job = await start_fake_job(spec)
    job.script.failures[1] = node_lost("n2", rank=1)
    status = await job.wait_phase(Phase.NEEDS_OPERATOR)
    assert status.incidents[-1].action == Action.NEEDS_OPERATOR
    assert [q.node for q in status.nodes.quarantined] == ["n2"]


# --- the first submit (issue 27): the workflow's first step, no longer the CLI's ---------


def submit_mode_spec(tmp_path: Path, **slurm: object) -> JobSpec:
    """A job whose allocation Lazarus submits (``slurm.nodes``), as ``lazarus start``
    now hands it to the workflow: no allocation yet."""
    return fake_spec(tmp_path, slurm={"nodes": 2, "spares": 1, "partition": "gpu", **slurm})


async def test_a_submit_mode_job_submits_waits_and_launches_on_the_granted_nodes(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = submit_mode_spec(tmp_path)
    script = fakes.script_for(spec.job_id)
    script.allocations = [AllocationGranted(job_id=31, nodes=["n1", "n2", "n3"], waited_s=4)]
    job = await start_fake_job(spec)
    status = await job.wait_phase(Phase.RUNNING)
    (asked,) = script.allocation_requests
    assert isinstance(asked, SubmitAllocationRequest)
    assert asked.slurm.job_id is None and not asked.release_old and asked.known_job_ids == []
    # this run's own holder name, which a retry (or a cancellation) finds it by
    assert asked.run_key and asked.holder_name.startswith(f"lazarus-{spec.name}-")
    assert asked.holder_name.endswith("-start")
    (launch,) = script.launches
    assert launch.spec.slurm is not None and launch.spec.slurm.allocation_id == 31
    assert launch.spec.slurm.submitted  # a resubmission asks for the same options
    assert [n.name for n in launch.nodes] == ["n1", "n2"]
    assert [n.launcher for n in launch.nodes] == ["slurm", "slurm"]
    assert status.nodes.active == ["n1", "n2"] and status.nodes.spares == ["n3"]
    assert status.slurm_job_id == 31


async def test_a_first_submit_slurm_refuses_fails_the_job_with_the_reason(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    job = await start_fake_job(submit_mode_spec(tmp_path))  # no allocations: Slurm says no
    status = await job.wait_phase(Phase.FAILED)
    assert status.operator_reason is not None and "no nodes" in status.operator_reason
    assert "allocation was not granted" in status.operator_reason
    assert job.script.launches == [] and job.script.stops == []


async def test_a_grant_too_small_for_the_job_fails_it_unlaunched(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = submit_mode_spec(tmp_path)
    fakes.script_for(spec.job_id).allocations = [AllocationGranted(job_id=32, nodes=["n1"])]
    job = await start_fake_job(spec)
    status = await job.wait_phase(Phase.FAILED)
    assert status.operator_reason is not None and "Slurm job 32 holds 1 node(s)" in (
        status.operator_reason
    )
    assert job.script.launches == []


async def test_cancelling_a_job_waiting_for_its_allocation_gives_it_back(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = submit_mode_spec(tmp_path)
    script = fakes.script_for(spec.job_id)
    script.submit_waits = True
    job = await start_fake_job(spec)
    status = await job.wait_for(lambda s: bool(script.allocation_requests), "the submission")
    assert status.phase == Phase.PENDING
    await job.handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await job.handle.result()
    (asked,) = script.allocation_requests
    (given_back,) = script.given_back
    assert given_back.holder_name == asked.holder_name
    assert script.launches == [] and script.stops == []
    description = await job.handle.describe()
    assert description.status == WorkflowExecutionStatus.CANCELED


async def test_a_job_started_in_an_allocation_submits_nothing(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    job = await start_fake_job(submitted_spec(tmp_path, resubmit=True))
    await job.wait_phase(Phase.RUNNING)
    assert job.script.allocation_requests == []
