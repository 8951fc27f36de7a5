"""Two controller workers on one dev server: one is SIGKILLed, the other carries on.

Production runs two or more workers against one Temporal cluster. Here both run on
this machine, so both poll the job's task queue and this host's queue
(``<task_queue>@<host>``), to which a local job routes its machine-bound activities
once its first launch names the host. The worker holding supervision is killed; the
survivor must take supervision over, and recover a crash injected afterwards, and the
weights must equal a fault-free run's.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType

from activities.host_identity import this_host
from bench.takeover import kill_supervising_worker, second_stack
from infra import chaos
from lazarus.app.local_stack import LocalStack
from tests.e2e.conftest import STEPS, Job, assert_same_weights, ddp_spec
from workflows.routing import MACHINE_BOUND, host_task_queue
from workflows.state import Phase

StartJob = Callable[..., Awaitable[Job]]


async def scheduled_queues(job: Job) -> list[tuple[str, str]]:
    """(activity, task queue) of every activity the job scheduled, in order."""
    history = await job.handle.fetch_history()
    return [
        (
            event.activity_task_scheduled_event_attributes.activity_type.name,
            event.activity_task_scheduled_event_attributes.task_queue.name,
        )
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


@pytest.mark.timeout(300)
async def test_survivor_takes_supervision_and_recovers_a_later_crash(
    start_job: StartJob,
    stack: LocalStack,
    tmp_path: Path,
    fault_free_weights: Path,
) -> None:
    other = second_stack(stack, tmp_path / "stack-b")
    other.start_worker()
    try:
        job = await start_job(ddp_spec(tmp_path, steps=STEPS, step_time=0.5))
        await asyncio.to_thread(chaos.wait_for_step, job.run_root, 5, 120)
        takeover = await kill_supervising_worker(job.handle, [stack, other])
        assert takeover.survivor_identity != takeover.killed_identity
        status = await job.status()
        assert status.phase == Phase.RUNNING and status.generation == 1, (
            "the survivor must adopt the live ranks, not relaunch them"
        )
        _, step_before_crash = chaos.current_step(job.run_root)
        assert step_before_crash is not None and step_before_crash < STEPS - 5, (
            "the job must still be training when the crash is injected"
        )
        chaos.signal_rank(job.run_root, rank=1, sig=signal.SIGKILL)
        status = await job.result(timeout_s=240)
    finally:
        other.kill_worker(signal.SIGKILL)
    assert status.phase == Phase.SUCCEEDED
    assert status.generation == 2
    assert [i.kind for i in status.incidents] == ["crash"]
    assert_same_weights(job.weights, fault_free_weights)

    host_queue = host_task_queue(stack.task_queue, this_host())
    assert status.host_task_queue == host_queue
    queues = await scheduled_queues(job)
    first_launch = next(i for i, (name, _) in enumerate(queues) if name == "launch")
    after_launch = [(n, q) for n, q in queues[first_launch + 1 :] if n in MACHINE_BOUND]
    assert any(n == "supervise" for n, _ in after_launch)
    assert any(n == "launch" for n, _ in after_launch), "the relaunch after the crash"
    misrouted = [(n, q) for n, q in after_launch if q != host_queue]
    assert not misrouted, f"machine-bound activities off the host queue: {misrouted}"
