"""The housekeeping loop ends when told to, even when the cancellation of its garbage
collection reaches it as a failed activity (fake activities, real server).

Found by ``python -m bench simulate``: continue-as-new waits for the loop to end, the
loop took the cancelled collection for a failure and went on watching, and the job
stayed RUNNING without ever supervising or continuing as new again."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.workflow.conftest import StartFakeJob, fake_spec

pytestmark = pytest.mark.timeout(150)


async def test_continue_as_new_during_a_collection_is_not_stuck(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(
        tmp_path,
        health={
            "poll_interval_s": 0.2,
            "supervisor_heartbeat_timeout_s": 5,
            "report_interval_s": 1,
        },
    )
    job = await start_fake_job(spec, continue_as_new_after_events=30)
    job.script.collection_blocks = True
    job.script.watch_reports = [10]  # the loop finds step 10 and starts collecting
    status = await job.wait_for(lambda s: s.runs >= 2, "a continue-as-new", timeout_s=120)
    assert status.runs >= 2
    await job.wait_for(lambda s: s.runs >= 3, "the next one too", timeout_s=120)
