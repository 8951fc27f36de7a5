"""``JobClient``: the supported Python API for starting and steering Lazarus jobs.

Modelled on TorchX's scheduler API: a few typed calls, a dry run that is the first
half of a start (:meth:`JobClient.dry_run` returns the :class:`StartPlan` that
:meth:`JobClient.start` would submit, and ``start`` accepts that plan), and a
cancel that is safe to repeat. The CLI, the demo and the benches all go through
it, so every caller sees one status merge and one set of errors.

Jobs are addressed by name (or by the :class:`JobHandle` that ``start`` returned);
the workflow id, signal, update and query names come from :mod:`lazarus.domain.api`.

Errors a person can act on are :class:`ClientError` subclasses whose message is one
line meant for them (the CLI prints it as is); a server that cannot be reached is
:class:`~lazarus.app.settings.ServerUnreachable`, exactly as :func:`~lazarus.app.settings.connect`
raises it. No :class:`temporalio.service.RPCError` escapes a ``JobClient`` call.

It imports no activity (issue 40, part 2: "the CLI is a client"): what needs the
nodes, the checkpoint store or the worker's environment (start's checks, ``--fresh``,
the resume point, a dry run's node and rank plan, listing and verifying checkpoints)
is a typed call to a worker (:meth:`JobClient.check_start`,
:meth:`JobClient.list_checkpoints`, :meth:`JobClient.verify_checkpoints`), run as the
short workflow :class:`workflows.worker_call.WorkerCallWorkflow`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowHistory,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from lazarus.app.client_errors import (
    ClientError as ClientError,
)
from lazarus.app.client_errors import (
    JobAlreadyRunning as JobAlreadyRunning,
)
from lazarus.app.client_errors import (
    JobClosed as JobClosed,
)
from lazarus.app.client_errors import (
    JobEndedWithoutResult as JobEndedWithoutResult,
)
from lazarus.app.client_errors import (
    JobNotFound as JobNotFound,
)
from lazarus.app.client_errors import (
    MissingSearchAttributes as MissingSearchAttributes,
)
from lazarus.app.client_errors import (
    NotAJob as NotAJob,
)
from lazarus.app.client_errors import NoWorker as NoWorker
from lazarus.app.client_errors import (
    RequestRejected as RequestRejected,
)
from lazarus.app.client_errors import (
    StatusUnavailable as StatusUnavailable,
)
from lazarus.app.client_errors import (
    TemporalRefused as TemporalRefused,
)
from lazarus.app.client_errors import WorkerCallFailed as WorkerCallFailed
from lazarus.app.outcome import Outcome, outcome_of
from lazarus.app.settings import ConnectionSettings, ServerUnreachable, connect
from lazarus.app.worker_client import WorkerCalls
from lazarus.domain.activity_refs import SUBMIT_ALLOCATION
from lazarus.domain.api import (
    DEFAULT_TASK_QUEUE,
    JOB_ATTRIBUTE,
    PHASE_ATTRIBUTE,
    QUERY_STATUS,
    SIGNAL_PAUSE,
    SIGNAL_RESUME,
    STEP_ATTRIBUTE,
    UPDATE_DRAIN,
    UPDATE_RECOVER,
    UPDATE_RETURN,
    WORKFLOW_TYPE,
    job_name_from,
    workflow_id_for,
)
from lazarus.domain.contracts import SupervisionProgress
from lazarus.domain.job_view import ForceRecover, Incident, JobStatus, NodeRequest, Phase
from lazarus.domain.spec import JobSpec, SpecError
from lazarus.domain.spec_base import job_name_problem
from lazarus.domain.worker_calls import (
    NodePlan,
    StartCheckResult,
)
from workflows.current_details import start_details, start_summary
from workflows.state import JobInput

__all__ = [
    "CancelResult",
    "ClientError",
    "JobAlreadyRunning",
    "JobClient",
    "JobClosed",
    "JobEndedWithoutResult",
    "JobHandle",
    "JobNotFound",
    "JobRef",
    "JobRow",
    "MissingSearchAttributes",
    "NoWorker",
    "NotAJob",
    "RequestRejected",
    "ServerUnreachable",
    "StartPlan",
    "StatusUnavailable",
    "StatusView",
    "TemporalRefused",
    "WaitResult",
    "WorkerCallFailed",
    "plan_start",
]

SUPERVISE_ACTIVITY = "supervise"
SUBMIT_ACTIVITY = SUBMIT_ALLOCATION.name
"""The activity a submit-mode job's first step waits in (``SUBMIT_ALLOCATION``); its
heartbeat details are the queue wait's latest line."""
QUERY_TIMEOUT = timedelta(seconds=5)
"""A query needs a worker; without one it would wait for the server's long deadline."""

