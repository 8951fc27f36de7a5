"""Which task queue a job's activities go to: the host's own, for machine-bound work.

Production runs two or more controller workers, on different machines, against one
Temporal cluster, all polling the job task queue (``lazarus`` by default). Most
activities may run on any of them: an ssh node is as reachable from one worker as
from another, a Slurm allocation too. A job whose nodes are ``launcher: local`` is
different: its ranks, run directory and checkpoint directory are on the machine
that launched them, and a ``stop`` or ``supervise`` picked up by a worker on another
machine would look at an empty directory there and report every rank gone.

So each worker also polls a queue of its own host, ``<task_queue>@<host>`` (the
worker-specific task queue pattern of Temporal's samples), and a local job sends
its machine-bound activities there once it knows its host: from the spec, when its
local nodes name the machine (``host:`` other than loopback), else from the first
launch's result (the host of the worker that launched the ranks). Every worker on
that host polls that queue, so a SIGKILLed worker's supervision is retried on a
surviving worker of the same machine within ``supervisor_heartbeat_timeout_s``.

Pure functions only: the workflow decides, the worker names its queue with the same
:func:`host_task_queue`; ``tests/unit/test_routing.py`` checks them without a server.
"""

from __future__ import annotations

from typing import Any

from lazarus.domain.activity_refs import (
    CHECKPOINT_NOW,
    COLLECT_GARBAGE,
    FIND_VERIFIED_CHECKPOINT,
    LAUNCH,
    PREFLIGHT,
    RESTORE_CHECKPOINT,
    ROLL_BACK_CHECKPOINT,
    SET_CHECKPOINT_INTERVAL,
    STOP,
    SUPERVISE,
    UPLOAD_CHECKPOINT,
    WATCH_CHECKPOINTS,
    ActivityRef,
)
from lazarus.domain.spec import JobSpec

HOST_SEPARATOR = "@"
"""``<task_queue>@<host>``: one queue per machine, beside the shared one."""

MACHINE_BOUND: frozenset[str] = frozenset(
    ref.name
    for ref in (
        LAUNCH,
        SUPERVISE,
        STOP,
        PREFLIGHT,
        CHECKPOINT_NOW,
        SET_CHECKPOINT_INTERVAL,
        FIND_VERIFIED_CHECKPOINT,
        RESTORE_CHECKPOINT,
        ROLL_BACK_CHECKPOINT,
        WATCH_CHECKPOINTS,
        UPLOAD_CHECKPOINT,
        COLLECT_GARBAGE,
    )
)
"""Activities that touch a local job's ranks, run directory or checkpoint directory
on the controller's own machine. The escalation hook, fleet calls and Slurm
allocation changes are not: any worker may run them."""

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0", ""})


def host_task_queue(task_queue: str, host: str) -> str:
    """The queue of ``host``'s workers beside ``task_queue`` (itself possibly a host
    queue already: the base part is kept, so naming twice changes nothing)."""
    base = task_queue.split(HOST_SEPARATOR, 1)[0]
    return f"{base}{HOST_SEPARATOR}{host}"


def routes_by_host(spec: JobSpec) -> bool:
    """Only jobs of local nodes are tied to a machine; ssh and Slurm jobs never ask
    for the patch, so their commands stay exactly what they were."""
    return all(node.transport.runs_here for node in (*spec.nodes, *spec.spares))


def declared_host(spec: JobSpec) -> str | None:
    """The machine a local job's nodes name (``host:`` other than loopback, the same
    on every node), or None: then the first launch tells."""
    hosts = {node.host for node in (*spec.nodes, *spec.spares)}
    if len(hosts) != 1 or not routes_by_host(spec):
        return None
    (host,) = hosts
    return None if host in LOOPBACK_HOSTS else host


def learned_host_queue(current: str | None, task_queue: str, launched_on: str | None) -> str | None:
    """The host queue after a launch: the one already chosen stays (a relaunch after a
    worker moved never moves the job); otherwise the launching worker's host."""
    if current is not None or launched_on is None:
        return current
    return host_task_queue(task_queue, launched_on)


def route(ref: ActivityRef[Any, Any], host_queue: str | None) -> dict[str, str]:
    """Extra ``execute`` options for ``ref``: ``task_queue=<host queue>`` for machine-bound
    activities of a job that has one, nothing otherwise (the workflow's own queue)."""
    if host_queue is None or ref.name not in MACHINE_BOUND:
        return {}
    return {"task_queue": host_queue}
