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
import json
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NoReturn, TypeVar, cast

from temporalio import activity
from temporalio.api.enums.v1 import EventType, PendingActivityState, WorkflowExecutionStatus
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.testservice.v1 import SleepRequest, UnlockTimeSkippingRequest
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.client import AsyncActivityCancelledError, Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from activities.stand_ins import StandIn, launched_without_ranks, stand_ins
from bench.sim_model import (
    DAY_S,
    ClusterTrace,
    CostModel,
    FailureEvent,
    Ledger,
    effective_step_s,
    memory_snapshot_s,
    newest_snapshot,
    progress_at,
    snapshot_reachable,
)
from lazarus.domain import contracts
from lazarus.domain.activity_refs import ALL, FLEET_CALLS
from lazarus.domain.api import (
    FLEET_QUERY_STATUS,
    FLEET_UPDATE_RETURN,
    QUERY_STATUS,
    SIGNAL_RESUME,
    UPDATE_RETURN,
)
from lazarus.domain.fleet import FleetStatus, NodeState, ReturnRequest

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

PROBATION_COMMAND = ["sim-probation"]
"""The fleet's probation health command in the simulation (never run as a program):
:meth:`SimCluster.preflight` answers it from the repair model, without moving the
job's clock."""

OPERATOR_HOLD_S = 300.0
"""The longest the checkpoint watch holds the clock, in real seconds, while the simulated
operator acts (:meth:`SimCluster._hold_for_operator`): below the heartbeat timeout, as
a held clock creeps on in real time."""

OPERATOR_HEARTBEAT_S = 30.0
"""Real seconds between the holding watch's heartbeats."""

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


def simulated(method: ActivityMethod) -> ActivityMethod:
    """Wrap a simulated activity: note that it started, and complete it through the
    client (:meth:`LockLedger.complete`), which sees whether the server took the
    completion or dropped the activity's lock."""

    @functools.wraps(method)
    async def wrapper(self: SimCluster, request: Any) -> Any:
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


@dataclass
class Generation:
    number: int
    nodes: frozenset[str]
    resume_step: int
    every: int
    launched_at: float
    first_step_at: float
    first_step_reported: bool = False
    frozen_at: float | None = None
    """When its ranks stopped stepping (the fault, or the stop)."""
    segment_step: int = 0
    """The step at which the interval in force took effect (``resume_step`` at first)."""
    segment_at: float = 0.0
    """When it took effect (``first_step_at`` at first)."""
    committed_before: int | None = None
    """The newest checkpoint committed under earlier intervals of this generation."""
    blocked_before: float = 0.0
    """Seconds blocked in checkpoints under earlier intervals of this generation."""
    interval_changes: int = 0
    order: tuple[str, ...] = ()
    """Its nodes in rank order: which slot each holds (the memory tier's buddy ring)."""
    step_s: float = 0.0
    """A step's wall time, the memory tier's snapshots included."""
    memory_every: int = 0
    """The spec's ``checkpoints.memory_every_steps`` (0: the memory tier is off)."""
    replicas: bool = False
    """The spec's ``checkpoints.memory_replicas``."""
    final_outcome: contracts.SuperviseOutcome | None = None
    """The failure (or success) that froze it: delivered again to a supervision of it
    that asks later (the one that carried it was cancelled, or its run had closed)."""

    def __post_init__(self) -> None:
        self.segment_step = self.resume_step
        self.segment_at = self.first_step_at


def stops_generation(request: contracts.StopRequest, gen: Generation) -> bool:
    """Whether a stop reaches the running generation's ranks: it does not keep that
    generation, and it targets one of its nodes (no nodes: this machine, taken as all)."""
    if request.keep_generation == gen.number:
        return False
    targets = {n.name for n in request.access.nodes} - set(request.skip_nodes)
    return not request.access.nodes or bool(targets & gen.nodes)


