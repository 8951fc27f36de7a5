"""A simulated cluster behind the real activity names, on Temporal's time-skipping server.

The real ``JobWorkflow`` runs unchanged; only its activities are these. Simulated
time *is* the test server's clock: each activity reads it (``env.get_current_time``),
works out from the seeded failure trace what the cluster does next, and advances the
clock with ``env.sleep`` (a server-side timer, not a real sleep) before it answers.

How the time-skipping server moves its clock decides the design. It keeps a lock
counter: the driver's ``handle.result()`` releases its one lock, every *open* activity
holds one (from its scheduling until the server records its end), a workflow task in
flight holds one, and ``env.sleep(d)`` (``UnlockTimeSkippingWithSleep``) releases one
until the clock has moved ``d``. The clock jumps only while the counter is zero, so:

- every open activity must be inside ``env.sleep`` for time to pass: an activity that
  waits in any other way (for an update, a signal, real time) stalls the clock, and
  the sleeping ones then fail with ``RPCError: Timeout expired``;
- nothing sleeps outside an activity: with no open activity the counter is already
  zero, and another unlock is refused as unbalanced. The simulated operator therefore
  watches the clock instead of sleeping (:meth:`SimCluster._operate`), and the
  checkpoint watch shortens its sleep so the clock stops at the operator's moment;
- the server drops locks in three cases, and the simulator gives each one
  back (:class:`LockLedger`), counted from the server's own answers, never guessed:

  * **a completion the server refuses.** Continue-as-new cancels supervision and the
    checkpoint watch (``TRY_CANCEL``) and closes the run; a simulated activity still
    asleep then completes into a closed run, the server answers ``NOT_FOUND
    "Completed workflow"`` and never releases its lock. Every simulated activity
    therefore completes itself (asynchronous completion through the client), so it
    sees that answer and gives the lock back;
  * **an activity that never started.** An activity cancelled while still scheduled
    (the workflow cancels the watch it scheduled one workflow task earlier, before the
    worker polled it: more likely the busier the machine), or still scheduled when its
    run closes, is dropped without its lock: no worker ever runs it, so no completion
    can notice. When the clock stalls, the ledger counts these from the runs'
    histories (``ActivityTaskCanceled``: our activities never report a cancellation,
    so each one was cancelled before it started; and, in a closed run, activities
    scheduled, never closed and never started), and gives back the ones not yet given
    back;
  * **a workflow task the server threw away.** A query or an activity cancel buffered
    behind a workflow task that continues-as-new makes the server schedule a task on
    the run it has just closed; that request throws, and with it the release of the
    task's lock (:func:`_workflow_task_left_open`). The ledger counts a closed run
    whose last workflow task never closed;
- no advance is longer than the activity's heartbeat timeout (the server enforces it
  in simulated time): a longer one is cut into chunks of ``CHUNK_S`` with a heartbeat,
  sent through the client, between them. Supervision reports, and the watch wakes, at
  most every ``REPORT_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import itertools
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol, TypeVar, cast

from temporalio import activity
from temporalio.api.enums.v1 import EventType, PendingActivityState, WorkflowExecutionStatus
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.testservice.v1 import (
    SleepRequest,
    UnlockTimeSkippingRequest,
)
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

ActivityMethod = TypeVar("ActivityMethod", bound=Callable[..., Awaitable[Any]])

REPORT_S = 3600.0
"""The simulated spec's supervision report and housekeeping interval: an hour, as a
long training job would report. Advances longer than :data:`CHUNK_S` are cut into
chunks with heartbeats between them, so an hourly report costs one activity where 570 s
cost six, and a 54-day row at 2,048 nodes makes about 1,300 reports instead of about
8,200, each of which carries every node's spec. The interval changes no figure the
simulation reports: detection never waits for a report (a failure ends supervision at
its detection time, whatever the interval), and each report still carries the step
time and δ the simulated ranks measure. It was 570 s while the housekeeping loop
swallowed a stop during garbage collection (README, "Scale: simulation"): at an hour,
the smoke run's rows met that hang, since fixed."""

CHUNK_S = 570.0
"""The longest single clock advance: below the spec's 600 s heartbeat timeout (the
clock also creeps on in real time while it is locked, a few milliseconds a call). A
longer advance is cut into chunks with a heartbeat between them, sent through the
client so that it reaches the server at once (the worker's own heartbeats are
throttled in real time and would arrive after the simulated timeout)."""

