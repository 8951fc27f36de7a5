"""Two controller workers, one killed: who holds supervision, and when the survivor took it.

The takeover time is read from Temporal's own view of the pending ``supervise``
activity (which worker holds it, when its attempt started, when it last beat), so the
bench (:mod:`bench.scenarios_ha`) and the end-to-end test measure it the same way, with
no instrumentation in the controller.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import WorkflowHandle

from lazarus.app.local_stack import LocalStack

SUPERVISE_ACTIVITY = "supervise"


def worker_identity(pid: int) -> str:
    """The identity a worker process reports to Temporal: the SDK's default, pid@host."""
    return f"{pid}@{socket.gethostname()}"


@dataclass(frozen=True)
class SupervisionHold:
    """The job's running supervise attempt, as the server sees it."""

    identity: str
    attempt: int
    started_at: float
    """When this attempt started on its worker (server clock, epoch seconds)."""
    last_heartbeat_at: float | None


async def supervision_hold(handle: WorkflowHandle[object, object]) -> SupervisionHold | None:
    """The supervise attempt running now (started on a worker), or None."""
    described = await handle.describe()
    for pending in described.raw_description.pending_activities:
        if pending.activity_type.name != SUPERVISE_ACTIVITY:
            continue
        if pending.state != PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
            continue
        if not pending.last_worker_identity or not pending.HasField("last_started_time"):
            continue
        beat = (
            pending.last_heartbeat_time.ToMicroseconds() / 1e6
            if pending.HasField("last_heartbeat_time")
            else None
        )
        return SupervisionHold(
            identity=pending.last_worker_identity,
            attempt=pending.attempt,
            started_at=pending.last_started_time.ToMicroseconds() / 1e6,
            last_heartbeat_at=beat,
        )
    return None


async def wait_for_hold(
    handle: WorkflowHandle[object, object],
    identities: set[str],
    after: float = 0.0,
    timeout_s: float = 60.0,
    with_heartbeat: bool = False,
) -> SupervisionHold:
    """Wait until one of ``identities`` runs a supervise attempt started after ``after``
    (and, ``with_heartbeat``, has beaten since it started)."""
    deadline = time.monotonic() + timeout_s
    last: SupervisionHold | None = None
    while time.monotonic() < deadline:
        last = await supervision_hold(handle)
        if last is not None and last.identity in identities and last.started_at > after:
            beat = last.last_heartbeat_at
            beaten = beat is not None and beat >= last.started_at
            if beaten or not with_heartbeat:
                return last
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no worker of {sorted(identities)} took supervision; last seen: {last}")


@dataclass(frozen=True)
class Takeover:
    """One SIGKILL of the worker holding supervision, and the survivor taking it."""

    killed_identity: str
    survivor_identity: str
    killed_at: float
    started_after_s: float
    """SIGKILL to the survivor's supervise attempt starting."""
    first_heartbeat_after_s: float | None
    """SIGKILL to the survivor's first heartbeat reaching the server."""
    attempt: int


def stack_of(stacks: list[LocalStack], identity: str) -> LocalStack:
    """The stack whose worker reports ``identity``."""
    for stack in stacks:
        if stack.worker_running and worker_identity(stack.worker_pid) == identity:
            return stack
    raise LookupError(f"no running worker of these stacks is {identity}")


async def kill_supervising_worker(
    handle: WorkflowHandle[object, object], stacks: list[LocalStack], timeout_s: float = 60.0
) -> Takeover:
    """SIGKILL whichever worker runs the job's supervision and wait for a survivor to
    run it (and beat once). Every other stack's worker must be running."""
    identities = {worker_identity(s.worker_pid) for s in stacks if s.worker_running}
    holding = await wait_for_hold(handle, identities, timeout_s=timeout_s)
    victim = stack_of(stacks, holding.identity)
    survivors = identities - {holding.identity}
    killed_at = time.time()
    victim.kill_worker(signal.SIGKILL)
    taken = await wait_for_hold(handle, survivors, after=killed_at, timeout_s=timeout_s)
    try:
        beaten = await wait_for_hold(
            handle, survivors, after=killed_at, timeout_s=timeout_s, with_heartbeat=True
        )
        first_beat = beaten.last_heartbeat_at
    except TimeoutError:  # a supervise that finished at once (the job ended) never beat
        first_beat = None
    return Takeover(
        killed_identity=holding.identity,
        survivor_identity=taken.identity,
        killed_at=killed_at,
        started_after_s=taken.started_at - killed_at,
        first_heartbeat_after_s=first_beat - killed_at if first_beat is not None else None,
        attempt=taken.attempt,
    )


def second_stack(first: LocalStack, state_dir: Path) -> LocalStack:
    """Another worker process on ``first``'s server and task queue (same host, so it
    polls the same host queue too): production's second controller, in miniature."""
    return LocalStack(state_dir, task_queue=first.task_queue, server=first.server)