PAUSABLE = (Phase.PENDING, Phase.LAUNCHING, Phase.RUNNING, Phase.RECOVERING)
"""The phases a pause is sent in; anywhere else the job would only record it as ignored."""
RESUMABLE = (Phase.PAUSED, Phase.NEEDS_OPERATOR)

# --- results ------------------------------------------------------------------------------


class JobHandle(BaseModel):
    """A started job. Every :class:`JobClient` call takes it, or just the job's name."""

    model_config = ConfigDict(frozen=True)

    job: str
    workflow_id: str
    run_id: str
    """The run ``start`` began; continue-as-new moves the job on to later runs."""


JobRef = str | JobHandle
"""A job, by name or by the handle ``start`` returned."""


class StartPlan(BaseModel):
    """What :meth:`JobClient.start` submits (:func:`plan_start`, contacting nothing),
    and after :meth:`JobClient.dry_run` the plan of its nodes and ranks.

    ``ranks`` is the environment of each rank as the launcher's own
    ``rank_environment`` builds it for the first generation, made by a worker
    (``activities/start_checks.py``); values only the launch can know are
    placeholders in ``<...>``. The worker's own environment, which local ranks also
    inherit, is not shown, nor are ``pass_env`` values (a dry run shows no secret).
    """

    model_config = ConfigDict(frozen=True)

    job: str
    workflow_id: str
    task_queue: str
    input: JobInput
    ranks: list[dict[str, str]] = Field(default_factory=list)
    nodes: list[NodePlan] = Field(default_factory=list)
    """Each node of the first generation: its address, login, interpreter, ranks and
    the command line it runs (``activities/nodes/node_plan.py``, on the worker)."""
    submit: list[str] | None = None
    """Slurm submit mode: the holder's ``sbatch`` line, the workflow's first step."""

    @property
    def spec(self) -> JobSpec:
        return self.input.spec


@pydantic_dataclass(frozen=True)
class StatusView:
    """Everything known about one job, merged from up to three sources.

    ``status`` is the workflow's own answer (None when no worker answered the
    query); ``live`` is the supervise activity's last heartbeat, fresher than
    the workflow's step; the ``*_hint`` fields come from search attributes and
    are all that is known when the query could not be answered.
    """

    workflow_id: str
    execution_status: str
    """Temporal's view: RUNNING, COMPLETED, FAILED, CANCELED, TERMINATED, ..."""
    status: JobStatus | None = None
    live: SupervisionProgress | None = None
    phase_hint: str | None = None
    step_hint: int | None = None
    start_time: datetime | None = None
    close_time: datetime | None = None
    note: str | None = None

    @property
    def job(self) -> str:
        return job_name_from(self.workflow_id)

    @property
    def phase(self) -> str | None:
        if self.status is not None:
            return str(self.status.phase)
        return self.phase_hint

    @property
    def step(self) -> int | None:
        """The newest step known: the heartbeat's when it is of the current
        generation and ahead of what the workflow last recorded."""
        recorded = self.status.step if self.status is not None else self.step_hint
        live = self.live
        if live is None or live.step is None:
            return recorded
        if self.status is not None and live.generation < self.status.generation:
            return recorded
        return live.step if recorded is None or live.step > recorded else recorded

    @property
    def is_terminal(self) -> bool:
        if self.execution_status != "RUNNING":
            return True
        return self.status is not None and self.status.phase.is_terminal


class JobRow(BaseModel):
    """One job in :meth:`JobClient.list`: the newest run of its workflow id."""

    model_config = ConfigDict(frozen=True)

    job: str
    workflow_id: str
    phase: str | None
    step: int | None
    execution_status: str
    start_time: datetime | None
    close_time: datetime | None


