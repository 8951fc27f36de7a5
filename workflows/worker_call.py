"""``WorkerCallWorkflow``: a client's typed call to a worker, one activity long.

What the CLI needs from the nodes, the checkpoint store or the worker's environment
(start's checks, ``--fresh``, the resume notice, the dry run's plan, ``lazarus
checkpoints``, ``lazarus verify``, ``lazarus logs`` of a remote node) runs on a
worker, never in the client (issue 40, part 2). A workflow rather than the job's own
first step because the checks come before the job exists: a refused start leaves no
job behind, and nothing in a job's history changes, so released histories replay as
they are. The call is visible in the server's
history like any workflow (``lazarus-call-<kind>-<random>``) and is no job: ``lazarus
list`` never shows it.

Deterministic and thin: it picks the activity for the request's kind, routes a local
job's start checks to the machine its nodes name (as the job's machine-bound work
goes, :mod:`workflows.routing`), and returns the answer. An activity that fails is not
retried: the client reports the failure, the user asks again.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow

from lazarus.domain.activity_refs import (
    LIST_CHECKPOINTS,
    RANKS_ENDED,
    READ_LOG,
    START_CHECKS,
    VERIFY_CHECKPOINTS,
    ActivityRef,
)
from lazarus.domain.worker_calls import (
    WORKER_CALL_WORKFLOW,
    StartCheckRequest,
    WorkerCall,
    WorkerReply,
)
from workflows.activity_calls import NO_RETRY, execute
from workflows.routing import declared_host, host_task_queue

CALLS: dict[str, tuple[ActivityRef[Any, Any], timedelta]] = {
    START_CHECKS.name: (START_CHECKS, timedelta(minutes=10)),
    LIST_CHECKPOINTS.name: (LIST_CHECKPOINTS, timedelta(hours=1)),
    VERIFY_CHECKPOINTS.name: (VERIFY_CHECKPOINTS, timedelta(hours=1)),
    READ_LOG.name: (READ_LOG, timedelta(minutes=2)),
    RANKS_ENDED.name: (RANKS_ENDED, timedelta(minutes=2)),
}
"""Each request kind's activity and how long it may take (hashing a large checkpoint
reads every byte)."""


@workflow.defn(name=WORKER_CALL_WORKFLOW)
class WorkerCallWorkflow:
    @workflow.run
    async def run(self, call: WorkerCall) -> WorkerReply:
        request = call.request
        ref, timeout = CALLS[request.kind]
        options: dict[str, Any] = {}
        if isinstance(request, StartCheckRequest):
            host = declared_host(request.spec)
            if host is not None:
                options["task_queue"] = host_task_queue(workflow.info().task_queue, host)
        answer = await execute(
            ref, request, start_to_close_timeout=timeout, retry_policy=NO_RETRY, **options
        )
        return WorkerReply(answer=answer)