SINCE_HEARTBEAT: contextvars.ContextVar[float] = contextvars.ContextVar(
    "since_heartbeat", default=0.0
)
"""Simulated seconds the running activity has advanced since its last heartbeat (or its
start): each activity runs in its own task, so each has its own count."""


STALL_S = 3.0
"""Real seconds a clock advance may wait before the ledger counts dropped locks."""

SLEEP_RPC_TIMEOUT = timedelta(hours=6)
"""The real-time deadline of one clock advance's RPC. ``env.sleep`` sends none, so the
core client applies its default for ordinary calls, 30 s (``OTHER_CALL_TIMEOUT`` in
sdk-core), and sends it to the server as ``grpc-timeout``. An advance waits in real
time for as long as any other lock holder keeps the clock stopped: a workflow task
with every node of a 2,048-node job in it, a lock audit, a busy machine. Past 30 s the
call failed with ``RPCError: Timeout expired`` (or ``h2 protocol error``) although the
server still owned the sleep; the activity failed, its retries slept on locks nobody
balanced, and the clock stopped for good (2,048 nodes, 10 days, the ``spares 2%``
row at attempt 27). Hours, not seconds: a stopped clock is the ledger's to mend."""

ACTIVITY_CLOSE_FIELDS = (
    "activity_task_completed_event_attributes",
    "activity_task_failed_event_attributes",
    "activity_task_timed_out_event_attributes",
    "activity_task_canceled_event_attributes",
)
WORKFLOW_TASK_CLOSE_FIELDS = (
    "workflow_task_completed_event_attributes",
    "workflow_task_failed_event_attributes",
    "workflow_task_timed_out_event_attributes",
)


def _closed_scheduled_ids(events: Sequence[HistoryEvent], close_fields: Sequence[str]) -> set[int]:
    """The ``scheduled_event_id`` of every task that a close event in ``events`` ends."""
    closed = set()
    for e in events:
        name = e.WhichOneof("attributes")
        if name is not None and name in close_fields:
            closed.add(getattr(e, name).scheduled_event_id)
    return closed


def _workflow_task_left_open(events: Sequence[HistoryEvent]) -> bool:
    """Whether a closed run's last workflow task was never completed, failed or timed
    out: it dropped its lock. How (traced in the test server's source, reproduced in
    ``tests/integration/test_sim_lock_audit.py``): the server queues a lock's release
    on the request that ends its holder and applies it only if that request succeeds,
    while state changes apply at once. A query (the simulated operator's status) or an
    activity cancel buffered behind a workflow task that continues-as-new makes the
    server schedule another task on the run it has just closed; that throws, the
    worker hears "workflow execution already completed", the history stays frozen at
    ``WorkflowTaskStarted``, and the task's release is lost. Terminating a run with a
    task scheduled loses it the same way."""
    scheduled = [
        e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED
    ]
    return bool(scheduled) and scheduled[-1] not in _closed_scheduled_ids(
        events, WORKFLOW_TASK_CLOSE_FIELDS
    )


async def run_chain(
    client: Client, workflow_id: str, first_run_id: str, previous_of: dict[str, str] | None = None
) -> list[str]:
    """Every run of a workflow so far, first to latest. Walked back from the latest run
    through each run's ``continued_execution_run_id``, not forward through
    continue-as-new events: a run the test server froze at continue-as-new has none
    (:func:`_workflow_task_left_open`). ``previous_of`` caches each run's predecessor
    (empty for the first) across calls."""
    cache = previous_of if previous_of is not None else {}
    latest = await client.get_workflow_handle(workflow_id).describe()
    chain = [latest.run_id]
    while chain[-1] != first_run_id:
        previous = cache.get(chain[-1])
        if previous is None:
            handle = client.get_workflow_handle(workflow_id, run_id=chain[-1])
            async for event in handle.fetch_history_events():
                started = event.workflow_execution_started_event_attributes
                previous = started.continued_execution_run_id
                break
            cache[chain[-1]] = previous or ""
        if not previous:
            break
        chain.append(previous)
    return chain[::-1]


async def advance_clock(env: WorkflowEnvironment, seconds: float) -> None:
    """``env.sleep(seconds)`` with a deadline of :data:`SLEEP_RPC_TIMEOUT` in place of
    the client's 30 s default: release this activity's lock until the clock has moved
    ``seconds``, however long other lock holders keep it stopped in real time."""
    request = SleepRequest()
    request.duration.FromTimedelta(timedelta(seconds=seconds))
    await env.client.test_service.unlock_time_skipping_with_sleep(
        request, timeout=SLEEP_RPC_TIMEOUT
    )


