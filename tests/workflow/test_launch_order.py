"""The node set is final before a launch chooses its resume point or carries survivors
(issue 26; the audit of 2026-12-03, defects 3 and 11). The real workflow on a dev
server, with the fake activities of ``fakes``; the launcher's own refusal is in
tests/integration/test_rejoin_launch.py.

- The memory tier's snapshot exists only on the nodes its search checked: the search
  must run on the nodes that launch, after the preflight swapped a node for a spare.
- A rejoin is planned on the nodes of the failed generation: when the preflight then
  shrinks the pool or swaps a node, its survivors are stopped and the whole
  generation restarts, never carried outside the world or from a quarantined node.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Worker

from activities.stand_ins import stand_ins
from lazarus.app.devserver import DevServer
from lazarus.domain.api import WORKFLOW_TYPE, workflow_id_for
from lazarus.domain.contracts import (
    CheckpointRef,
    CheckpointSearch,
    FailureReport,
    FindVerifiedCheckpointRequest,
)
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.spec import JobSpec, NodeSpec
from tests.workflow import fakes
from tests.workflow.conftest import FakeJob, StartFakeJob, fake_spec
from workflows.job import JobWorkflow
from workflows.state import JobInput, Phase

pytestmark = pytest.mark.timeout(120)

REJOIN = {"enabled": True, "timeout_s": 30}


async def memory_search(request: FindVerifiedCheckpointRequest) -> CheckpointSearch:
    """The memory tier's answer, whatever the nodes: step 41 in tmpfs (the audit's
    repro 1). What matters is which nodes the workflow asked about."""
    fakes.script_for(request.job_id or "").searches.append(request)
    if request.memory_dir is None:
        return CheckpointSearch()
    return CheckpointSearch(
        chosen=CheckpointRef(step=41, path=f"{request.memory_dir}/step-00000041"),
        location="memory",
    )


@pytest.fixture
async def start_memory_job(dev_server: DevServer) -> AsyncIterator[StartFakeJob]:
    """``start_fake_job`` with the memory tier answering every search."""
    client = await Client.connect(dev_server.address, data_converter=pydantic_data_converter)
    task_queue = f"wf-{uuid.uuid4().hex[:8]}"
    handles: list[WorkflowHandle[Any, Any]] = []
    fake = SimpleNamespace(**vars(fakes))
    fake.find_verified_checkpoint = memory_search  # stands in for the fake's search
    activities: list[Callable[..., Any]] = list(stand_ins(fake))
    async with Worker(
        client, task_queue=task_queue, workflows=[JobWorkflow], activities=activities
    ):

        async def start(spec: JobSpec) -> FakeJob:
            handle = await client.start_workflow(
                WORKFLOW_TYPE,
                JobInput(spec=spec, strict_phases=True),
                id=workflow_id_for(spec.name),
                task_queue=task_queue,
            )
            handles.append(handle)
            return FakeJob(spec, handle)

        yield start
        for handle in handles:
            with contextlib.suppress(RPCError):  # already closed
                await handle.terminate("test teardown")


def crash(rank: int, node: str) -> FailureReport:
    """A SIGKILLed rank: the playbook restarts in place, and with ``rejoin`` the other
    ranks are planned to keep their process."""
    now = time.time()
    return FailureReport(
        kind="crash",
        failure_class=FailureClass.KILLED,
        rank=rank,
        node=node,
        signal="SIGKILL",
        exit_code=-9,
        step_at_failure=42,
        fault_at=now - 0.5,
        detected_at=now,
        evidence=["killed"],
    )


def node_lost(node: str) -> FailureReport:
    """A silent host: the playbook swaps in a spare."""
    now = time.time()
    return FailureReport(
        kind="node_lost",
        failure_class=FailureClass.NODE_LOST,
        rank=1,
        node=node,
        step_at_failure=42,
        fault_at=now - 5.0,
        detected_at=now,
        evidence=[f"node {node} unreachable for 5.0 s"],
    )


def names(nodes: list[NodeSpec] | None) -> list[str]:
    return [n.name for n in nodes or []]


async def test_the_memory_tier_is_searched_on_the_nodes_that_launch(
    start_memory_job: StartFakeJob, tmp_path: Path
) -> None:
    """Audit defect 3, repro 1: b crashes, the relaunch's preflight finds b lost and
    swaps in spare s. The search must check s, not b, for the snapshot it resumes."""
    spec = fake_spec(
        tmp_path,
        nodes=[{"name": "a"}, {"name": "b"}],
        spares=[{"name": "s"}],
        checkpoints={"memory_every_steps": 1},
    )
    job = await start_memory_job(spec)
    job.script.preflight_lost[2] = {"b"}  # the second launch's preflight
    job.script.failures[1] = crash(1, "b")
    status = await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 2, "generation 2 on the spare"
    )
    assert status.nodes.active == ["a", "s"]
    launches, searches = job.script.launches, job.script.searches
    assert [names(launch.nodes) for launch in launches] == [["a", "b"], ["a", "s"]]
    # The relaunch's search ran beside its preflight on the nodes planned (a, b); the
    # preflight swapped b out, so that one was thrown away and made again on a, s.
    assert [names(search.access.nodes) for search in searches] == [
        ["a", "b"],
        ["a", "b"],
        ["a", "s"],
    ]
    for launch in launches:
        assert launch.resume is not None and launch.resume.step == 41


async def test_the_preflight_runs_beside_the_resume_search(
    start_memory_job: StartFakeJob, tmp_path: Path
) -> None:
    """Issue 28: after a node loss nothing but the preflight and the search stands
    between the stop and the launch, and neither needs the other when the preflight
    moves no node: each launch runs them at once (the fake preflight waits for its
    launch's search to start, which never happens were they one after the other),
    and one search per launch serves it."""
    spec = fake_spec(
        tmp_path,
        nodes=[{"name": "a"}, {"name": "b"}],
        spares=[{"name": "s"}],
        checkpoints={"memory_every_steps": 1},
    )
    job = await start_memory_job(spec)
    job.script.preflight_awaits_search_s = 20.0
    job.script.failures[1] = node_lost("b")
    status = await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 2, "generation 2 on the spare"
    )
    assert status.nodes.active == ["a", "s"]
    assert job.script.preflight_saw_search == [True, True]
    launches, searches = job.script.launches, job.script.searches
    assert len(searches) == len(launches) == 2, "one search per launch"
    for search, launch in zip(searches, launches, strict=True):
        assert names(search.access.nodes) == names(launch.nodes)
        assert launch.resume is not None and launch.resume.step == 41
    timeline = status.incidents[-1].timeline
    assert timeline is not None and timeline.resume_chosen_at is not None


async def test_a_shrink_by_the_preflight_drops_the_rejoin_for_a_whole_restart(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    """Audit defect 11: rank 1 on b crashes; the plan keeps ranks 0 and 2. The
    preflight then fails b and the pool shrinks to a, c: rank 2 has no slot left."""
    spec = fake_spec(
        tmp_path,
        nodes=[{"name": "a"}, {"name": "b"}, {"name": "c"}],
        min_nodes=2,
        rejoin=REJOIN,
    )
    job = await start_fake_job(spec)
    job.script.preflight_lost[2] = {"b"}
    job.script.failures[1] = crash(1, "b")
    status = await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 2, "generation 2 on a, c"
    )
    assert status.nodes.active == ["a", "c"]
    relaunch = job.script.launches[-1]
    assert names(relaunch.nodes) == ["a", "c"]
    assert relaunch.rejoin_ranks == [], "nothing is carried into a world that changed"
    fences = [s for s in job.script.stops if "rejoin is dropped" in s.reason]
    assert len(fences) == 1 and fences[0].kill_at_once
    assert set(names(fences[0].access.nodes)) == {"a", "b", "c"}, "the survivors are stopped"
    incident = status.incidents[-1]
    assert incident.restart_path == "whole_generation"
    assert any("preflight changed the nodes from a, b, c to a, c" in e for e in incident.evidence)


async def test_a_swap_by_the_preflight_never_carries_a_quarantined_nodes_survivors(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    """The audit's suspicion: rank 0 on a crashes, the plan keeps rank 1 on b; the
    preflight then swaps b for spare s. Rank 1 must not act for s's slot from b."""
    spec = fake_spec(
        tmp_path, nodes=[{"name": "a"}, {"name": "b"}], spares=[{"name": "s"}], rejoin=REJOIN
    )
    job = await start_fake_job(spec)
    job.script.preflight_lost[2] = {"b"}
    job.script.failures[1] = crash(0, "a")
    status = await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 2, "generation 2 on a, s"
    )
    relaunch = job.script.launches[-1]
    assert names(relaunch.nodes) == ["a", "s"]
    assert relaunch.rejoin_ranks == []
    fences = [s for s in job.script.stops if "rejoin is dropped" in s.reason]
    assert len(fences) == 1 and "b" in names(fences[0].access.nodes), "b's survivor is stopped"
    assert status.incidents[-1].restart_path == "whole_generation"


async def test_a_preflight_that_changes_nothing_keeps_the_rejoin(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(tmp_path, nodes=[{"name": "a"}, {"name": "b"}, {"name": "c"}], rejoin=REJOIN)
    job = await start_fake_job(spec)
    job.script.failures[1] = crash(1, "b")
    status = await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 2, "generation 2"
    )
    assert job.script.launches[-1].rejoin_ranks == [0, 2]
    assert job.script.stops == []
    assert status.incidents[-1].restart_path == "rejoin"
