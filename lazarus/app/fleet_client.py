"""Start, read and steer a fleet workflow over an existing Temporal client.

The CLI (``lazarus fleet ...``) and tests use this; like :class:`lazarus.app.client.JobClient`
it imports no workflow code, only the names in ``lazarus.domain.api`` and the models
in ``lazarus.domain.fleet``. A refused update comes back as
:class:`~lazarus.app.client.RequestRejected` with the fleet's reason.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import yaml
from pydantic import ValidationError
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from lazarus.app.client import ClientError, RequestRejected, TemporalRefused
from lazarus.app.settings import ConnectionSettings, ServerUnreachable, connect
from lazarus.domain.api import (
    DEFAULT_TASK_QUEUE,
    FLEET_QUERY_STATUS,
    FLEET_UPDATE_DRAIN,
    FLEET_UPDATE_RELEASE_ORPHAN,
    FLEET_UPDATE_RETURN,
    FLEET_WORKFLOW_TYPE,
    WORKFLOW_TYPE,
    fleet_workflow_id,
    workflow_id_for,
)
from lazarus.domain.config_errors import described, error_lines, yaml_lines
from lazarus.domain.fleet import (
    DrainRequest,
    FleetConfig,
    FleetInput,
    FleetStatus,
    OrphanRelease,
    ReturnRequest,
)

QUERY_TIMEOUT = timedelta(seconds=10)


class FleetNotFound(ClientError):
    """No open fleet workflow of that name."""

    def __init__(self, fleet: str) -> None:
        super().__init__(f"fleet '{fleet}' is not running (start it: lazarus fleet start)")
        self.fleet = fleet


class FleetAlreadyRunning(ClientError):
    def __init__(self, fleet: str) -> None:
        super().__init__(f"fleet '{fleet}' is already running")
        self.fleet = fleet


class FleetEndedBefore(ClientError):
    """A fleet of that name ran before and was ended (terminated, most likely): a new
    start would not know what it knew."""

    def __init__(self, fleet: str, how: str) -> None:
        super().__init__(
            f"fleet '{fleet}' ran before and {how}: a new start begins with every node "
            "healthy and forgets its leases (a job still running keeps training on nodes "
            "the new fleet would lease again), its quarantines and its lemons. Stop or "
            "wait out its jobs, then start it with --forget-state"
        )
        self.fleet = fleet


class FleetConfigError(ClientError):
    """A fleet config file that cannot run: one line per problem, ``file: field: why``."""


def load_fleet_config(path: str | Path) -> FleetConfig:
    """Read and validate a fleet YAML, or raise :class:`FleetConfigError`: its lines
    are worded as a job spec's (:mod:`lazarus.domain.config_errors`), with their line."""
    source = Path(path)
    try:
        text = source.read_text()
        data = yaml.safe_load(text)
    except OSError as exc:
        raise FleetConfigError(f"{source}: cannot read the file: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise FleetConfigError(f"{source}: {where}not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        what = "the file is empty" if data is None else f"got {described(data)}"
        raise FleetConfigError(f"{source}: (top level): expected a mapping of fields; {what}")
    try:
        return FleetConfig.model_validate(data)
    except ValidationError as exc:
        lines = error_lines(exc, str(source), FleetConfig, yaml_lines(text), noun="fleet")
        raise FleetConfigError("\n".join(lines)) from None


class FleetClient:
    """One fleet's workflow, by name."""

    def __init__(
        self, client: Client, *, task_queue: str = DEFAULT_TASK_QUEUE, address: str = ""
    ) -> None:
        self.temporal = client
        self.task_queue = task_queue
        self.address = address or client.service_client.config.target_host

    @classmethod
    async def connect(cls, settings: ConnectionSettings | None = None) -> FleetClient:
        settings = settings or ConnectionSettings.from_env()
        client = await connect(settings)
        return cls(client, task_queue=settings.task_queue, address=settings.address)

    async def start(self, config: FleetConfig, *, forget_state: bool = False) -> str:
        """Start the fleet's workflow; its id is ``lazarus-fleet-<name>``. One already
        running is refused (:class:`FleetAlreadyRunning`); so is one that ran before and
        was ended (:class:`FleetEndedBefore`), unless ``forget_state``: its state died
        with it, and a fresh one would lease nodes its jobs still hold."""
        workflow_id = fleet_workflow_id(config.name)
        if not forget_state:
            how = await self._ended(config.name)
            if how is not None:
                raise FleetEndedBefore(config.name, how)
        try:
            await self.temporal.start_workflow(
                FLEET_WORKFLOW_TYPE,
                FleetInput(config=config),
                id=workflow_id,
                task_queue=self.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            )
        except WorkflowAlreadyStartedError:
            raise FleetAlreadyRunning(config.name) from None
        except RPCError as exc:
            self._raise(exc, config.name)
        return workflow_id

    async def _ended(self, fleet: str) -> str | None:
        """How the fleet's last run ended, or None: never started, or still running (the
        start then says so). A job named ``fleet-<name>`` shares the id: not a fleet."""
        try:
            description = await self._handle(fleet).describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return None
            self._raise(exc, fleet)
        if description.workflow_type != FLEET_WORKFLOW_TYPE:
            return None
        if description.status in (None, WorkflowExecutionStatus.RUNNING):
            return None
        when = (
            description.close_time.isoformat(timespec="seconds") if description.close_time else "?"
        )
        return f"was {description.status.name.lower().replace('_', ' ')} at {when}"

    async def status(self, fleet: str) -> FleetStatus:
        try:
            result: FleetStatus = await self._handle(fleet).query(
                FLEET_QUERY_STATUS, result_type=FleetStatus, rpc_timeout=QUERY_TIMEOUT
            )
        except RPCError as exc:
            self._raise(exc, fleet)
        return result

    async def drain(self, fleet: str, node: str, reason: str) -> str:
        return await self._update(fleet, FLEET_UPDATE_DRAIN, DrainRequest(node=node, reason=reason))

    async def return_node(self, fleet: str, node: str, *, fenced: bool = False) -> str:
        """``fenced``: the caller vouches no stale rank runs there (see ``ReturnRequest``)."""
        return await self._update(
            fleet, FLEET_UPDATE_RETURN, ReturnRequest(node=node, fenced=fenced)
        )

    async def release(self, fleet: str, job: str, *, fenced: bool = False) -> str:
        """Free the nodes ``job`` still holds (``lazarus fleet release``), refused while
        the job's workflow is open: an open job releases its own nodes when it ends (its
        release retries for a day), and freeing them under it would hand its nodes to
        another job while its ranks run. The fleet cannot look at another workflow, so
        the check is here."""
        open_since = await self._open_job(job)
        if open_since is not None:
            raise RequestRejected(
                f"fleet-{fleet}",
                f"job {job} is still open",
                message=(
                    f"job '{job}' is still open ({open_since}): it gives its nodes back "
                    f"when it ends. Cancel it ('lazarus cancel {job}'), or terminate it if "
                    "it is wedged, then run this again"
                ),
            )
        return await self._update(
            fleet, FLEET_UPDATE_RELEASE_ORPHAN, OrphanRelease(job=job, fenced=fenced)
        )

    async def _open_job(self, job: str) -> str | None:
        """How the job's workflow is open (its run id), or None when it is closed or
        Temporal has never seen it. A fleet named like the job (``lazarus-fleet-x`` is
        also job ``fleet-x``'s id) is not the job."""
        handle = self.temporal.get_workflow_handle(workflow_id_for(job))
        try:
            description = await handle.describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return None
            self._raise(exc, job)
        if description.workflow_type != WORKFLOW_TYPE:
            return None
        if description.status not in (None, WorkflowExecutionStatus.RUNNING):
            return None
        return f"workflow {description.id}, run {description.run_id}"

    async def _update(self, fleet: str, update: str, request: Any) -> str:
        try:
            reply = await self._handle(fleet).execute_update(update, request, result_type=str)
        except WorkflowUpdateFailedError as exc:
            cause: BaseException = exc.cause
            while cause.__cause__ is not None:
                cause = cause.__cause__
            raise RequestRejected(f"fleet-{fleet}", str(cause), message=str(cause)) from None
        except RPCError as exc:
            self._raise(exc, fleet)
        return str(reply)

    def _handle(self, fleet: str) -> WorkflowHandle[Any, Any]:
        return self.temporal.get_workflow_handle(fleet_workflow_id(fleet))

    def _raise(self, exc: RPCError, fleet: str) -> NoReturn:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise FleetNotFound(fleet) from None
        if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            raise ServerUnreachable(self.address) from exc
        raise TemporalRefused(exc.message) from exc