@pydantic_dataclass(frozen=True)
class WaitResult:
    """Where :meth:`JobClient.wait` stopped: the outcome (its exit code is
    :attr:`Outcome.exit_code`) and the job's status then."""

    job: str
    outcome: Outcome
    view: StatusView
    waited_s: float


class CancelResult(BaseModel):
    """What :meth:`JobClient.cancel` did. Cancelling an ended job is not an error:
    ``already_closed_as`` says how it had ended, and nothing was sent."""

    model_config = ConfigDict(frozen=True)

    job: str
    already_closed_as: str | None = None

    @property
    def requested(self) -> bool:
        """True when a cancellation was sent (the ranks are being stopped)."""
        return self.already_closed_as is None


# --- the dry run --------------------------------------------------------------------------


def plan_start(
    what: JobSpec | JobInput,
    task_queue: str = DEFAULT_TASK_QUEUE,
    checked: StartCheckResult | None = None,
) -> StartPlan:
    """What a start submits, contacting nothing: the workflow's id, queue and input
    (a bad job name is refused here, naming ``name``). ``checked``, a dry run's
    answer from a worker (:meth:`JobClient.check_start`), adds its node and rank
    plan."""
    job_input = what if isinstance(what, JobInput) else JobInput(spec=what)
    spec = job_input.spec
    problem = job_name_problem(spec.name)
    if problem is not None:
        raise SpecError([f"name: {problem}"])
    return StartPlan(
        job=spec.name,
        workflow_id=workflow_id_for(spec.name),
        task_queue=task_queue,
        input=job_input,
        ranks=checked.ranks if checked is not None else [],
        nodes=checked.nodes if checked is not None else [],
        submit=checked.submit if checked is not None else None,
    )


# --- the client ---------------------------------------------------------------------------