def stop_reach(request: contracts.StopRequest, gen: Generation | None) -> int:
    """How many nodes a stop reaches: the ones it names (a rejoin's replacement names
    only the failed node), or the generation's (none named: this machine, taken as all)."""
    targets = {n.name for n in request.access.nodes} - set(request.skip_nodes)
    if targets:
        return len(targets)
    return len(gen.nodes) if gen is not None else 1


def carried_ranks(
    request: contracts.LaunchRequest, previous: Generation | None, nodes: list[str]
) -> list[int]:
    """The ranks the launch carries over (``rejoin_ranks``), as the launcher does: only
    into a slot that names the same node as in the generation they ran in (a rank's
    node is ``rank // nproc_per_node``), from the generation that ran before it."""
    if not request.rejoin_ranks or previous is None:
        return []
    per_node = request.spec.nproc_per_node
    if previous.number >= request.generation or len(previous.order) != len(nodes):
        return []
    return [
        rank
        for rank in sorted(set(request.rejoin_ranks))
        if rank < len(nodes) * per_node
        and previous.order[rank // per_node] == nodes[rank // per_node]
    ]


def starting_nodes(node_count: int, per_node: int, carried: list[int]) -> int:
    """Nodes that start at least one rank afresh (import, load) in a launch that
    carries ``carried``: all of them without rejoin, the failed node's with it."""
    kept = set(carried)
    return sum(
        1
        for node in range(node_count)
        if any(rank not in kept for rank in range(node * per_node, (node + 1) * per_node))
    )


def _page_reason(request: contracts.EscalationHookRequest) -> str:
    """The reason the job gave its operator, from the hook's stdin document."""
    try:
        return str(json.loads(request.payload).get("reason", ""))[:200]
    except ValueError:
        return "(payload is not JSON)"


def fault_reported_first(fault_at: float, first_step_at: float | None) -> bool:
    """Whether a supervision report carries the fault rather than the generation's
    first step (``first_step_at``: due in this report, else None). A fault after the
    first step waits for the next report, as the real supervision sees the step first.
    Reporting the fault instead left the generation without its first step: the
    workflow never sent it the tuned interval, so it trained on the spec's hourly one
    and lost up to an hour of work at that fault."""
    return first_step_at is None or fault_at < first_step_at


@dataclass
class Interruption:
    at_s: float
    node: str
    category: str
    kind: str
    detected_at_s: float
    step_at_fault: int
    resume_step: int | None = None
    first_step_at_s: float | None = None


@dataclass
class SimCluster:
    env: WorkflowEnvironment
    trace: ClusterTrace
    costs: CostModel
    horizon_s: float
    operator_delay_s: float
    repair_s: float = math.inf
    """A broken node works again this long after its fault (the repair shop's turn-
    around): the fleet's probation then finds it healthy. inf: only the operator
    repairs, when paged."""
    fleet_id: str | None = None
    """The fleet workflow's id, in the rows that lease from one: the paged operator
    repairs its handed-back nodes too."""
    started: datetime | None = None
    workflow_id: str = ""
    client: Client | None = None
    generation: Generation | None = None
    committed: int | None = None
    broken: dict[str, float] = field(default_factory=dict)
    """Nodes down for good until repaired, and when their repair is done."""
    cursor: int = 0
    interruptions: list[Interruption] = field(default_factory=list)
    ledger: Ledger = field(default_factory=Ledger)
    checkpointing_s: float = 0.0
    memory_snapshots_s: float = 0.0
    """Seconds the ranks were held back by memory snapshots and their replica pushes."""
    memory: dict[str, int] = field(default_factory=dict)
    """Resume searches by what served them: ``memory`` (every node held the snapshot),
    ``replica`` (some copied it from a buddy), ``disk (a snapshot lost)`` (a new node's
    buddy was replaced too) or ``disk (as new or newer)`` (a disk checkpoint at or past
    the snapshot)."""
    restarts: Counter[str] = field(default_factory=Counter)
    """Launches by how they started the ranks: ``rejoin`` (survivors carried over in
    place) or ``whole_generation`` (the first launch included)."""
    final_step: int = 0
    operator_actions: list[str] = field(default_factory=list)
    operator_due_s: float | None = None
    """When the simulated operator acts on the page it got (None: no page pending)."""
    pages: list[dict[str, Any]] = field(default_factory=list)
    """Each page as the operator found it: why the job asked, the job's spares, and
    the fleet's free nodes by why none could be leased (repair, probation, lemon)."""
    interval_changes: list[tuple[float, int]] = field(default_factory=list)
    """``(time, every_steps)`` for each interval the workflow sent (``interval: auto``)."""
    placed: set[str] = field(default_factory=set)
    """Every node a generation was launched on."""
    locks: LockLedger = field(init=False)
    overran: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the clock is a day past the horizon and the job still runs activities."""
    _operators: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.locks = LockLedger(self.env)

    # ------------------------------------------------------------------ the clock

    async def now(self) -> float:
        current = await self.env.get_current_time()
        if self.started is None:
            self.started = current
        seconds = (current - self.started).total_seconds()
        if seconds > self.horizon_s + DAY_S:
            self.overran.set()
        return seconds

    async def advance(self, seconds: float, phase: str | None = None) -> None:
        """Move the clock ``seconds`` for the running activity, heartbeating before any
        chunk that would take it past :data:`CHUNK_S` since its last heartbeat (or its
        start). The count spans the activity's successive advances: a failure's run-up
        then its detection (up to the hang timeout) are two advances, and one heartbeat
        per advance let them add up past the heartbeat timeout (at 2,048 nodes, seed 1,
        54 days: a supervision retried at day 1.07 while its first attempt still slept,
        and the clock stopped there)."""
        left = seconds
        while left > 0:
            chunk = min(left, CHUNK_S)
            if SINCE_HEARTBEAT.get() + chunk > CHUNK_S:
                await self._heartbeat()
                SINCE_HEARTBEAT.set(0.0)
            with self.locks.sleeping():
                await advance_clock(self.env, chunk)
            SINCE_HEARTBEAT.set(SINCE_HEARTBEAT.get() + chunk)
            left -= chunk
        if phase is not None:
            self.ledger.add(phase, max(0.0, seconds))

    async def _heartbeat(self) -> None:
        """Between chunks of a long advance: tell the server the activity lives, and
        stop (:class:`Abandoned`) if nobody waits for it any more."""
        handle = self.env.client.get_async_activity_handle(task_token=activity.info().task_token)
        try:
            await handle.heartbeat()
        except AsyncActivityCancelledError as err:
            raise Abandoned("cancelled") from err
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise Abandoned(err.message) from err
            raise

    # --------------------------------------------------------------- the training

    def _progress(self, gen: Generation, at: float) -> tuple[int, int | None, float]:
        """Step, newest committed checkpoint and seconds blocked in checkpoints of ``gen``
        at ``at``, across the intervals it was sent."""
        if at < gen.segment_at:
            return gen.segment_step, gen.committed_before, gen.blocked_before
        p = progress_at(
            gen.segment_step,
            at - gen.segment_at,
            gen.every,
            gen.step_s,
            self.costs.checkpoint_s,
        )
        checkpoint = p.checkpoint_step
        if gen.committed_before is not None:
            checkpoint = max(checkpoint or 0, gen.committed_before)
        return p.step, checkpoint, gen.blocked_before + p.checkpointing_s

    def _change_interval(self, gen: Generation, at: float, every: int) -> None:
        """The ranks follow a new interval from their next step (``should_checkpoint``
        reads the control file each step)."""
        if at > gen.segment_at:
            step, checkpoint, blocked = self._progress(gen, at)
            gen.segment_step, gen.segment_at = step, at
            gen.committed_before, gen.blocked_before = checkpoint, blocked
        gen.every = every
        gen.interval_changes += 1

    def _freeze(self, at: float) -> int:
        gen = self.generation
        if gen is None:
            return self.final_step
        if gen.frozen_at is None:
            gen.frozen_at = at
            step, checkpoint, blocked = self._progress(gen, at)
            self.checkpointing_s += blocked
            self.memory_snapshots_s += max(0, step - gen.resume_step) * (
                gen.step_s - self.costs.step_s
            )
            if checkpoint is not None:
                self.committed = max(checkpoint, self.committed or 0)
            self.final_step = step
        return self._progress(gen, gen.frozen_at)[0]

    def _newest_committed(self, at: float) -> int | None:
        gen = self.generation
        if gen is not None and gen.frozen_at is None:
            checkpoint = self._progress(gen, at)[1]
            if checkpoint is not None:
                return max(checkpoint, self.committed or 0)
        return self.committed

    def _consume_until(self, at: float, running: frozenset[str]) -> FailureEvent | None:
        """Walk the trace up to ``at``: the first failure on a node of the running
        generation is returned (not consumed); failures elsewhere break hardware."""
        events = self.trace.events
        while self.cursor < len(events) and events[self.cursor].at_s <= at:
            event = events[self.cursor]
            if event.node in running:
                return event
            if event.share.hardware:
                self._break(event.node, event.at_s)
            self.cursor += 1
        return None

    # ----------------------------------------------------------------- activities

    @simulated
    async def launch(self, request: contracts.LaunchRequest) -> contracts.LaunchResult:
        now = await self.now()
        await self.advance(self.costs.launch_s, "launch")
        launched = now + self.costs.launch_s
        self._freeze(now)
        nodes = [n.name for n in (request.nodes or request.spec.nodes)]
        resume = request.resume.step if request.resume is not None else 0
        if self.interruptions and self.interruptions[-1].resume_step is None:
            self.interruptions[-1].resume_step = resume
        self.placed.update(nodes)
        rejoined = carried_ranks(request, self.generation, nodes)
        starting = starting_nodes(len(nodes), request.spec.nproc_per_node, rejoined)
        self.restarts["rejoin" if rejoined else "whole_generation"] += 1
        checkpoints = request.spec.checkpoints
        memory_every = checkpoints.memory_every_steps or 0
        step_s = effective_step_s(
            self.costs.step_s,
            memory_every,
            memory_snapshot_s(checkpoints.memory_replicas, gpus_per_node=self.costs.gpus_per_node),
        )
        self.generation = Generation(
            number=request.generation,
            nodes=frozenset(nodes),
            resume_step=resume,
            every=request.spec.checkpoints.every_steps or 0,
            launched_at=launched,
            first_step_at=launched + self.costs.startup_of_s(starting),
            order=tuple(nodes),
            step_s=step_s,
            memory_every=memory_every,
            replicas=checkpoints.memory_replicas,
        )
        return launched_without_ranks(request, self._wall(launched), "10.0.0.1", rejoined=rejoined)

    def _wall(self, at: float) -> float:
        assert self.started is not None
        return self.started.timestamp() + at

    @simulated
    async def supervise(self, request: contracts.SuperviseRequest) -> contracts.SuperviseOutcome:
        now = await self.now()
        gen = self.generation
        if gen is not None and gen.number == request.generation and gen.final_outcome:
            return gen.final_outcome
        if gen is None or gen.number != request.generation or gen.frozen_at is not None:
            return contracts.SuperviseOutcome(
                kind="progress", generation=request.generation, observed_at=self._wall(now)
            )
        end = min(now + min(request.report_after_s, REPORT_S), self.horizon_s)
        event = self._consume_until(end, gen.nodes)
        first_step_due = (
            request.report_first_step and not gen.first_step_reported and gen.first_step_at <= end
        )
        if event is not None and fault_reported_first(
            event.at_s, gen.first_step_at if first_step_due else None
        ):
            detected = max(event.at_s, now) + self.costs.detection_s(event.share.kind)
            if detected <= end:
                return await self._fail(gen, event, now, detected)
        if first_step_due:
            await self.advance(max(0.0, gen.first_step_at - now), "startup")
            gen.first_step_reported = True
            last = self.interruptions[-1] if self.interruptions else None
            if last is not None and last.first_step_at_s is None:
                last.first_step_at_s = gen.first_step_at
            return contracts.SuperviseOutcome(
                kind="first_step",
                generation=gen.number,
                observed_at=self._wall(gen.first_step_at),
                first_step_at=self._wall(gen.first_step_at),
                step=gen.resume_step + 1,
                seconds_per_step=gen.step_s,
            )
        await self.advance(end - now, "running")
        step = self._progress(gen, end)[0]
        if end >= self.horizon_s:
            self._freeze(end)
            gen.final_outcome = contracts.SuperviseOutcome(
                kind="succeeded", generation=gen.number, observed_at=self._wall(end), step=step
            )
            return gen.final_outcome
        return contracts.SuperviseOutcome(
            kind="progress",
            generation=gen.number,
            observed_at=self._wall(end),
            step=step,
            seconds_per_step=gen.step_s,
            progress_signal="heartbeat",
            checkpoint_save_s=self._save_s(gen),
        )

    def _save_s(self, gen: Generation) -> float | None:
        """δ as the ranks would measure it: known once this generation has saved."""
        if gen.every <= 0 or gen.frozen_at is not None:
            return None
        return self.costs.checkpoint_s

    async def _fail(
        self, gen: Generation, event: FailureEvent, now: float, detected: float
    ) -> contracts.SuperviseOutcome:
        fault = max(event.at_s, now)
        await self.advance(fault - now, "running")
        await self.advance(detected - fault, "detection")
        if gen.final_outcome is not None:
            return gen.final_outcome  # a supervision of an older run got there first
        self.cursor += 1
        step = self._freeze(fault)
        if event.share.hardware:
            self._break(event.node, fault)
        self.interruptions.append(
            Interruption(fault, event.node, event.share.name, event.share.kind, detected, step)
        )
        rank = sorted(gen.nodes).index(event.node)
        gen.final_outcome = contracts.SuperviseOutcome(
            kind="failed",
            generation=gen.number,
            observed_at=self._wall(detected),
            step=step,
            failure=contracts.FailureReport(
                kind=event.share.kind,
                failure_class=event.share.failure_class,
                rank=rank,
                node=event.node,
                exit_code=1 if event.share.kind == "crash" else None,
                evidence=[f"simulated {event.share.name} on {event.node}"],
                fault_at=self._wall(fault),
                detected_at=self._wall(detected),
                step_at_failure=step,
            ),
        )
        return gen.final_outcome

    @simulated
    async def stop(self, request: contracts.StopRequest) -> contracts.StopResult:
        now = await self.now()
        gen = self.generation
        if gen is not None and gen.frozen_at is None and not stops_generation(request, gen):
            # A stop beside the running generation (a quarantined node's zygote before
            # its hand-back, with warm_start): its ranks train on. Freezing them here
            # left supervision answering "no step" forever (54 days, seed 1, day 35.5).
            await self.advance(self.costs.stop_s)
            return contracts.StopResult(
                generations=[],
                signalled_groups=0,
                killed_groups=0,
                last_step=self._progress(gen, now + self.costs.stop_s)[0],
            )
        if not self._operator_acting(now):  # their fence stops are part of their delay
            await self.advance(self.costs.stop_of_s(stop_reach(request, gen)), "stop")
        last = self._freeze(now)
        return contracts.StopResult(
            generations=[], signalled_groups=0, killed_groups=0, last_step=last
        )

    @simulated
    async def preflight(
        self, request: contracts.PreflightActivityRequest
    ) -> contracts.PreflightReport:
        """The job's preflight before a launch (it costs the job time), or the fleet's
        probation round (:data:`PROBATION_COMMAND`: beside the job, free)."""
        now = await self.now()
        if request.checks.health_command != PROBATION_COMMAND:
            await self.advance(self.costs.preflight_s, "preflight")
            self._consume_until(now + self.costs.preflight_s, frozenset())
            now += self.costs.preflight_s
        return contracts.PreflightReport(
            nodes=[
                contracts.NodeHealth(
                    node=n.name,
                    ok=not self._is_broken(n.name, now),
                    problems=["simulated: GPU/host down"] if self._is_broken(n.name, now) else [],
                )
                for n in request.access.nodes
            ]
        )

    def _break(self, node: str, at: float) -> None:
        self.broken[node] = at + self.repair_s

    def _is_broken(self, node: str, now: float) -> bool:
        """Down, and its repair not done by ``now`` (a repaired node is forgotten)."""
        if node in self.broken and now >= self.broken[node]:
            del self.broken[node]
        return node in self.broken

    @simulated
    async def find_verified_checkpoint(
        self, request: contracts.FindVerifiedCheckpointRequest
    ) -> contracts.CheckpointSearch:
        now = await self.now()
        await self.advance(self.costs.search_s, "resume_search")
        memory = await self._memory_resume(request)
        if memory is not None:
            return memory
        step = self._newest_committed(now)
        if step is None or step in request.exclude_steps:
            return contracts.CheckpointSearch()
        if request.below_step is not None and step >= request.below_step:
            return contracts.CheckpointSearch()
        return contracts.CheckpointSearch(
            chosen=contracts.CheckpointRef(
                step=step, path=f"{request.checkpoint_dir}/step-{step:08d}"
            ),
            location="local",
        )

    async def _memory_resume(
        self, request: contracts.FindVerifiedCheckpointRequest
    ) -> contracts.CheckpointSearch | None:
        """The memory tier's answer (``memory_dir``: the spec's ``memory_every_steps``):
        the newest snapshot of the stopped generation, when every relaunch node holds
        it or can copy it from its slot's buddy (:func:`snapshot_reachable`; each copy
        costs the measured restore, in parallel). None: disk serves."""
        gen = self.generation
        if request.memory_dir is None or gen is None or gen.frozen_at is None:
            return None
        if gen.memory_every <= 0:
            return None
        after = [n.name for n in request.access.nodes]
        reachable, copies = snapshot_reachable(list(gen.order), after, gen.replicas)
        frozen = self._progress(gen, gen.frozen_at)[0]
        step = newest_snapshot(frozen, gen.resume_step, gen.memory_every)
        disk = self.committed or 0
        if not reachable or step <= disk or step in request.exclude_steps:
            why = "disk (a snapshot lost)" if not reachable else "disk (as new or newer)"
            self.memory[why] = self.memory.get(why, 0) + 1
            return None
        if copies:
            await self.advance(self.costs.replica_restore_s, "replica_restore")
        served = "replica" if copies else "memory"
        self.memory[served] = self.memory.get(served, 0) + 1
        path = f"{request.memory_dir}/step-{step:08d}"
        return contracts.CheckpointSearch(
            chosen=contracts.CheckpointRef(step=step, path=path),
            location="memory",
            memory_restored=[f"step {step} restored from a buddy's replica"] * copies,
        )

    @simulated
    async def watch_checkpoints(
        self, request: contracts.WatchCheckpointsRequest
    ) -> contracts.CheckpointRef | None:
        now = await self.now()
        wait = min(max(request.min_interval_s, 1.0), REPORT_S)
        if self.operator_due_s is not None and self.operator_due_s > now:
            wait = min(wait, self.operator_due_s - now)  # the clock stops for the operator
        elif self.operator_due_s is not None:
            await self._hold_for_operator()
        await self.advance(wait)
        step = self._newest_committed(now + wait)
        if step is None or (
            request.newer_than_step is not None and step <= request.newer_than_step
        ):
            return None
        path = f"sim/step-{step:08d}"
        stamp = contracts.FileStamp(size=1, mtime_ns=step)
        verified = contracts.VerifiedCheckpoint(
            step=step, path=path, files={"state.pt": stamp}, verified_at=self._wall(now + wait)
        )
        return contracts.CheckpointRef(step=step, path=path, verified=verified)

    @simulated
    async def collect_garbage(
        self, request: contracts.GarbageCollectionRequest
    ) -> contracts.GarbageCollectionResult:
        return contracts.GarbageCollectionResult()

    @simulated
    async def checkpoint_now(
        self, request: contracts.CheckpointNowRequest
    ) -> contracts.CheckpointNowResult:
        return contracts.CheckpointNowResult(checkpoint=None, waited_s=0.0)

    @simulated
    async def roll_back_checkpoint(
        self, request: contracts.RollbackRequest
    ) -> contracts.RollbackResult:
        return contracts.RollbackResult(retired=[], resume=None)

    @simulated
    async def _no_durable_tier(self, request: object) -> NoReturn:
        raise ApplicationError("no durable tier in the simulation", non_retryable=True)

    restore_checkpoint = upload_checkpoint = _no_durable_tier
    """Every checkpoint of the simulation stays where it was written."""

    @simulated
    async def _no_slurm(self, request: object) -> NoReturn:
        raise ApplicationError("no Slurm in the simulation", non_retryable=True)

    submit_allocation = cancel_allocation = grow_allocation = _no_slurm
    """The simulated nodes are local ones: no allocation to submit or grow."""

    @simulated
    async def run_escalation_hook(
        self, request: contracts.EscalationHookRequest
    ) -> contracts.EscalationHookResult:
        """The page reaches the simulated operator, who acts ``operator_delay_s`` later
        (:meth:`_operate`, a task beside the worker: the hook itself returns now)."""
        now = await self.now()
        if self.operator_due_s is None:
            self.operator_due_s = now + self.operator_delay_s
            self.pages.append({"day": round(now / DAY_S, 3), "why": _page_reason(request)})
            self._operators.append(asyncio.create_task(self._operate(now)))
        return contracts.EscalationHookResult(ran=True, exit_code=0)

    async def _hold_for_operator(self) -> None:
        """The operator's moment has come, and their calls take real time: a status
        query, one ``return`` update per quarantined node, the resume signal. Between
        two of them only this watch would be asleep, and the clock would skip to its
        next wake, up to an hour (0.7% of a 10-day row at 2,048 nodes went that way,
        counted as "other"). So the watch keeps its lock without sleeping until the
        operator is done, and the clock stands still (it creeps on in real time, so
        the watch heartbeats). The fence stop of each node they return counts as part
        of their delay: :meth:`stop` does not move the clock while they act. Holding
        that time for a later advance instead put it on whichever activity advanced
        next. Given the fence stops of dozens of returned nodes, such an activity can
        outrun its start-to-close timeout (a stop's is its grace plus 60 s), and a
        54-day row's clock stopped on a completion the server refused as an "unknown
        activity": that cause is inferred, not traced."""
        deadline = time.monotonic() + OPERATOR_HOLD_S
        beat = time.monotonic()
        while self.operator_due_s is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            if time.monotonic() - beat > OPERATOR_HEARTBEAT_S:
                await self._heartbeat()
                beat = time.monotonic()
        await self._heartbeat()
        SINCE_HEARTBEAT.set(0.0)

    def _operator_acting(self, now: float) -> bool:
        return self.operator_due_s is not None and now >= self.operator_due_s

    async def _operate(self, paged_at: float) -> None:
        """Wait for the clock to reach the operator's moment (it never sleeps: outside
        an activity that would unbalance the time-skipping lock; the checkpoint watch
        stops the clock there), repair and return every quarantined node
        (``lazarus return``), and resume the job."""
        assert self.client is not None and self.operator_due_s is not None
        while await self.now() < self.operator_due_s:
            await asyncio.sleep(0.005)
        self.ledger.add("operator_wait", await self.now() - paged_at)
        handle = self.client.get_workflow_handle(self.workflow_id)
        status: Any = await handle.query(QUERY_STATUS)
        found: dict[str, Any] = {"job_spares": len(status["nodes"].get("spares", []))}
        if self.fleet_id is not None:
            found["fleet"] = await self._fleet_at_page(self.fleet_id, await self.now())
        if self.pages:
            self.pages[-1].update(found)
        for node in [q["node"] for q in status["nodes"]["quarantined"]]:
            self.broken.pop(node, None)  # the operator repairs it
            try:
                await handle.execute_update(UPDATE_RETURN, {"node": node})
            except Exception as err:
                self.operator_actions.append(f"return {node} refused: {err}")
            else:
                self.operator_actions.append(f"return {node}")
        if self.fleet_id is not None:
            await self._repair_in_fleet(self.fleet_id)
        self.operator_due_s = None
        await handle.signal(SIGNAL_RESUME)
        self.operator_actions.append("resume")

    async def _fleet_at_page(self, fleet_id: str, now: float) -> dict[str, int]:
        """The fleet's nodes that are no job's, by why none of them could replace a
        lost node: the page's diagnosis."""
        assert self.client is not None
        handle = self.client.get_workflow_handle(fleet_id)
        status = await handle.query(FLEET_QUERY_STATUS, result_type=FleetStatus)
        found: Counter[str] = Counter()
        for view in status.nodes:
            if view.job:
                continue
            if view.lemon:
                found[f"{view.state.value}, lemon"] += 1
            elif view.state in (NodeState.QUARANTINED, NodeState.PROBATION):
                repaired = not self._is_broken(view.name, now)
                found[f"{view.state.value}, {'repaired' if repaired else 'in repair'}"] += 1
            else:
                found[view.state.value] += 1
        return dict(sorted(found.items()))

    async def _repair_in_fleet(self, fleet_id: str) -> None:
        """The nodes the job handed back are the fleet's now: the operator repairs
        them as well, and returns each (``lazarus fleet return --fenced``: checked by
        hand). Nodes the fleet still counts as the job's are left to the job's return
        above, so no node is ever both a job's spare and free in the fleet."""
        assert self.client is not None
        handle = self.client.get_workflow_handle(fleet_id)
        status = await handle.query(FLEET_QUERY_STATUS, result_type=FleetStatus)
        for view in status.nodes:
            if view.state not in (NodeState.QUARANTINED, NodeState.PROBATION) or view.job:
                continue
            self.broken.pop(view.name, None)
            try:
                await handle.execute_update(
                    FLEET_UPDATE_RETURN, ReturnRequest(node=view.name, fenced=True)
                )
            except Exception as err:
                self.operator_actions.append(f"fleet return {view.name} refused: {err}")
            else:
                self.operator_actions.append(f"fleet return {view.name}")

    @simulated
    async def set_checkpoint_interval(
        self, request: contracts.SetCheckpointIntervalRequest
    ) -> contracts.SetCheckpointIntervalResult:
        """``checkpoints.interval: auto``: the ranks of the live generation follow it."""
        now = await self.now()
        gen = self.generation
        if gen is not None and gen.frozen_at is None:
            self._change_interval(gen, now, request.checkpoint_every_steps)
            self.interval_changes.append((now, request.checkpoint_every_steps))
        return contracts.SetCheckpointIntervalResult(nodes=[n.name for n in request.access.nodes])

    def activities(self) -> list[StandIn]:
        """This cluster's methods as the activities the workflow calls, every one but
        the fleet's (the simulation runs the real fleet calls)."""
        return stand_ins(self, [ref for ref in ALL if ref not in FLEET_CALLS])

    async def close(self) -> None:
        """End the operator tasks and the lock ledger; an operator task that failed is
        noted in ``operator_actions``."""
        await self.locks.close()
        for task in self._operators:
            if not task.done():
                task.cancel()
        results = await asyncio.gather(*self._operators, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                self.operator_actions.append(f"operator failed: {result!r}")
