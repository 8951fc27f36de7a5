"""Issue 26 (audit 10.), decided by the real workflow (fake activities, real server):
the end-of-run stop of a warm-started job reaches every node the run touched, not only
those it holds now, so no zygote, idle standby or ``/dev/shm`` snapshot outlives it.

Node b runs generation 1, cannot be reached for generation 2 (quarantined; spare c
takes its slot), is fenced by a pause and returned to the spares. Before the fix the
end-of-run stop reached only a and c: b's zygote lived on."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType

from lazarus.domain.api import SIGNAL_PAUSE, UPDATE_RETURN
from lazarus.domain.contracts import FailureReport, StopRequest
from tests.workflow.conftest import FakeJob, StartFakeJob, fake_spec
from workflows.patches import PATCH_END_OF_RUN_EVERY_NODE
from workflows.state import NodeRequest, Phase

pytestmark = pytest.mark.timeout(120)

WARM_ON_TWO_NODES_AND_A_SPARE = {
    "nodes": [{"name": "a"}, {"name": "b"}],
    "spares": [{"name": "c"}],
    "warm_start": {"preload": [], "standby": 1},
}


def crash() -> FailureReport:
    now = time.time()
    return FailureReport(
        kind="crash",
        failure_class="unknown",
        rank=0,
        node="a",
        exit_code=1,
        fault_at=now,
        detected_at=now,
        evidence=["exit 1"],
    )


async def b_ran_then_left_the_pool(job: FakeJob) -> None:
    """Generation 1 on a, b; b unreachable at the relaunch, fenced by a pause."""
    job.script.failures[1] = crash()
    job.script.unreachable_at_launch[2] = "b"
    await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 3, "generation 3 on the spare"
    )
    await job.handle.signal(SIGNAL_PAUSE)
    status = await job.wait_phase(Phase.PAUSED)
    assert status.nodes.active == ["a", "c"]
    assert [(q.node, q.fenced) for q in status.nodes.quarantined] == [("b", True)]


def end_of_run_stop(job: FakeJob) -> StopRequest:
    [last] = [s for s in job.script.stops if s.end_of_run]
    return last


async def test_a_cancelled_run_stops_its_zygotes_on_a_node_it_returned_to_the_spares(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    job = await start_fake_job(fake_spec(tmp_path, **WARM_ON_TWO_NODES_AND_A_SPARE))
    await b_ran_then_left_the_pool(job)
    reply = await job.handle.execute_update(UPDATE_RETURN, NodeRequest(node="b"), result_type=str)
    assert reply == "b is a spare again"
    await job.handle.cancel()
    await job.wait_phase(Phase.CANCELLED)
    stop = end_of_run_stop(job)
    assert [n.name for n in stop.access.nodes] == ["a", "c", "b"]


async def test_a_finished_run_stops_its_zygotes_on_a_fenced_quarantined_node(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    job = await start_fake_job(fake_spec(tmp_path, **WARM_ON_TWO_NODES_AND_A_SPARE))
    await b_ran_then_left_the_pool(job)
    job.script.succeed_at.add(4)
    await job.handle.signal("resume")
    await job.wait_phase(Phase.SUCCEEDED)
    await asyncio.wait_for(job.handle.result(), timeout=30)
    stop = end_of_run_stop(job)
    assert [n.name for n in stop.access.nodes] == ["a", "c", "b"]
    history = await job.handle.fetch_history()
    assert any(
        PATCH_END_OF_RUN_EVERY_NODE.encode()
        in e.marker_recorded_event_attributes.SerializeToString()
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    )
    assert (await job.status()).cleanup_unreached == []


async def test_the_end_of_run_notes_the_nodes_it_cannot_reach_and_ends_anyway(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    job = await start_fake_job(fake_spec(tmp_path, **WARM_ON_TWO_NODES_AND_A_SPARE))
    job.script.unreachable_at_end = {"b"}
    job.script.succeed_at.add(1)
    await asyncio.wait_for(job.handle.result(), timeout=30)
    status = await job.status()
    assert status.phase == Phase.SUCCEEDED
    assert status.cleanup_unreached == ["b"]


async def test_an_end_of_run_stop_that_keeps_failing_never_holds_the_run_open(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    job = await start_fake_job(fake_spec(tmp_path, **WARM_ON_TWO_NODES_AND_A_SPARE))
    job.script.end_of_run_fails = True
    job.script.succeed_at.add(1)
    await asyncio.wait_for(job.handle.result(), timeout=30)
    status = await job.status()
    assert status.phase == Phase.SUCCEEDED
    assert status.cleanup_unreached == ["a", "b", "c"]  # c: the prewarmed spare


async def test_the_spare_is_prewarmed_at_each_launch_and_stopped_at_the_end_of_the_run(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    """Issue 28: with warm starts, every launch names the pool's spares that run no
    rank, for their zygote to be started; c never runs a rank, so only the end-of-run
    stop reaches it, and it does."""
    job = await start_fake_job(fake_spec(tmp_path, **WARM_ON_TWO_NODES_AND_A_SPARE))
    job.script.failures[1] = crash()
    job.script.succeed_at.add(2)
    await asyncio.wait_for(job.handle.result(), timeout=30)
    assert [[n.name for n in r.prewarm] for r in job.script.launches] == [["c"], ["c"]]
    stop = end_of_run_stop(job)
    assert [n.name for n in stop.access.nodes] == ["a", "b", "c"]


async def test_without_warm_starts_no_spare_is_prewarmed_or_contacted_at_the_end(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    cold = {k: v for k, v in WARM_ON_TWO_NODES_AND_A_SPARE.items() if k != "warm_start"}
    job = await start_fake_job(fake_spec(tmp_path, **cold))
    job.script.succeed_at.add(1)
    await asyncio.wait_for(job.handle.result(), timeout=30)
    assert [r.prewarm for r in job.script.launches] == [[]]
    reached = {n.name for s in job.script.stops for n in s.access.nodes}
    assert "c" not in reached, "a spare that holds nothing of the run is not contacted"
