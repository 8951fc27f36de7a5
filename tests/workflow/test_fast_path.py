"""Issue 12's recovery fast path, decided by the real workflow (fake activities, real server).

A crash after progress restarts at once (no backoff timer), its doomed survivors are
killed without a grace, the relaunch does not stop the generation a second time, and
a node already declared dead is never contacted on the recovery path. Every recovery
records its timeline, rank phases included. A run that used the memory tier ends
with a cleanup stop.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType

from lazarus.domain.contracts import FailureReport, WarmStartOutcome
from lazarus.domain.phases import CHECKPOINT_LOADED, FRAMEWORK_IMPORTED, PROCESS_GROUP_READY
from tests.workflow.conftest import FakeJob, StartFakeJob, fake_spec
from workflows.state import Phase

pytestmark = pytest.mark.timeout(120)


def failure(kind: str = "crash", rank: int = 0, node: str = "a") -> FailureReport:
    now = time.time()
    return FailureReport(
        kind=kind,
        failure_class="node_lost" if kind == "node_lost" else "unknown",
        rank=rank,
        node=node,
        exit_code=1 if kind == "crash" else None,
        fault_at=now - 0.5,
        detected_at=now,
        evidence=[kind],
    )


async def timers_started(job: FakeJob) -> int:
    history = await job.handle.fetch_history()
    return sum(1 for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED)


async def test_a_crash_after_progress_restarts_at_once_with_one_stop_and_a_timeline(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(tmp_path, recovery={"backoff_initial_s": 5, "backoff_max_s": 5})
    job = await start_fake_job(spec)
    t0 = time.time()
    job.script.first_step_phases[2] = {
        FRAMEWORK_IMPORTED: t0 + 100,
        PROCESS_GROUP_READY: t0 + 200,
        CHECKPOINT_LOADED: t0 + 300,
    }
    job.script.launch_warm = WarmStartOutcome(warm_ranks=[0], from_standby=1)
    job.script.failures[1] = failure()
    status = await job.wait_for(
        lambda s: (
            s.generation == 2 and bool(s.incidents) and s.incidents[-1].recovery_s is not None
        ),
        "generation 2's first step",
    )
    assert await timers_started(job) == 0, "the first failure after progress has no backoff"
    recovery_stops = [s for s in job.script.stops if "incident" in s.reason]
    fences = [s for s in job.script.stops if s.reason.startswith("fence generation")]
    assert len(recovery_stops) == 1 and recovery_stops[0].kill_at_once
    assert fences == [], "the relaunch does not stop the generation a second time"
    incident = status.incidents[-1]
    assert incident.timeline is not None
    timeline = incident.timeline
    for field in ("decided_at", "survivors_stopped_at", "resume_chosen_at"):
        assert getattr(timeline, field) is not None, field
    assert timeline.launch_requested_at is not None and timeline.rank_started_at is not None
    assert timeline.framework_imported_at == t0 + 100
    assert timeline.checkpoint_loaded_at == t0 + 300 and timeline.first_step_at is not None
    phases = [d.phase for d in timeline.durations()]
    assert phases[0] == "detected" and phases[-1] == "first new step"
    assert any("warm start: 1 warm (1 from standby), 0 cold" in e for e in incident.evidence)


async def test_a_second_failure_without_progress_still_backs_off(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(tmp_path, recovery={"backoff_initial_s": 0.2, "backoff_max_s": 0.2})
    job = await start_fake_job(spec)
    job.script.failures[1] = failure()
    job.script.failures[2] = failure()
    await job.wait_for(lambda s: s.generation >= 3, "generation 3")
    assert await timers_started(job) == 1, "only the second failure in a row waits"


async def test_a_dead_node_is_not_contacted_on_the_recovery_path(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(tmp_path, nodes=[{"name": "a"}, {"name": "b"}], spares=[{"name": "c"}])
    job = await start_fake_job(spec)
    job.script.failures[1] = failure("node_lost", rank=1, node="b")
    status = await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 2, "generation 2 on the spare"
    )
    assert status.nodes.active == ["a", "c"]
    recovery_stops = [s for s in job.script.stops if "incident" in s.reason]
    assert len(recovery_stops) == 1
    assert [n.name for n in recovery_stops[0].access.nodes] == ["a"]
    assert recovery_stops[0].kill_at_once
    assert all("b" not in [n.name for n in s.access.nodes] for s in job.script.stops)


async def test_a_verified_checkpoint_is_trusted_by_the_next_search(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    job = await start_fake_job(fake_spec(tmp_path))
    job.script.checkpoint_steps = [10]
    job.script.watch_reports = [10]
    await job.wait_for(lambda s: s.generation == 1, "generation 1")
    await job.wait_for(lambda s: bool(job.script.watches), "the watch")
    await job.wait_for(lambda s: len(job.script.watches) >= 2, "the watch's report")
    job.script.failures[1] = failure()
    await job.wait_for(lambda s: s.generation == 2, "generation 2")
    trusted = job.script.searches[-1].trusted
    assert [v.step for v in trusted] == [10]
    assert trusted[0].files["state.pt"].size == 1


async def test_a_run_with_the_memory_tier_ends_with_a_cleanup_stop(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(tmp_path, checkpoints={"memory_every_steps": 1})
    job = await start_fake_job(spec)
    job.script.succeed_at.add(1)
    await job.wait_phase(Phase.SUCCEEDED)
    await job.handle.result()
    assert job.script.stops and job.script.stops[-1].end_of_run
    memory_dir = job.script.searches[0].memory_dir
    assert memory_dir is not None and f"/{spec.job_id}/run-" in memory_dir
