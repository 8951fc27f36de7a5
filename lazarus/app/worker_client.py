"""A client's typed calls to a worker (issue 40, part 2: "the CLI is a client").

What needs the nodes, the checkpoint store or the worker's environment runs on a worker:
each call here starts one short workflow (:class:`workflows.worker_call.WorkerCallWorkflow`,
``lazarus-call-<kind>-<random>``) that runs one activity and returns its typed answer
(:mod:`lazarus.domain.worker_calls`). :class:`~lazarus.app.client.JobClient` has these
methods; they live apart so the client stays one concern per module.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from datetime import timedelta

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

from lazarus.app.client_errors import NoWorker, TemporalRefused, WorkerCallFailed
from lazarus.app.settings import ServerUnreachable
from lazarus.domain.spec import JobSpec
from lazarus.domain.worker_calls import (
    WORKER_CALL_ID_PREFIX,
    WORKER_CALL_WORKFLOW,
    ListCheckpointsRequest,
    ListCheckpointsResult,
    RanksEndedRequest,
    RanksEndedResult,
    ReadLogRequest,
    ReadLogResult,
    StartCheckRequest,
    StartCheckResult,
    VerifyCheckpointsRequest,
    VerifyCheckpointsResult,
    WorkerCall,
    WorkerReply,
)

CALL_TIMEOUTS = {
    "start_checks": timedelta(minutes=11),
    "list_checkpoints": timedelta(minutes=61),
    "verify_checkpoints": timedelta(minutes=61),
    "read_log": timedelta(minutes=3),
    "ranks_ended": timedelta(minutes=3),
}
"""How long a call to a worker may take, waiting included: a minute more than its
activity may run (``workflows/worker_call.py``)."""
DESCRIBE_TIMEOUT = timedelta(seconds=5)
WORKER_WAIT_S = 30.0
"""How long a call waits for a worker's first poll before :class:`NoWorker`: a worker
started just before (``lazarus worker & lazarus start job.yaml``) takes seconds to
import and connect."""


class WorkerCalls:
    """The worker calls of :class:`~lazarus.app.client.JobClient`, and the translation
    of Temporal's transport errors that every call of the client shares."""

    temporal: Client
    task_queue: str
    address: str
    _worker_seen: bool = False

    async def check_start(
        self,
        spec: JobSpec,
        *,
        spec_file: str | None = None,
        check_nodes: bool = True,
        fresh: bool = False,
        dry_run: bool = False,
    ) -> StartCheckResult:
        """Start's checks, on a worker (``activities/start_checks.py``): bad input as
        ``problems`` (nothing moved), then ``--fresh``'s set-aside and the resume
        point, and for a dry run the node and rank plan. ``spec_file`` begins each
        problem line (default: the job's name)."""
        request = StartCheckRequest(
            spec=spec,
            spec_file=spec_file or spec.name,
            check_nodes=check_nodes,
            fresh=fresh,
            dry_run=dry_run,
        )
        answer = await self._call_worker(request, "check the start")
        assert isinstance(answer, StartCheckResult)
        return answer

    async def list_checkpoints(
        self,
        checkpoint_dir: str | None,
        durable_uri: str | None = None,
        *,
        endpoint_url: str | None = None,
        hashes: bool = False,
    ) -> ListCheckpointsResult:
        """Every checkpoint of the directory and the durable store, newest first, as a
        worker reads them (its filesystem, its store credentials)."""
        request = ListCheckpointsRequest(
            checkpoint_dir=checkpoint_dir,
            durable_uri=durable_uri,
            endpoint_url=endpoint_url,
            hashes=hashes,
        )
        answer = await self._call_worker(request, "list the checkpoints")
        assert isinstance(answer, ListCheckpointsResult)
        return answer

    async def verify_checkpoints(
        self,
        target: str,
        *,
        endpoint_url: str | None = None,
        sizes_only: bool = False,
        world_size: int | None = None,
    ) -> VerifyCheckpointsResult:
        """A checkpoint, or each under a root, against its manifest, on a worker."""
        request = VerifyCheckpointsRequest(
            target=target, endpoint_url=endpoint_url, sizes_only=sizes_only, world_size=world_size
        )
        answer = await self._call_worker(request, "verify the checkpoints")
        assert isinstance(answer, VerifyCheckpointsResult)
        return answer

    async def read_log(self, request: ReadLogRequest) -> ReadLogResult:
        """A chunk of a rank's log on an ssh or Slurm node, read by its agent on a
        worker (``activities/node_logs.py``): ``lazarus logs``."""
        answer = await self._call_worker(request, "read the log")
        assert isinstance(answer, ReadLogResult)
        return answer

    async def ranks_ended(self, request: RanksEndedRequest) -> RanksEndedResult:
        """Whether the request's ranks have all ended on their node (``logs -f``)."""
        answer = await self._call_worker(request, "poll the node")
        assert isinstance(answer, RanksEndedResult)
        return answer

    async def _call_worker(
        self,
        request: StartCheckRequest
        | ListCheckpointsRequest
        | VerifyCheckpointsRequest
        | ReadLogRequest
        | RanksEndedRequest,
        what: str,
    ) -> (
        StartCheckResult
        | ListCheckpointsResult
        | VerifyCheckpointsResult
        | ReadLogResult
        | RanksEndedResult
    ):
        """One call workflow (``workflows/worker_call.py``) on this client's queue, and
        its answer. Refused with :class:`NoWorker` when no worker polls the queue
        (the call would wait for one); a worker that dies on it is bounded by the
        call's execution timeout."""
        await self._require_worker()
        kind = request.kind.replace("_", "-")
        with self._translated():
            try:
                reply: WorkerReply = await self.temporal.execute_workflow(
                    WORKER_CALL_WORKFLOW,
                    WorkerCall(request=request),
                    id=f"{WORKER_CALL_ID_PREFIX}{kind}-{uuid.uuid4().hex[:12]}",
                    task_queue=self.task_queue,
                    result_type=WorkerReply,
                    execution_timeout=CALL_TIMEOUTS[request.kind],
                )
            except WorkflowFailureError as exc:
                reason = exc.cause
                while reason.__cause__ is not None:
                    reason = reason.__cause__
                raise WorkerCallFailed(f"the worker could not {what}: {reason}") from None
        return reply.answer

    async def _require_worker(self) -> None:
        """A worker polls this client's queue, or :class:`NoWorker`. The server lists a
        worker once its first poll arrives: one started a moment ago is waited for
        (:data:`WORKER_WAIT_S`). Asked once per client: a follower calls often."""
        if self._worker_seen:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WORKER_WAIT_S
        while True:
            with self._translated():
                described = await self.temporal.workflow_service.describe_task_queue(
                    DescribeTaskQueueRequest(
                        namespace=self.temporal.namespace,
                        task_queue=TaskQueue(name=self.task_queue),
                        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
                    ),
                    timeout=DESCRIBE_TIMEOUT,
                )
            if described.pollers:
                self._worker_seen = True
                return
            if loop.time() >= deadline:
                raise NoWorker(self.task_queue)
            await asyncio.sleep(0.5)

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        """Temporal's transport errors as this module's: a server that is not there
        reads the same as at connect time."""
        try:
            yield
        except RPCError as exc:
            if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
                raise ServerUnreachable(self.address) from exc
            raise TemporalRefused(exc.message) from exc