class JobClient(WorkerCalls):
    """Start, watch and steer jobs over an existing Temporal :class:`Client`.

    The client must use the pydantic data converter (:func:`lazarus.app.settings.connect`
    gives one); :meth:`connect` makes both from :class:`ConnectionSettings`.
    """

    def __init__(
        self,
        client: Client,
        *,
        task_queue: str = DEFAULT_TASK_QUEUE,
        address: str | None = None,
    ) -> None:
        self.temporal = client
        """The underlying temporalio client, for anything this API does not cover."""
        self.task_queue = task_queue
        """Where :meth:`start` sends jobs: the queue a ``lazarus worker`` polls."""
        self.address = address or client.service_client.config.target_host

    @classmethod
    async def connect(cls, settings: ConnectionSettings | None = None) -> JobClient:
        """Connect as configured (default: the environment, as the CLI does); raises
        :class:`~lazarus.app.settings.ConnectionProblem` (e.g. ``ServerUnreachable``)."""
        settings = settings or ConnectionSettings.from_env()
        client = await connect(settings)
        return cls(client, task_queue=settings.task_queue, address=settings.address)

    # --- starting ---------------------------------------------------------------------

    async def dry_run(self, what: JobSpec | JobInput, *, fresh: bool = False) -> StartPlan:
        """What :meth:`start` would submit to this client's task queue, with the plan of
        each node and rank as a worker makes it (:meth:`check_start` with ``dry_run``);
        starts nothing, moves nothing, contacts no node. Raises
        :class:`~lazarus.domain.spec.SpecError` naming the field for bad input (a
        program that is not there), :class:`NoWorker` without a worker."""
        plan = plan_start(what, self.task_queue)
        checked = await self.check_start(plan.spec, fresh=fresh, dry_run=True)
        if checked.problems:
            raise SpecError(checked.problems)
        return plan_start(plan.input, self.task_queue, checked)

    async def start_problems(self, spec: JobSpec) -> list[str]:
        """Why a start of ``spec`` would be refused, one line each naming the field
        (a missing program, an ssh node that cannot be reached, a Slurm allocation
        that cannot be used); empty when none. What :meth:`start` callers check first
        (``lazarus start`` does, with :meth:`check_start`), since a refusal then starts
        nothing."""
        return (await self.check_start(spec)).problems

    async def start(self, what: JobSpec | JobInput | StartPlan) -> JobHandle:
        """Start a job. Raises :class:`JobAlreadyRunning` while a job of that name
        runs, and :class:`MissingSearchAttributes` on a server not set up for Lazarus.

        A job whose allocation Lazarus submits (``slurm.nodes``) starts PENDING: the
        workflow's first step submits it and waits for it to run
        (:meth:`wait_while_pending` follows that)."""
        plan = what if isinstance(what, StartPlan) else plan_start(what, self.task_queue)
        with self._translated():
            try:
                handle = await self.temporal.start_workflow(
                    WORKFLOW_TYPE,
                    plan.input,
                    id=plan.workflow_id,
                    task_queue=plan.task_queue,
                    result_type=JobStatus,
                    id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                    id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                    search_attributes=TypedSearchAttributes(
                        [
                            SearchAttributePair(PHASE_ATTRIBUTE, Phase.PENDING.value),
                            SearchAttributePair(JOB_ATTRIBUTE, plan.job),
                            SearchAttributePair(STEP_ATTRIBUTE, 0),
                        ]
                    ),
                    # The Web UI's list and page show these from the start (no payloads).
                    static_summary=start_summary(plan.spec),
                    static_details=start_details(plan.spec),
                )
            except WorkflowAlreadyStartedError:
                raise JobAlreadyRunning(plan.job) from None
            except RPCError as exc:
                if (
                    exc.status == RPCStatusCode.INVALID_ARGUMENT
                    and "search attribute" in exc.message
                ):
                    raise MissingSearchAttributes(exc.message) from None
                raise
        return JobHandle(
            job=plan.job, workflow_id=plan.workflow_id, run_id=handle.result_run_id or ""
        )

    async def wait_while_pending(
        self, job: JobRef, progress: Callable[[str], None], poll_s: float = 1.0
    ) -> StatusView:
        """Follow a job until it leaves PENDING (a submit-mode job's first step waits
        for its allocation there) and return its status then; ``progress`` gets the
        allocation's queue line each time it changes. Stopping this wait stops
        nothing: the job goes on."""
        said: str | None = None
        while True:
            view = await self.status(job)
            if view.is_terminal or view.phase not in (None, Phase.PENDING.value):
                return view
            with self._translated():
                _, description = await self._describe(_name(job))
                line = await self._pending_line(description)
            if line is not None and line != said:
                progress(line)
                said = line
            await asyncio.sleep(poll_s)

    async def ensure_not_running(self, job: JobRef) -> None:
        """Raise :class:`JobAlreadyRunning` if the job runs now; for work that must
        happen before a start but never under a running job (moving checkpoints)."""
        name = _name(job)
        with self._translated():
            try:
                _, description = await self._describe(name)
            except JobNotFound:
                return
        if _is_open(description):
            raise JobAlreadyRunning(name)

    # --- looking ----------------------------------------------------------------------

    async def status(self, job: JobRef) -> StatusView:
        """Everything known about the job: Temporal's description, the workflow's own
        status (its final result once completed, readable without a worker) and the
        supervisor's live heartbeat. Raises :class:`JobNotFound`."""
        name = _name(job)
        with self._translated():
            handle, description = await self._describe(name)
            open_ = _is_open(description)
            live = await self._live_progress(description) if open_ else None
            status, note = await _query_status(handle)
            if status is None and description.status == WorkflowExecutionStatus.COMPLETED:
                status = await self._final_status(description.id)
                note = None if status is not None else note
        attributes = description.typed_search_attributes
        return StatusView(
            workflow_id=description.id,
            execution_status=_status_name(description),
            status=status,
            live=live,
            phase_hint=attributes.get(PHASE_ATTRIBUTE),
            step_hint=attributes.get(STEP_ATTRIBUTE),
            start_time=description.start_time,
            close_time=description.close_time,
            note=note,
        )

    async def query(self, job: JobRef) -> JobStatus:
        """The workflow's own status; raises :class:`StatusUnavailable` (saying why)
        when no worker answers. :meth:`status` never raises for that: it falls back."""
        name = _name(job)
        with self._translated():
            handle, _ = await self._describe(name)
            status, note = await _query_status(handle)
        if status is None:
            raise StatusUnavailable(name, note or "the job did not answer")
        return status

    async def incidents(self, job: JobRef) -> list[Incident]:
        """Every failure of the job and what was done about it."""
        return (await self.query(job)).incidents

    async def history(self, job: JobRef) -> list[WorkflowHistory]:
        """The job's workflow history, every run of its continue-as-new chain, oldest
        first: what the workflow recorded, readable after the job has ended (for
        ``lazarus report``). Earlier starts of the same name are not included."""
        name = _name(job)
        runs: list[WorkflowHistory] = []
        with self._translated():
            _, description = await self._describe(name)
            run_id: str | None = description.run_id
            while run_id:
                handle = self.temporal.get_workflow_handle(description.id, run_id=run_id)
                history = await handle.fetch_history()
                runs.append(history)
                first = history.events[0] if history.events else None
                run_id = (
                    first.workflow_execution_started_event_attributes.continued_execution_run_id
                    if first is not None
                    and first.HasField("workflow_execution_started_event_attributes")
                    else None
                ) or None
        runs.reverse()
        return runs

    async def list(self) -> list[JobRow]:
        """One row per job, by name: the newest run of each workflow id (continue-as-new
        and re-starts leave older runs in visibility)."""
        newest: dict[str, JobRow] = {}
        with self._translated():
            async for execution in self.temporal.list_workflows(
                f"WorkflowType = '{WORKFLOW_TYPE}'"
            ):
                attributes = execution.typed_search_attributes
                row = JobRow(
                    job=attributes.get(JOB_ATTRIBUTE) or job_name_from(execution.id),
                    workflow_id=execution.id,
                    phase=attributes.get(PHASE_ATTRIBUTE),
                    step=attributes.get(STEP_ATTRIBUTE),
                    execution_status=execution.status.name if execution.status else "UNKNOWN",
                    start_time=execution.start_time,
                    close_time=execution.close_time,
                )
                current = newest.get(row.workflow_id)
                if current is None or _started(row) > _started(current):
                    newest[row.workflow_id] = row
        return sorted(newest.values(), key=lambda r: r.job)

    async def result(self, job: JobRef) -> JobStatus:
        """Wait for the job to end and return its final status (following
        continue-as-new). Raises :class:`JobEndedWithoutResult` if it was cancelled,
        terminated or failed as a workflow."""
        name = _name(job)
        with self._translated():
            await self._describe(name)  # a job's, not a fleet's
        handle = self.temporal.get_workflow_handle(workflow_id_for(name), result_type=JobStatus)
        with self._translated():
            try:
                result = await handle.result()
            except WorkflowFailureError as exc:
                raise JobEndedWithoutResult(name, str(exc.cause or exc)) from None
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:
                    raise JobNotFound(name) from None
                raise
        if not isinstance(result, JobStatus):
            raise JobEndedWithoutResult(name, "its result is not a job status")
        return result

    async def wait(
        self,
        job: JobRef,
        *,
        timeout_s: float | None = None,
        stop_at_operator: bool = True,
        poll_s: float = 2.0,
        on_change: Callable[[StatusView], None] | None = None,
    ) -> WaitResult:
        """Follow the job until it reaches an outcome (:func:`~lazarus.app.outcome.outcome_of`):
        it ended, or, with ``stop_at_operator``, it waits for a person. ``timeout_s``
        ends the wait with :attr:`Outcome.TIMEOUT` (the job goes on); ``on_change``
        gets the status each time the phase or generation changes. Raises
        :class:`JobNotFound` for a name Temporal has never seen.

        It polls :meth:`status` rather than awaiting the workflow's result, because
        NEEDS_OPERATOR is not an end of the workflow: the result would never tell
        a script that the job is stuck. Stopping the wait stops nothing."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        seen: tuple[str | None, int | None] | None = None
        while True:
            view = await self.status(job)
            mark = (view.phase, view.status.generation if view.status is not None else None)
            if on_change is not None and mark != seen:
                on_change(view)
            seen = mark
            waited = loop.time() - began
            outcome = outcome_of(view.execution_status, view.phase, stop_at_operator)
            if outcome is None and timeout_s is not None and waited >= timeout_s:
                outcome = Outcome.TIMEOUT
            if outcome is not None:
                return WaitResult(job=_name(job), outcome=outcome, view=view, waited_s=waited)
            left = poll_s if timeout_s is None else min(poll_s, timeout_s - waited)
            await asyncio.sleep(max(0.0, left))

    async def spec(self, job: JobRef) -> JobSpec:
        """The spec the job's current run was started (or continued) with, read from the
        first event of its history: where its nodes are and how to reach them, for
        tools that read node-side files (``lazarus logs``)."""
        name = _name(job)
        with self._translated():
            handle, _ = await self._describe(name)
            async for event in handle.fetch_history_events():
                if not event.HasField("workflow_execution_started_event_attributes"):
                    break
                payloads = event.workflow_execution_started_event_attributes.input.payloads
                try:
                    (job_input,) = await self.temporal.data_converter.decode(
                        list(payloads[:1]), [JobInput]
                    )
                except Exception as exc:  # a shape this version cannot read
                    raise StatusUnavailable(
                        name, f"cannot read the spec of job '{name}': {exc}"
                    ) from None
                if isinstance(job_input, JobInput):
                    return job_input.spec
                break
        raise StatusUnavailable(name, f"the history of job '{name}' holds no spec")

    # --- steering ---------------------------------------------------------------------

    async def pause(self, job: JobRef) -> None:
        """Stop the ranks and hold; :meth:`resume` relaunches them from the last
        checkpoint. Refused (:class:`RequestRejected`, nothing sent) unless the job is
        PENDING, LAUNCHING, RUNNING or RECOVERING."""
        await self._signal(_name(job), SIGNAL_PAUSE, "pause", PAUSABLE)

    async def resume(self, job: JobRef) -> None:
        """Relaunch a PAUSED job, or one in NEEDS_OPERATOR; refused in any other phase."""
        await self._signal(_name(job), SIGNAL_RESUME, "resume", RESUMABLE)

    async def recover(
        self,
        job: JobRef,
        reason: str = "forced by operator",
        exclude_node: str | None = None,
        checkpoint_first: bool = False,
    ) -> str:
        """Restart the ranks from the last checkpoint now, as if a rank had failed;
        returns the job's reply. An update, not a signal: the job validates it first,
        so an unknown ``exclude_node`` is refused (:class:`RequestRejected`)."""
        request = ForceRecover(
            reason=reason, exclude_node=exclude_node, checkpoint_first=checkpoint_first
        )
        return await self._update(_name(job), UPDATE_RECOVER, request)

    async def drain(self, job: JobRef, node: str, reason: str = "") -> str:
        """Move the job off ``node``: quarantine it and relaunch on a spare."""
        return await self._update(_name(job), UPDATE_DRAIN, NodeRequest(node=node, reason=reason))

    async def return_node(self, job: JobRef, node: str) -> str:
        """Take ``node`` out of quarantine into the spares."""
        return await self._update(_name(job), UPDATE_RETURN, NodeRequest(node=node))

    async def cancel(self, job: JobRef) -> CancelResult:
        """Stop the ranks and end the job as CANCELLED. Idempotent: on a job that has
        already ended it sends nothing and says how it ended. A name Temporal has
        never seen is still :class:`JobNotFound` (most likely a typo)."""
        name = _name(job)
        with self._translated():
            handle, description = await self._describe(name)
            if not _is_open(description):
                return CancelResult(job=name, already_closed_as=_status_name(description))
            try:
                await handle.cancel()
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:  # closed between describe and cancel
                    return CancelResult(job=name, already_closed_as="CLOSED")
                raise
        return CancelResult(job=name)

    # --- plumbing ---------------------------------------------------------------------

    async def _describe(
        self, name: str
    ) -> tuple[WorkflowHandle[Any, Any], WorkflowExecutionDescription]:
        handle = self.temporal.get_workflow_handle(workflow_id_for(name))
        try:
            description = await handle.describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise JobNotFound(name) from None
            raise
        # Every command describes first: one on another workflow type under a job's id
        # (fleet x's lazarus-fleet-x, for job "fleet-x") is refused before it is sent.
        if description.workflow_type != WORKFLOW_TYPE:
            raise NotAJob(name, description.id, description.workflow_type)
        return handle, description

    async def _live_progress(
        self, description: WorkflowExecutionDescription
    ) -> SupervisionProgress | None:
        """The supervise activity's last heartbeat: fresher than anything in history."""
        for activity in description.raw_description.pending_activities:
            if activity.activity_type.name != SUPERVISE_ACTIVITY:
                continue
            payloads = activity.heartbeat_details.payloads
            if not payloads:
                continue
            try:
                (progress,) = await self.temporal.data_converter.decode(
                    payloads[:1], [SupervisionProgress]
                )
            except Exception:  # an older or newer heartbeat shape: just skip the live view
                continue
            if isinstance(progress, SupervisionProgress):
                return progress
        return None

    async def _pending_line(self, description: WorkflowExecutionDescription) -> str | None:
        """The first allocation's latest queue line (its activity's heartbeat), if the
        job waits for it."""
        for activity in description.raw_description.pending_activities:
            if activity.activity_type.name != SUBMIT_ACTIVITY:
                continue
            payloads = activity.heartbeat_details.payloads
            if not payloads:
                return "submitting the allocation"
            with contextlib.suppress(Exception):  # another shape: say nothing
                (line,) = await self.temporal.data_converter.decode(payloads[:1], [str])
                if isinstance(line, str):
                    return line
        return None

    async def _final_status(self, workflow_id: str) -> JobStatus | None:
        """A completed job's result is its final status: readable without any worker."""
        handle = self.temporal.get_workflow_handle(workflow_id, result_type=JobStatus)
        try:
            result = await handle.result(follow_runs=False, rpc_timeout=QUERY_TIMEOUT)
        except Exception:  # not a JobStatus result (an older workflow version), or gone
            return None
        return result if isinstance(result, JobStatus) else None

    async def _signal(
        self, name: str, signal: str, verb: str, allowed_in: tuple[Phase, ...]
    ) -> None:
        """Signal an open job in one of ``allowed_in``; in another phase it is refused
        here, with the reason, before anything is sent (the job would record it as
        ignored)."""
        with self._translated():
            handle, description = await self._describe(name)
            if not _is_open(description):
                raise JobClosed(name, _status_name(description), doing=verb)
            status = await handle.query(
                QUERY_STATUS, result_type=JobStatus, rpc_timeout=QUERY_TIMEOUT
            )
            if status.phase not in allowed_in:
                wanted = " or ".join(p.value for p in allowed_in)
                reason = f"is {status.phase.value}; {verb} applies only when it is {wanted}"
                raise RequestRejected(name, reason, message=f"job '{name}' {reason}: nothing sent")
            await handle.signal(signal)

    async def _update(self, name: str, update: str, request: NodeRequest | ForceRecover) -> str:
        """Updates, unlike signals, answer: an unknown node is refused with the reason."""
        with self._translated():
            handle, description = await self._describe(name)
            if not _is_open(description):
                raise JobClosed(name, _status_name(description))
            try:
                reply = await handle.execute_update(update, request, result_type=str)
            except WorkflowUpdateFailedError as exc:
                cause: BaseException = exc.cause
                while cause.__cause__ is not None:
                    cause = cause.__cause__
                raise RequestRejected(name, str(cause)) from None
        return str(reply)


