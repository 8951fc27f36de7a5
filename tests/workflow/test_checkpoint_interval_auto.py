"""``checkpoints.interval: auto`` decided by the real workflow (fake activities, real
server): a progress report with δ and the step rate leads to exactly one
``set_checkpoint_interval`` with Daly's interval in steps; similar reports after it send
nothing; a job with a fixed interval never sends one, nor asks for the patch."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType

from lazarus.domain.checkpoint_interval import daly_interval_s
from tests.workflow.conftest import FakeJob, StartFakeJob, fake_spec
from workflows.patches import PATCH_CHECKPOINT_INTERVAL_AUTO

pytestmark = pytest.mark.timeout(120)

MEASURED = {"seconds_per_step": 0.5, "checkpoint_save_s": 2.0}


async def supervisions(job: FakeJob) -> int:
    history = await job.handle.fetch_history()
    return sum(
        1
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "supervise"
    )


async def wait_for_supervisions(job: FakeJob, count: int, timeout_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while await supervisions(job) < count:
        assert loop.time() < deadline, f"fewer than {count} supervision reports"
        await asyncio.sleep(0.1)


async def asked_for_the_patch(job: FakeJob) -> bool:
    history = await job.handle.fetch_history()
    return any(
        PATCH_CHECKPOINT_INTERVAL_AUTO.encode()
        in e.marker_recorded_event_attributes.SerializeToString()
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    )


async def test_one_measurement_sends_one_interval_and_similar_ones_send_none(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(
        tmp_path,
        checkpoints={"interval": "auto", "mtbf_prior_h": 1.0},
        health={
            "poll_interval_s": 0.2,
            "supervisor_heartbeat_timeout_s": 5,
            "report_interval_s": 1,
        },
    )
    job = await start_fake_job(spec)
    job.script.progress_fields = dict(MEASURED)
    status = await job.wait_for(
        lambda s: (
            s.checkpoint_interval is not None and s.checkpoint_interval.every_steps is not None
        ),
        "a tuned interval",
    )
    assert len(job.script.interval_requests) == 1
    sent = job.script.interval_requests[0]
    # One node, a 1 h prior (the job's own minute of history barely moves it).
    assert sent.checkpoint_every_steps == pytest.approx(daly_interval_s(2.0, 3600.0) / 0.5, abs=1)
    assert sent.checkpoint_request == 0 and sent.run_dir.endswith("gen-00001")
    view = status.checkpoint_interval
    assert view is not None
    assert (view.checkpoint_save_s, view.seconds_per_step) == (2.0, 0.5)
    assert view.sent_generation == 1 and view.changes == 1 and view.expected_loss is not None
    # Three more similar reports: nothing more is sent.
    await wait_for_supervisions(job, await supervisions(job) + 3)
    assert len(job.script.interval_requests) == 1
    assert await asked_for_the_patch(job)


async def test_a_fixed_interval_job_sends_nothing_and_asks_for_no_patch(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(
        tmp_path,
        checkpoints={"every_steps": 10},
        health={
            "poll_interval_s": 0.2,
            "supervisor_heartbeat_timeout_s": 5,
            "report_interval_s": 1,
        },
    )
    job = await start_fake_job(spec)
    job.script.progress_fields = dict(MEASURED)
    await wait_for_supervisions(job, 3)
    status = await job.status()
    assert status.checkpoint_interval is None
    assert job.script.interval_requests == []
    assert not await asked_for_the_patch(job)
