"""The controller worker: hosts the job workflow and every activity.

Ranks never belong to this process, so it may be killed, restarted or replaced at
any time; a worker that comes back (here or on another machine sharing the run
directory) picks up supervision where the last one stopped. SIGTERM drains it
gracefully: running activities are cancelled and retried elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.common import SearchAttributeIndexedValueType
from temporalio.worker import Worker

from activities.checkpoints import (
    collect_garbage,
    find_verified_checkpoint,
    restore_checkpoint,
    upload_checkpoint,
)
from activities.checkpoints.interval import set_checkpoint_interval
from activities.checkpoints.just_in_time import checkpoint_now
from activities.checkpoints.reports import (
    list_checkpoints_for_client,
    verify_checkpoints_for_client,
)
from activities.checkpoints.rollback import roll_back_checkpoint
from activities.checkpoints.watch import watch_checkpoints
from activities.escalation import run_escalation_hook
from activities.fleet import (
    fleet_hand_back,
    fleet_lease,
    fleet_release,
    fleet_report,
)
from activities.host_identity import this_host
from activities.launcher import launch
from activities.node_logs import ranks_ended_for_client, read_log_for_client
from activities.preflight import preflight
from activities.slurm_allocation import (
    cancel_allocation,
    grow_allocation,
    submit_allocation,
)
from activities.start_checks import start_checks
from activities.stop import stop
from activities.supervise import supervise
from activities.worker_settings import (
    ALLOWED_COMMANDS_ENV,
    ALLOWED_COMMANDS_FILE_ENV,
    WorkerSettings,
)
from activities.worker_settings import (  # what 'lazarus worker' reports as one line
    WorkerSettingsError as WorkerSettingsError,
)
from lazarus.app.metrics import MetricsSettings, prepare_metrics
from lazarus.app.settings import ConnectionSettings, connect
from lazarus.domain.api import DEFAULT_TASK_QUEUE, SEARCH_ATTRIBUTES
from workers.metrics_collector import serving_metrics
from workers.versioning import WorkerDeployment
from workflows.fleet import FleetWorkflow
from workflows.job import JobWorkflow
from workflows.routing import host_task_queue
from workflows.worker_call import WorkerCallWorkflow

log = logging.getLogger("lazarus.worker")

ACTIVITIES: Sequence[Any] = (
    launch,
    supervise,
    stop,
    find_verified_checkpoint,
    upload_checkpoint,
    restore_checkpoint,
    collect_garbage,
    preflight,
    checkpoint_now,
    set_checkpoint_interval,
    roll_back_checkpoint,
    watch_checkpoints,
    run_escalation_hook,
    submit_allocation,
    cancel_allocation,
    grow_allocation,
    fleet_lease,
    fleet_report,
    fleet_release,
    fleet_hand_back,
)
CLIENT_CALLS: Sequence[Any] = (
    start_checks,
    list_checkpoints_for_client,
    verify_checkpoints_for_client,
    read_log_for_client,
    ranks_ended_for_client,
)
"""What a client's call workflow runs (``activity_refs.WORKER_CALLS``): start's checks
and the checkpoint verbs, on the worker, never in the CLI."""
WORKFLOWS: Sequence[type] = (JobWorkflow, FleetWorkflow, WorkerCallWorkflow)


async def ensure_search_attributes(client: Client, namespace: str) -> None:
    """Register Lazarus's search attributes if the server lacks them (idempotent)."""
    existing = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    missing = {
        key.name: IndexedValueType.ValueType(
            SearchAttributeIndexedValueType(key.indexed_value_type)
        )
        for key in SEARCH_ATTRIBUTES
        if key.name not in existing.custom_attributes
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=namespace, search_attributes=missing)
        )
        log.info("registered search attributes %s", sorted(missing))


def build_worker(
    client: Client, task_queue: str, deployment: WorkerDeployment | None = None
) -> Worker:
    """``deployment`` makes this worker one version of a Worker Deployment, and pins
    the jobs it starts to it (see ``workers.versioning``)."""
    return Worker(
        client,
        task_queue=task_queue,
        workflows=list(WORKFLOWS),
        activities=[*ACTIVITIES, *CLIENT_CALLS],
        max_concurrent_activities=256,
        deployment_config=deployment.config() if deployment else None,
    )


def build_host_worker(
    client: Client, task_queue: str, deployment: WorkerDeployment | None = None
) -> Worker:
    """The same activities on this machine's own queue, ``<task_queue>@<host>``: a job of
    local nodes sends its machine-bound activities there (``workflows.routing``),
    so they run on a worker of the machine its ranks live on, never on another."""
    return Worker(
        client,
        task_queue=host_task_queue(task_queue, this_host()),
        activities=[*ACTIVITIES, *CLIENT_CALLS],
        max_concurrent_activities=256,
        deployment_config=deployment.config() if deployment else None,
    )


def log_command_policy(policy: WorkerSettings) -> None:
    """Say at start what this worker will run for any client: an unreadable allow-list
    has already stopped it (``WorkerSettings.from_env`` raises), not each launch."""
    if policy.allowed_commands is None:
        log.warning(
            "no allowed_commands: whoever can start a workflow on this task queue can run "
            "any program as this user (set %s or %s)",
            ALLOWED_COMMANDS_ENV,
            ALLOWED_COMMANDS_FILE_ENV,
        )
    else:
        log.info(
            "allowed_commands from %s: %s",
            policy.allowed_commands_source,
            ", ".join(policy.allowed_commands) or "(empty: nothing may run)",
        )


async def run_worker(
    settings: ConnectionSettings,
    task_queue: str = DEFAULT_TASK_QUEUE,
    deployment: WorkerDeployment | None = None,
    metrics: MetricsSettings | None = None,
) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log_command_policy(WorkerSettings.from_env())
    metrics = metrics or MetricsSettings.from_env()
    prepare_metrics(metrics)  # before connecting: ports checked, SDK metrics on
    client = await connect(settings)
    await ensure_search_attributes(client, settings.namespace)
    deployment = deployment or WorkerDeployment.from_env()
    worker = build_worker(client, task_queue, deployment)
    host_worker = build_host_worker(client, task_queue, deployment)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    log.info(
        "worker polling task queues %r and %r at %s",
        task_queue,
        host_worker.task_queue,
        settings.address,
    )
    async with worker, host_worker, serving_metrics(client, metrics, task_queue):
        await stopping.wait()
        log.info("shutting down: ranks keep running; supervision resumes on the next worker")