async def _query_status(handle: WorkflowHandle[Any, Any]) -> tuple[JobStatus | None, str | None]:
    """The workflow's own status, or why it could not be had.

    Queries on closed workflows work too (a worker replays the history), but only
    while a worker is polling; without one callers fall back to Temporal's view.
    """
    try:
        status = await handle.query(QUERY_STATUS, result_type=JobStatus, rpc_timeout=QUERY_TIMEOUT)
    except (WorkflowQueryFailedError, WorkflowQueryRejectedError) as exc:
        return None, f"the job did not answer the status query: {exc}"
    except RPCError as exc:
        if exc.status == RPCStatusCode.UNAVAILABLE:
            raise
        if exc.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED):
            return None, (
                "no worker answered the status query; is 'lazarus worker' running? "
                "(showing what Temporal itself knows)"
            )
        return None, f"the status query failed: {exc.message}"
    if not isinstance(status, JobStatus):
        return None, "the status query returned something that is not a job status"
    return status, None


def _name(job: JobRef) -> str:
    return job.job if isinstance(job, JobHandle) else job


def _is_open(description: WorkflowExecutionDescription) -> bool:
    return description.status in (None, WorkflowExecutionStatus.RUNNING)


def _status_name(description: WorkflowExecutionDescription) -> str:
    status = description.status
    return "UNKNOWN" if status is None else status.name


def _started(row: JobRow) -> datetime:
    return row.start_time or datetime.min.replace(tzinfo=UTC)