class Abandoned(Exception):
    """Nobody waits for this activity any more (cancelled, or its run closed): it stops
    at a chunk boundary and changes nothing in the cluster."""


class HasLocks(Protocol):
    """What :func:`simulated` needs of the cluster whose activity it wraps."""

    locks: LockLedger


def simulated(method: ActivityMethod) -> ActivityMethod:
    """Wrap a simulated activity: note that it started, and complete it through the
    client (:meth:`LockLedger.complete`), which sees whether the server took the
    completion or dropped the activity's lock."""

    @functools.wraps(method)
    async def wrapper(self: HasLocks, request: Any) -> Any:
        info = activity.info()
        key = (info.workflow_run_id or "", info.activity_id)
        self.locks.started.add(key)
        SINCE_HEARTBEAT.set(0.0)
        try:
            result = await method(self, request)
        except Abandoned:
            self.locks.complete(key, info.task_token, None, None, cancelled=True)
        except ApplicationError as err:
            self.locks.complete(key, info.task_token, None, err)
        else:
            self.locks.complete(key, info.task_token, result, None)
        activity.raise_complete_async()

    return cast(ActivityMethod, wrapper)


@dataclass
class LockLedger:
    """The time-skipping locks the server drops, given back one for one.

    Both counts come from the server: a refused completion is its answer to that
    completion; a never-started activity is an event in a run's history, or an
    activity still ``SCHEDULED`` when its run closed. Only the *trigger* of the second
    count is a timer (a clock advance waiting :data:`STALL_S`): an audit that finds
    nothing new gives nothing back, so a slow machine costs audits, never a lock.
    An activity's retries are not covered: no simulated activity fails retryably."""

    env: WorkflowEnvironment
    workflow_id: str = ""
    first_run_id: str = ""
    started: set[tuple[str, str]] = field(default_factory=set)
    """``(run id, activity id)`` of every activity a simulated worker ran."""
    refused_completions: int = 0
    """Locks given back for completions the server refused (their run had closed)."""
    never_started: int = 0
    """Locks given back for activities dropped before they started."""
    audits: int = 0
    workflow_tasks_dropped: int = 0
    """Of ``never_started``: workflow tasks a closed run never completed
    (:func:`_workflow_task_left_open`)."""
    completion_errors: list[str] = field(default_factory=list)
    _closed_runs: dict[str, int] = field(default_factory=dict)
    """Per closed run: the locks it dropped."""
    _counted_unstarted: set[tuple[str, str]] = field(default_factory=set)
    """Activities the audit counted as abandoned before they started: should a worker
    have started one after all, its refused completion gives nothing back again."""
    _previous_run: dict[str, str] = field(default_factory=dict)
    """Per run: the run it continued (empty for the first)."""
    _sleeps: dict[int, float] = field(default_factory=dict)
    _ids: Iterator[int] = field(default_factory=itertools.count)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _watch: asyncio.Task[None] | None = None

    def complete(
        self,
        key: tuple[str, str],
        task_token: bytes,
        result: Any,
        failure: ApplicationError | None,
        *,
        cancelled: bool = False,
    ) -> None:
        """Complete (or report cancelled) the activity ``key`` (run id, activity id)
        after its function has returned (the worker must first learn that it
        completes asynchronously)."""
        task = asyncio.create_task(self._complete(key, task_token, result, failure, cancelled))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _complete(
        self,
        key: tuple[str, str],
        task_token: bytes,
        result: Any,
        failure: ApplicationError | None,
        cancelled: bool,
    ) -> None:
        handle = self.env.client.get_async_activity_handle(task_token=task_token)
        try:
            if cancelled:
                await handle.report_cancellation()
            elif failure is not None:
                await handle.fail(failure)
            else:
                await handle.complete(result)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND and "Completed workflow" in err.message:
                if key in self._counted_unstarted:
                    return  # the audit took it for never started and gave its lock back
                await self._give_back()
                self.refused_completions += 1
            else:
                self.completion_errors.append(f"{err.status.name}: {err.message}")

    async def _give_back(self) -> None:
        await self.env.client.test_service.unlock_time_skipping(UnlockTimeSkippingRequest())

    @contextlib.contextmanager
    def sleeping(self) -> Iterator[None]:
        """Mark a clock advance in progress: the watch audits when one waits too long."""
        key = next(self._ids)
        self._sleeps[key] = time.monotonic()
        try:
            yield
        finally:
            del self._sleeps[key]

    def sleeps_in_progress(self) -> list[float]:
        """Real seconds each clock advance in progress has waited so far."""
        now = time.monotonic()
        return [now - began for began in self._sleeps.values()]

    def start(self) -> None:
        self._watch = asyncio.create_task(self._watch_stalls())

    async def _watch_stalls(self) -> None:
        last_audit = 0.0
        while True:
            await asyncio.sleep(STALL_S / 4)
            now = time.monotonic()
            stalled = bool(self._sleeps) and now - min(self._sleeps.values()) >= STALL_S
            if stalled and now - last_audit >= STALL_S:
                try:
                    await self.audit()
                except RPCError as err:  # the job not started yet, a lock refused...
                    self.completion_errors.append(f"audit: {err.status.name}: {err.message}")
                last_audit = time.monotonic()

    async def audit(self) -> int:
        """Count the locks dropped in every run so far, give back the ones not yet given
        back, and return how many were given back now."""
        self.audits += 1
        dropped = 0
        runs = await self._runs()
        for index, run_id in enumerate(runs):
            if run_id in self._closed_runs:
                dropped += self._closed_runs[run_id]
                continue
            handle = self.env.client.get_workflow_handle(self.workflow_id, run_id=run_id)
            # Described first: a history fetched before the run closed can end in the
            # workflow task that was closing it, and was read as a dropped task. The
            # lock given back for it unbalanced the count, and the clock ran free to
            # the test server's 10-year execution timeout (a 54-day row, day 2.4).
            description = (await handle.describe()).raw_description
            events = (await handle.fetch_history()).events
            count = self._cancelled_before_start(run_id, events)
            still_open = (
                index == len(runs) - 1
                and description.workflow_execution_info.status
                == WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING
            )
            if still_open:
                dropped += count  # it may drop more later
                break
            count += self._abandoned_unstarted(run_id, events, description.pending_activities)
            if _workflow_task_left_open(events):
                count += 1
                self.workflow_tasks_dropped += 1
            self._closed_runs[run_id] = count
            dropped += count
        due = dropped - self.never_started
        for _ in range(due):
            await self._give_back()
            self.never_started += 1
        return max(0, due)

    async def _runs(self) -> list[str]:
        return await run_chain(
            self.env.client, self.workflow_id, self.first_run_id, self._previous_run
        )

    def _cancelled_before_start(self, run_id: str, events: Sequence[HistoryEvent]) -> int:
        """``ActivityTaskCanceled`` events of activities no simulated worker ran. A
        simulated activity never reports a cancellation: each such event is the server
        cancelling an activity that was still scheduled."""
        scheduled = {
            e.event_id: e.activity_task_scheduled_event_attributes.activity_id
            for e in events
            if e.HasField("activity_task_scheduled_event_attributes")
        }
        return sum(
            1
            for e in events
            if e.HasField("activity_task_canceled_event_attributes")
            and (
                run_id,
                scheduled.get(e.activity_task_canceled_event_attributes.scheduled_event_id, ""),
            )
            not in self.started
        )

    def _abandoned_unstarted(
        self,
        run_id: str,
        events: Sequence[HistoryEvent],
        pending: Sequence[PendingActivityInfo],
    ) -> int:
        """Activities of a closed run that were scheduled, never closed in its history,
        and never started: each holds the lock its scheduling took. Two ways lead here:
        still scheduled when the run closed, or cancelled by the completion that closed
        it when the server threw that completion's events (and releases) away."""
        closed = _closed_scheduled_ids(events, ACTIVITY_CLOSE_FIELDS)
        started_on_server = {
            info.activity_id
            for info in pending
            if info.state != PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED
        }
        abandoned = 0
        for e in events:
            if not e.HasField("activity_task_scheduled_event_attributes") or e.event_id in closed:
                continue
            key = (run_id, e.activity_task_scheduled_event_attributes.activity_id)
            if key in self.started or key[1] in started_on_server:
                continue  # its own completion, refused, gives its lock back
            self._counted_unstarted.add(key)
            abandoned += 1
        return abandoned

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def figures(self) -> dict[str, Any]:
        return {
            "refused_completions": self.refused_completions,
            "never_started": self.never_started,
            "audits": self.audits,
            "workflow_tasks_dropped": self.workflow_tasks_dropped,
            "completion_errors": self.completion_errors[:10],
        }
