"""Operator messages, as the real workflow handles them (fake activities, real server).

Issue 10, defects 1, 5, 6 and 7: a stray ``resume`` is remembered for good; a typo in
``recover --exclude-node`` grows the world or strands the job; a second ``drain`` is
acknowledged and dropped; a new start reuses the old start's run directory.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.client import WorkflowUpdateFailedError

from lazarus.domain.api import (
    SIGNAL_FORCE_RECOVER,
    SIGNAL_PAUSE,
    SIGNAL_RESUME,
    UPDATE_DRAIN,
    UPDATE_RECOVER,
)
from tests.workflow.conftest import StartFakeJob, fake_spec
from workflows.state import ForceRecover, NodeRequest, Phase

pytestmark = pytest.mark.timeout(120)

TWO_NODES_AND_A_SPARE = {
    "nodes": [{"name": "a"}, {"name": "b"}],
    "spares": [{"name": "c"}],
}


async def test_a_stray_resume_is_ignored_and_has_no_later_effect(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    job = await start_fake_job(fake_spec(tmp_path))
    await job.wait_phase(Phase.RUNNING)
    await job.handle.signal(SIGNAL_RESUME)
    status = await job.wait_for(lambda s: bool(s.ignored_messages), "the resume ignored")
    assert status.ignored_messages[0].name == SIGNAL_RESUME
    assert "RUNNING" in status.ignored_messages[0].reason

    await job.handle.signal(SIGNAL_PAUSE)
    await job.wait_phase(Phase.PAUSED)
    await asyncio.sleep(2)  # a remembered resume would have bounced it back by now
    assert (await job.status()).phase == Phase.PAUSED

    await job.handle.signal(SIGNAL_RESUME)
    await job.wait_phase(Phase.RUNNING)


async def test_a_paused_job_refuses_recover_and_drain_and_stays_paused(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    """Issue 29: ``recover`` on a paused job used to resume it quietly."""
    job = await start_fake_job(fake_spec(tmp_path, **TWO_NODES_AND_A_SPARE))
    await job.wait_phase(Phase.RUNNING)
    await job.handle.signal(SIGNAL_PAUSE)
    paused = await job.wait_phase(Phase.PAUSED)
    for update, argument in (
        (UPDATE_RECOVER, ForceRecover(reason="maintenance")),
        (UPDATE_DRAIN, NodeRequest(node="b")),
    ):
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await job.handle.execute_update(update, argument, result_type=str)
        assert "the job is paused: 'lazarus resume' it first" in str(refused.value.cause)
    await job.handle.signal(SIGNAL_FORCE_RECOVER, ForceRecover(reason="old client"))
    status = await job.wait_for(lambda s: bool(s.ignored_messages), "the signal ignored")
    assert status.ignored_messages[-1].name == SIGNAL_FORCE_RECOVER
    assert "paused" in status.ignored_messages[-1].reason
    await asyncio.sleep(2)  # a queued recovery would have relaunched by now
    status = await job.status()
    assert status.phase == Phase.PAUSED and status.generation == paused.generation
    assert not status.incidents

    await job.handle.signal(SIGNAL_RESUME)
    await job.wait_phase(Phase.RUNNING)


async def test_recover_refuses_an_unknown_or_spare_node_and_changes_nothing(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    job = await start_fake_job(fake_spec(tmp_path, **TWO_NODES_AND_A_SPARE))
    before = await job.wait_phase(Phase.RUNNING)
    for node, why in (("no-such-node", "not running this job"), ("c", "is a spare")):
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await job.handle.execute_update(
                UPDATE_RECOVER, ForceRecover(exclude_node=node), result_type=str
            )
        assert why in str(refused.value.cause)
    # The signal form (older clients) cannot answer: it is recorded as ignored.
    await job.handle.signal(SIGNAL_FORCE_RECOVER, ForceRecover(exclude_node="no-such-node"))
    status = await job.wait_for(lambda s: bool(s.ignored_messages), "the signal ignored")
    assert status.phase == Phase.RUNNING
    assert status.world_size == before.world_size
    assert status.nodes.active == ["a", "b"] and status.nodes.spares == ["c"]
    assert status.nodes.quarantined == []
    assert status.generation == before.generation

    reply = await job.handle.execute_update(
        UPDATE_RECOVER, ForceRecover(exclude_node="b", reason="bad NIC"), result_type=str
    )
    assert "without b" in reply
    status = await job.wait_for(lambda s: s.generation == 2 and s.phase == Phase.RUNNING, "gen 2")
    assert status.nodes.active == ["a", "c"]
    assert [q.node for q in status.nodes.quarantined] == ["b"]
    assert status.world_size == before.world_size


async def test_a_second_drain_is_refused_not_dropped(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(
        tmp_path, nodes=[{"name": "a"}, {"name": "b"}], spares=[{"name": "c"}, {"name": "d"}]
    )
    job = await start_fake_job(spec)
    await job.wait_phase(Phase.RUNNING)
    first, second = await asyncio.gather(
        job.handle.execute_update(UPDATE_DRAIN, NodeRequest(node="a"), result_type=str),
        job.handle.execute_update(UPDATE_DRAIN, NodeRequest(node="b"), result_type=str),
        return_exceptions=True,
    )
    # Either the second arrives while the first is still queued and is refused with
    # the reason, or after the first was taken up and is queued in turn: what must
    # never happen is a "draining" answer that is then dropped.
    outcomes = {"a": first, "b": second}
    accepted = [node for node, o in outcomes.items() if isinstance(o, str)]
    refused = [o for o in outcomes.values() if isinstance(o, WorkflowUpdateFailedError)]
    assert accepted and len(accepted) + len(refused) == 2, outcomes
    assert all("already queued" in str(o.cause) for o in refused)
    status = await job.wait_for(
        lambda s: (
            sorted(q.node for q in s.nodes.quarantined) == sorted(accepted)
            and s.phase == Phase.RUNNING
        ),
        f"every accepted drain honoured ({accepted})",
    )
    assert status.generation == 1 + len(accepted)


async def test_every_start_gets_its_own_run_directory(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(tmp_path)
    first = await start_fake_job(spec)
    status = await first.wait_phase(Phase.RUNNING)
    assert status.run_dir is not None and "/run-" in status.run_dir
    await first.handle.cancel()
    await first.wait_phase(Phase.CANCELLED)
    second = await start_fake_job(spec)
    again = await second.wait_phase(Phase.RUNNING)
    assert again.run_dir is not None and again.run_dir != status.run_dir
    roots = {launch.run_root for launch in second.script.launches}
    assert roots == {status.run_dir, again.run_dir}
