"""The errors of :class:`~lazarus.app.client.JobClient`: each a request that cannot be
done as asked, with a one-line message meant for a person (the CLI prints it as is).
They live apart from the client so that it stays one concern; ``lazarus.app.client``
re-exports them, and callers import them from there.
"""

from __future__ import annotations

import asyncio
import difflib
from collections.abc import Sequence
from typing import Protocol

from temporalio.service import RPCError

from lazarus.domain.api import SEARCH_ATTRIBUTES, workflow_id_for


class _Named(Protocol):
    @property
    def job(self) -> str: ...


class ListsJobs(Protocol):
    """What :meth:`JobNotFound.with_suggestion` needs of a
    :class:`~lazarus.app.client.JobClient`: its job list."""

    async def list(self) -> Sequence[_Named]: ...


class ClientError(Exception):
    """A request that cannot be done as asked; the message is one line for a person."""


class JobNotFound(ClientError):
    """Temporal has never seen a job of this name (in this namespace)."""

    def __init__(self, job: str, known: Sequence[str] = ()) -> None:
        close = difflib.get_close_matches(job, list(known), n=1)
        hint = f"did you mean '{close[0]}'?" if close else "see 'lazarus list'"
        super().__init__(f"no job named '{job}'; {hint}")
        self.job = job

    async def with_suggestion(self, jobs: ListsJobs) -> JobNotFound:
        """The same error, naming the closest job there is (``ux-evl``: ``ux-eval``)
        from :meth:`JobClient.list`, which a typo has time for; without one (no close
        name, or the list failed too) it points at ``lazarus list`` as before."""
        try:
            rows = await asyncio.wait_for(jobs.list(), timeout=10)
        except (ClientError, RPCError, TimeoutError):
            return self
        return JobNotFound(self.job, [row.job for row in rows])


class NotAJob(JobNotFound):
    """The job's workflow id names a workflow that is not a job: ``lazarus-fleet-<x>``
    is fleet ``<x>``'s, which a job named ``fleet-<x>`` (refused since issue 37, N6)
    would have shared. Nothing is sent to it: a job command must never act on a fleet."""

    def __init__(self, job: str, workflow_id: str, workflow_type: str) -> None:
        ClientError.__init__(
            self,
            f"no job named '{job}': {workflow_id} is a {workflow_type} workflow, not a job; "
            "nothing sent (a fleet is steered with 'lazarus fleet')",
        )
        self.job = job
        self.workflow_type = workflow_type

    async def with_suggestion(self, jobs: ListsJobs) -> JobNotFound:
        """Itself: the name is there, only not a job's."""
        return self


class JobAlreadyRunning(ClientError):
    """A job name runs at most once at a time."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.workflow_id = workflow_id_for(job)
        super().__init__(
            f"job '{job}' is already running ({self.workflow_id}); "
            f"see 'lazarus status {job}', or start it under another --name"
        )


class JobClosed(ClientError):
    """The job has ended, so it can no longer be paused, resumed or updated."""

    def __init__(self, job: str, execution_status: str, doing: str | None = None) -> None:
        self.job = job
        self.execution_status = execution_status
        tail = f"; cannot {doing} it" if doing else ""
        super().__init__(f"job '{job}' is already closed ({execution_status}){tail}")


class RequestRejected(ClientError):
    """The job turned the request down; ``reason`` is its own words (an unknown node,
    a phase in which the request does not apply)."""

    def __init__(self, job: str, reason: str, message: str | None = None) -> None:
        self.job = job
        self.reason = reason
        super().__init__(message or f"job '{job}': {reason}")


class StatusUnavailable(ClientError):
    """The job's own status could not be had (no worker answered the query); the
    message says why."""

    def __init__(self, job: str, reason: str) -> None:
        self.job = job
        self.reason = reason
        super().__init__(reason)


class JobEndedWithoutResult(ClientError):
    """The workflow ended without a final status: cancelled, terminated or failed."""

    def __init__(self, job: str, why: str) -> None:
        self.job = job
        super().__init__(f"job '{job}' ended without a final status: {why}")


class MissingSearchAttributes(ClientError):
    """The server does not know Lazarus's search attributes, so no job can start."""

    def __init__(self, server_message: str) -> None:
        creates = " ".join(
            f"--name {key.name} --type {key.indexed_value_type.name.title().replace('_', '')}"
            for key in SEARCH_ATTRIBUTES
        )
        super().__init__(
            f"the server does not know Lazarus's search attributes ({server_message}); "
            "use 'lazarus server', or register them: "
            f"temporal operator search-attribute create {creates}"
        )


class TemporalRefused(ClientError):
    """Any other refusal by the Temporal server (permissions, a bad namespace, ...)."""

    def __init__(self, server_message: str) -> None:
        super().__init__(f"Temporal refused the request: {server_message}")


class NoWorker(ClientError):
    """A call that needs a worker (start's checks, the checkpoint verbs) found none
    polling the task queue: nothing was checked, moved or started."""

    def __init__(self, task_queue: str) -> None:
        super().__init__(
            f"no worker polls task queue '{task_queue}': start one ('lazarus worker'), "
            "which runs start's checks and the checkpoint commands; nothing was started"
        )
        self.task_queue = task_queue


class WorkerCallFailed(ClientError):
    """A worker took the call and could not answer it (its activity failed)."""
