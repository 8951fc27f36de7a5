"""``lazarus``: start, watch and steer training jobs, and run the server and worker.

The CLI never imports workflow or activity code: it addresses jobs by the names
in :mod:`lazarus.domain.api` and exchanges only the models of :mod:`lazarus.workflows.state`.
Failures a person can fix (a bad spec, no server, a job name that does not
exist) end in one line on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
import yaml
from rich.console import Console
from rich.live import Live
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
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

from lazarus import cli_render as render
from lazarus.activities.worker_settings import WorkerSettingsError
from lazarus.devserver import (
    DEFAULT_PORT,
    DEFAULT_STATE_DIR,
    DEFAULT_UI_PORT,
    DevServerError,
    dev_server_command,
)
from lazarus.domain.api import (
    JOB_ATTRIBUTE,
    PHASE_ATTRIBUTE,
    QUERY_STATUS,
    SEARCH_ATTRIBUTES,
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
from lazarus.domain.spec import JobSpec, SpecError, load_spec
from lazarus.settings import (
    ConnectionProblem,
    ConnectionSettings,
    ServerUnreachable,
    connect,
    web_ui_url,
)
from lazarus.workflows.state import ForceRecover, Incident, JobInput, JobStatus, NodeRequest, Phase

if TYPE_CHECKING:
    from lazarus.activities.checkpoints.resume_plan import ResumePlan

SUPERVISE_ACTIVITY = "supervise"
QUERY_TIMEOUT = timedelta(seconds=5)
"""A query needs a worker; without one it would wait for the server's long deadline."""
WATCH_INTERVAL_S = 1.0

T = TypeVar("T")

app = typer.Typer(
    name="lazarus",
    help="Keep distributed training jobs running through failures.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class JobNotFound(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(f"no job named '{name}'; see 'lazarus list'")


class Refusal(Exception):
    """A request the server turned down for a reason the user can act on."""


# --- plumbing -----------------------------------------------------------------------------


def _out() -> Console:
    return Console(highlight=False)


def _fail(message: str, code: int = 1) -> NoReturn:
    Console(stderr=True, highlight=False, soft_wrap=True).print(message, markup=False)
    raise typer.Exit(code)


def _print_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=False))


def _settings(ctx: typer.Context) -> ConnectionSettings:
    settings = ctx.find_root().obj
    if not isinstance(settings, ConnectionSettings):  # invoked without the app callback
        settings = ConnectionSettings.from_env()
    return settings


def _with_client(ctx: typer.Context, action: Callable[[Client], Awaitable[T]]) -> T:
    """Connect, run ``action``, and turn every failure a person can fix into one line."""
    settings = _settings(ctx)

    async def main() -> T:
        client = await connect(settings)
        return await action(client)

    try:
        return asyncio.run(main())
    except ConnectionProblem as exc:
        _fail(str(exc))
    except (JobNotFound, Refusal) as exc:
        _fail(str(exc))
    except RPCError as exc:
        if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            _fail(str(ServerUnreachable(settings.address)))
        _fail(f"Temporal refused the request: {exc.message}")


async def _describe(
    client: Client, name: str
) -> tuple[WorkflowHandle[Any, Any], WorkflowExecutionDescription]:
    handle = client.get_workflow_handle(workflow_id_for(name))
    try:
        return handle, await handle.describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise JobNotFound(name) from None
        raise


def _is_open(description: WorkflowExecutionDescription) -> bool:
    return description.status in (None, WorkflowExecutionStatus.RUNNING)


def _status_name(description: WorkflowExecutionDescription) -> str:
    status = description.status
    return "UNKNOWN" if status is None else status.name


async def _live_progress(
    client: Client, description: WorkflowExecutionDescription
) -> SupervisionProgress | None:
    """The supervise activity's last heartbeat: fresher than anything in history."""
    for activity in description.raw_description.pending_activities:
        if activity.activity_type.name != SUPERVISE_ACTIVITY:
            continue
        payloads = activity.heartbeat_details.payloads
        if not payloads:
            continue
        try:
            (progress,) = await client.data_converter.decode(payloads[:1], [SupervisionProgress])
        except Exception:  # an older or newer heartbeat shape: just skip the live view
            continue
        if isinstance(progress, SupervisionProgress):
            return progress
    return None


async def _query_status(handle: WorkflowHandle[Any, Any]) -> tuple[JobStatus | None, str | None]:
    """The workflow's own status, or why it could not be had.

    Queries on closed workflows work too (a worker replays the history), but only
    while a worker is polling; without one we fall back to Temporal's view.
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


async def _final_status(client: Client, workflow_id: str) -> JobStatus | None:
    """A completed job's result is its final status: readable without any worker."""
    handle = client.get_workflow_handle(workflow_id, result_type=JobStatus)
    try:
        result = await handle.result(follow_runs=False, rpc_timeout=QUERY_TIMEOUT)
    except Exception:  # not a JobStatus result (an older workflow version), or gone
        return None
    return result if isinstance(result, JobStatus) else None


async def fetch_status(client: Client, name: str) -> render.StatusView:
    """Everything known about one job; public so the demo and bench draw the same view.

    Raises :class:`JobNotFound` for a name Temporal has never seen.
    """
    handle, description = await _describe(client, name)
    live = await _live_progress(client, description) if _is_open(description) else None
    status, note = await _query_status(handle)
    if status is None and description.status == WorkflowExecutionStatus.COMPLETED:
        status = await _final_status(client, description.id)
        note = None if status is not None else note
    attributes = description.typed_search_attributes
    return render.StatusView(
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


async def _list_jobs(client: Client) -> list[render.JobRow]:
    """One row per job: the newest run of each workflow id (continue-as-new and
    re-starts leave older runs in visibility)."""
    newest: dict[str, render.JobRow] = {}
    async for execution in client.list_workflows(f"WorkflowType = '{WORKFLOW_TYPE}'"):
        attributes = execution.typed_search_attributes
        row = render.JobRow(
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


def _started(row: render.JobRow) -> datetime:
    return row.start_time or datetime.min.replace(tzinfo=UTC)


# --- app ----------------------------------------------------------------------------------


@app.callback()
def main(
    ctx: typer.Context,
    address: Annotated[
        str | None,
        typer.Option(help="Temporal gRPC address (env TEMPORAL_ADDRESS, default localhost:7233)"),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(help="Temporal namespace (env TEMPORAL_NAMESPACE, default 'default')"),
    ] = None,
) -> None:
    """Keep distributed training jobs running through failures."""
    ctx.obj = ConnectionSettings.from_env(address=address, namespace=namespace)


@app.command()
def start(
    ctx: typer.Context,
    spec_file: Annotated[Path, typer.Argument(metavar="JOB.yaml", help="The job spec.")],
    name: Annotated[
        str | None, typer.Option(help="Run under this name instead of the spec's.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the plan; start nothing, contact nothing.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    check_nodes: Annotated[
        bool,
        typer.Option(
            "--check-nodes/--no-check-nodes",
            help="Reach every ssh node first (host key, identity, interpreter).",
        ),
    ] = True,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="Start from step 0: move existing checkpoints aside (kept, not deleted).",
        ),
    ] = False,
) -> None:
    """Start a job from its spec (a job name runs at most once at a time).

    Says first whether the job will resume from an existing checkpoint (its step,
    the job that wrote it, and when), so a leftover never passes for progress."""
    from lazarus import cli_checkpoints
    from lazarus.activities.checkpoints.resume_plan import FreshRefused, start_fresh

    try:
        spec = load_spec(spec_file, name_override=name)
    except SpecError as exc:
        _fail("\n".join(exc.lines), code=2)
    if (
        check_nodes
        and not dry_run
        and any(n.launcher == "ssh" for n in (*spec.nodes, *spec.spares))
    ):
        problems = _unusable_nodes(spec_file, spec)
        if problems:
            _fail("\n".join(problems), code=2)
    settings = _settings(ctx)
    workflow_id = workflow_id_for(spec.name)
    if dry_run:
        plan = None if fresh else _resume_plan(spec)
        if as_json:
            _print_json(
                {
                    **render.dry_run_json(spec, workflow_id, settings.task_queue),
                    "resume_from": cli_checkpoints.resume_json(plan),
                }
            )
        else:
            out = _out()
            out.print("[bold]resolved spec[/]")
            out.print(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False), markup=False)
            out.print(render.render_dry_run(spec, workflow_id, settings.task_queue))
            if fresh:
                out.print(f"--fresh would move the checkpoints in {spec.checkpoint_dir} aside")
            elif plan is not None:
                for line in cli_checkpoints.resume_lines(plan, spec.name):
                    out.print(line, markup=False)
        return
    said: list[str] = []
    plan_holder: list[ResumePlan | None] = []

    async def before_start(client: Client) -> None:
        """--fresh and the resume notice, once the name is known to be free: moving a
        running job's checkpoints aside would pull them from under it."""
        try:
            _, description = await _describe(client, spec.name)
        except JobNotFound:
            description = None
        if description is not None and _is_open(description):
            raise Refusal(
                f"job '{spec.name}' is already running ({workflow_id}); "
                f"see 'lazarus status {spec.name}', or start it under another --name"
            )
        if fresh:
            try:
                moved = await asyncio.to_thread(start_fresh, spec)
            except FreshRefused as exc:
                raise Refusal(str(exc)) from None
            said.extend(cli_checkpoints.set_aside_lines(moved))
        plan = await asyncio.to_thread(_resume_plan, spec)
        plan_holder.append(plan)
        if plan is not None:
            said.extend(cli_checkpoints.resume_lines(plan, spec.name))
        if not as_json:
            for line in said:
                _out().print(line, markup=False)

    async def action(client: Client) -> str:
        await before_start(client)
        try:
            handle = await client.start_workflow(
                WORKFLOW_TYPE,
                JobInput(spec=spec),
                id=workflow_id,
                task_queue=settings.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(PHASE_ATTRIBUTE, Phase.PENDING.value),
                        SearchAttributePair(JOB_ATTRIBUTE, spec.name),
                        SearchAttributePair(STEP_ATTRIBUTE, 0),
                    ]
                ),
            )
        except WorkflowAlreadyStartedError:
            raise Refusal(
                f"job '{spec.name}' is already running ({workflow_id}); "
                f"see 'lazarus status {spec.name}', or start it under another --name"
            ) from None
        except RPCError as exc:
            if exc.status == RPCStatusCode.INVALID_ARGUMENT and "search attribute" in exc.message:
                raise Refusal(_missing_attributes_hint(exc.message)) from None
            raise
        return handle.result_run_id or ""

    run_id = _with_client(ctx, action)
    url = web_ui_url(settings, workflow_id)
    if as_json:
        _print_json(
            {
                "job": spec.name,
                "workflow_id": workflow_id,
                "run_id": run_id,
                "ui": url,
                "resume_from": cli_checkpoints.resume_json(plan_holder[0] if plan_holder else None),
                "checkpoint_dir": spec.checkpoint_dir,
                "notes": said,
            }
        )
        return
    out = _out()
    out.print(f"started job [bold]{spec.name}[/] as workflow {workflow_id}")
    if url:
        out.print(f"web UI: {url}", markup=False)
    out.print(f"follow it with: lazarus status {spec.name} --watch", markup=False)
    for note in render.start_notes(spec):
        out.print(note, markup=False, style="yellow")


def _resume_plan(spec: JobSpec) -> ResumePlan | None:
    """The resume point as this machine sees it; None if it cannot look (the
    notice is advice: it never stops a start)."""
    from lazarus.activities.checkpoints.resume_plan import plan_resume

    try:
        return plan_resume(spec)
    except (OSError, ValueError) as exc:
        _out().print(
            f"note: cannot inspect {spec.checkpoint_dir} for a resume point: {exc}", markup=False
        )
        return None


def _unusable_nodes(spec_file: Path, spec: JobSpec) -> list[str]:
    """Bad hosts are bad input: a wrong host key, an unreachable host or a bad identity
    file is reported here, naming the node, and nothing is started."""
    from lazarus.activities.preflight import check_nodes
    from lazarus.domain.contracts import PreflightActivityRequest

    everything = [*spec.nodes, *spec.spares]
    with _out().status(f"checking {len(everything)} nodes ..."):
        report = check_nodes(
            PreflightActivityRequest(
                nodes=everything,
                ssh=spec.ssh,
                checks=spec.preflight,
                interpreter=spec.command[0],
                workdir=spec.workdir,
                disk_path=spec.checkpoint_dir,
                search_path=spec.env.get("PATH"),
            )
        )
    where = {n.name: f"nodes[{i}]" for i, n in enumerate(spec.nodes)}
    where.update({n.name: f"spares[{i}]" for i, n in enumerate(spec.spares)})
    spares = {n.name for n in spec.spares}
    for health in report.failed:
        if health.node in spares:  # a bad spare is worth a warning, not a refusal
            for problem in health.problems:
                _out().print(
                    f"warning: {where[health.node]} ({health.node}): {problem}", markup=False
                )
    return [
        f"{spec_file}: {where[health.node]} ({health.node}): {problem}"
        for health in report.failed
        if health.node not in spares
        for problem in health.problems
    ]


def _missing_attributes_hint(message: str) -> str:
    creates = " ".join(
        f"--name {key.name} --type {key.indexed_value_type.name.title().replace('_', '')}"
        for key in SEARCH_ATTRIBUTES
    )
    return (
        f"the server does not know Lazarus's search attributes ({message}); "
        "use 'lazarus server', or register them: "
        f"temporal operator search-attribute create {creates}"
    )


@app.command()
def status(
    ctx: typer.Context,
    job: Annotated[str | None, typer.Argument(help="Job name; omit to list all jobs.")] = None,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Refresh every second until the job ends.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Where a job is: phase, step, ranks, incidents, ETTR."""
    if job is None:
        list_jobs(ctx, as_json=as_json)
        return
    if watch and not as_json:
        _with_client(ctx, lambda client: _watch(client, job))
        return
    view = _with_client(ctx, lambda client: fetch_status(client, job))
    if as_json:
        _print_json(render.status_json(view))
    else:
        _out().print(render.render_status(view))


async def _watch(client: Client, job: str) -> None:
    view = await fetch_status(client, job)
    try:
        with Live(render.render_status(view), console=_out(), auto_refresh=False) as live:
            while not view.is_terminal:
                await asyncio.sleep(WATCH_INTERVAL_S)
                view = await fetch_status(client, job)
                live.update(render.render_status(view), refresh=True)
    except (KeyboardInterrupt, asyncio.CancelledError):
        return


@app.command("list")
def list_jobs(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Every job this namespace knows, newest run of each."""
    rows = _with_client(ctx, _list_jobs)
    if as_json:
        _print_json(render.job_list_json(rows))
    else:
        _out().print(render.render_job_list(rows))


def _signal_open_job(
    ctx: typer.Context,
    job: str,
    signal: str,
    arg: object | None,
    verb: str,
    allowed_in: tuple[Phase, ...] = (),
) -> None:
    """Signal an open job. With ``allowed_in``, a job in another phase is refused here,
    with the reason, before anything is sent (the job would record it as ignored)."""

    async def action(client: Client) -> None:
        handle, description = await _describe(client, job)
        if not _is_open(description):
            closed_as = _status_name(description)
            raise Refusal(f"job '{job}' is already closed ({closed_as}); cannot {verb} it")
        if allowed_in:
            status = await handle.query(
                QUERY_STATUS, result_type=JobStatus, rpc_timeout=QUERY_TIMEOUT
            )
            if status.phase not in allowed_in:
                wanted = " or ".join(p.value for p in allowed_in)
                raise Refusal(
                    f"job '{job}' is {status.phase.value}; {verb} applies only when it is "
                    f"{wanted}: nothing sent"
                )
        if arg is None:
            await handle.signal(signal)
        else:
            await handle.signal(signal, arg)

    _with_client(ctx, action)


@app.command()
def pause(ctx: typer.Context, job: str) -> None:
    """Stop the ranks and hold; 'resume' relaunches them from the last checkpoint."""
    _signal_open_job(
        ctx,
        job,
        SIGNAL_PAUSE,
        None,
        "pause",
        allowed_in=(Phase.PENDING, Phase.LAUNCHING, Phase.RUNNING, Phase.RECOVERING),
    )
    _out().print(f"asked job '{job}' to pause", markup=False)


@app.command()
def resume(ctx: typer.Context, job: str) -> None:
    """Relaunch a paused job, or one waiting for an operator."""
    _signal_open_job(
        ctx, job, SIGNAL_RESUME, None, "resume", allowed_in=(Phase.PAUSED, Phase.NEEDS_OPERATOR)
    )
    _out().print(f"asked job '{job}' to resume", markup=False)


@app.command()
def recover(
    ctx: typer.Context,
    job: str,
    reason: Annotated[str, typer.Option(help="Recorded in the incident.")] = "forced by operator",
    exclude_node: Annotated[
        str | None,
        typer.Option(help="Quarantine this node and relaunch on a spare instead."),
    ] = None,
    checkpoint_first: Annotated[
        bool,
        typer.Option(
            "--checkpoint-first",
            help="Ask the ranks for a checkpoint before stopping them (loses no steps).",
        ),
    ] = False,
) -> None:
    """Restart the job's ranks from the last checkpoint now, as if a rank had failed."""
    request = ForceRecover(
        reason=reason, exclude_node=exclude_node, checkpoint_first=checkpoint_first
    )
    # An update, not a signal: the job validates it first, so a typo in --exclude-node
    # is refused with the reason instead of quarantining nothing and growing the world.
    reply = _update_open_job(ctx, job, UPDATE_RECOVER, request)
    _out().print(f"job '{job}': {reply}", markup=False)


def _update_open_job(
    ctx: typer.Context, job: str, update: str, request: NodeRequest | ForceRecover
) -> str:
    """Updates, unlike signals, answer: an unknown node is refused with the reason."""

    async def action(client: Client) -> str:
        handle, description = await _describe(client, job)
        if not _is_open(description):
            raise Refusal(f"job '{job}' is already closed ({_status_name(description)})")
        try:
            reply = await handle.execute_update(update, request, result_type=str)
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            while cause.__cause__ is not None:
                cause = cause.__cause__
            raise Refusal(f"job '{job}': {cause}") from None
        return str(reply)

    return _with_client(ctx, action)


@app.command()
def drain(
    ctx: typer.Context,
    job: str,
    node: str,
    reason: Annotated[str, typer.Option(help="Recorded with the quarantine.")] = "",
) -> None:
    """Move the job off NODE: quarantine it and relaunch its ranks on a spare."""
    reply = _update_open_job(ctx, job, UPDATE_DRAIN, NodeRequest(node=node, reason=reason))
    _out().print(reply, markup=False)


@app.command("return")
def return_node(ctx: typer.Context, job: str, node: str) -> None:
    """Take NODE out of quarantine into the spares (after stopping anything stale on it)."""
    reply = _update_open_job(ctx, job, UPDATE_RETURN, NodeRequest(node=node))
    _out().print(reply, markup=False)


@app.command()
def cancel(ctx: typer.Context, job: str) -> None:
    """Stop the job's ranks and end it as CANCELLED (a no-op on a job that already ended)."""

    async def action(client: Client) -> str | None:
        handle, description = await _describe(client, job)
        if not _is_open(description):
            return _status_name(description)
        try:
            await handle.cancel()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:  # it closed between describe and cancel
                return "CLOSED"
            raise
        return None

    closed_as = _with_client(ctx, action)
    if closed_as is not None:
        _out().print(
            f"job '{job}' is already closed ({closed_as}); nothing to cancel", markup=False
        )
    else:
        _out().print(f"cancelling job '{job}': its ranks are being stopped", markup=False)


@app.command()
def incidents(
    ctx: typer.Context,
    job: str,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Every failure of the job and what was done about it."""

    async def action(client: Client) -> list[Incident]:
        handle, _ = await _describe(client, job)
        status_, note = await _query_status(handle)
        if status_ is None:
            raise Refusal(note or "the job did not answer")
        return status_.incidents

    found = _with_client(ctx, action)
    if as_json:
        _print_json(render.incidents_json(found))
    elif not found:
        _out().print(f"job '{job}' has had no incidents", markup=False)
    else:
        _out().print(render.incidents_table(found))


@app.command()
def server(
    port: Annotated[int, typer.Option(help="gRPC port.")] = DEFAULT_PORT,
    ui_port: Annotated[int, typer.Option(help="Web UI port.")] = DEFAULT_UI_PORT,
    state_dir: Annotated[
        Path, typer.Option(help="Where the sqlite state lives; jobs survive restarts.")
    ] = DEFAULT_STATE_DIR,
    ip: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
) -> None:
    """Run a local Temporal dev server in the foreground, with Lazarus's search attributes."""
    state = state_dir.expanduser()
    state.mkdir(parents=True, exist_ok=True)
    try:
        command = dev_server_command(port, ui_port, state, ip)
    except DevServerError as exc:
        _fail(str(exc))
    out = _out()
    out.print(f"Temporal dev server on {ip}:{port}, state in {state}", markup=False)
    out.print(f"web UI: http://localhost:{ui_port}", markup=False)
    out.print("stop it with Ctrl-C", markup=False)
    sys.stdout.flush()
    sys.stderr.flush()
    # exec: the server becomes this process, so Ctrl-C and SIGTERM reach it directly
    # and it shuts down cleanly, with no wrapper left to forward signals.
    os.execv(command[0], command)


@app.command()
def worker(
    ctx: typer.Context,
    task_queue: Annotated[
        str | None,
        typer.Option(help="Task queue to poll (env LAZARUS_TASK_QUEUE, default 'lazarus')"),
    ] = None,
    deployment: Annotated[
        str | None,
        typer.Option(
            help="Worker Deployment name: jobs are pinned to this worker's build and move to "
            "a new build at their next continue-as-new (env LAZARUS_DEPLOYMENT)."
        ),
    ] = None,
    build_id: Annotated[
        str | None,
        typer.Option(help="This worker's build id within --deployment (env LAZARUS_BUILD_ID)."),
    ] = None,
) -> None:
    """Run the controller worker: the workflow and the activities that launch and watch ranks."""
    from lazarus.workers.controller import run_worker  # heavy, and only this command needs it
    from lazarus.workers.versioning import WorkerDeployment

    settings = _settings(ctx)
    queue = task_queue or settings.task_queue
    if task_queue:
        settings = settings.model_copy(update={"task_queue": task_queue})
    try:
        versioned = (
            WorkerDeployment(name=deployment or "", build_id=build_id or "")
            if deployment or build_id
            else WorkerDeployment.from_env()
        )
    except ValueError as exc:
        _fail(f"--deployment and --build-id go together: {exc}")
    try:
        asyncio.run(run_worker(settings, queue, versioned))
    except (ConnectionProblem, WorkerSettingsError) as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        pass


@app.command()
def classify(
    logfile: Annotated[
        Path, typer.Argument(metavar="LOGFILE", help="A rank's log, or - for stdin.")
    ],
    exit_code: Annotated[int | None, typer.Option(help="The rank's exit code, if known.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Name the failure class of a log, with the lines that decided it. Offline."""
    from lazarus.domain.classifier import classify as classify_log

    if str(logfile) == "-":
        text = sys.stdin.read()
    else:
        try:
            text = logfile.read_text(errors="replace")
        except OSError as exc:
            _fail(f"{logfile}: cannot read the file: {exc.strerror or exc}", code=2)
    result = classify_log(text, exit_code=exit_code)
    payload = {
        "class": str(result.failure_class),
        "confidence": round(result.confidence, 3),
        "evidence": result.evidence,
        "suspect_rank": result.suspect_rank,
        "suspect_node": result.suspect_node,
    }
    if as_json:
        _print_json(payload)
        return
    out = _out()
    out.print(f"[bold]{payload['class']}[/] (confidence {payload['confidence']:.2f})")
    if result.suspect_rank is not None or result.suspect_node is not None:
        out.print(f"suspect: rank {_dash(result.suspect_rank)}, node {_dash(result.suspect_node)}")
    for line in result.evidence:
        out.print(f"  [dim]>[/] {line}", markup=True, highlight=False)


def _dash(value: object) -> str:
    return "—" if value is None else str(value)


@app.command()
def verify(
    target: Annotated[
        str,
        typer.Argument(
            metavar="PATH|URI",
            help="A checkpoint (.../step-NNNNNNNN) or a root holding several: "
            "a directory or s3://bucket/prefix.",
        ),
    ],
    sizes_only: Annotated[
        bool, typer.Option("--sizes-only", help="Check sizes, not sha256 (much faster).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    endpoint_url: Annotated[
        str | None,
        typer.Option(help="S3-compatible endpoint (or env AWS_ENDPOINT_URL); keys: AWS chain."),
    ] = None,
    world_size: Annotated[
        int | None, typer.Option(help="Also require the manifest's world size to be this.")
    ] = None,
) -> None:
    """Check checkpoints against their manifest: marker, sizes, sha256. Offline.

    Exits 0 when every checkpoint is good, 1 when one is corrupt (problems
    listed), 2 when it could not check (no such path, no checkpoint, store
    unreachable)."""
    from lazarus import cli_checkpoints
    from lazarus.activities.checkpoints.storage import CheckpointInputError, locate, store_errors
    from lazarus.activities.checkpoints.verify import verify_in_store

    try:
        store, name = locate(target, endpoint_url=endpoint_url)
        if name is not None and not store.exists(name):
            raise CheckpointInputError(f"{target}: no such checkpoint")
        names = [name] if name is not None else [n for _, n in reversed(store.steps())]
        if not names:
            raise CheckpointInputError(f"{target}: no checkpoints (step-NNNNNNNN) under it")
        results = [
            verify_in_store(
                store, n, "sizes" if sizes_only else "hashes", expected_world_size=world_size
            )
            for n in names
        ]
    except CheckpointInputError as exc:
        _fail(str(exc), code=2)
    except store_errors() as exc:
        _fail(f"{target}: cannot read the store: {exc}", code=2)
    if as_json:
        _print_json(cli_checkpoints.verification_json(results))
    else:
        _out().print(cli_checkpoints.render_verification(results))
    if not all(r.ok for r in results):
        raise typer.Exit(1)


@app.command()
def checkpoints(
    ctx: typer.Context,
    job: Annotated[
        str | None, typer.Argument(help="Job name (its directories come from its status).")
    ] = None,
    directory: Annotated[
        str | None, typer.Option("--dir", help="List this checkpoint directory (no server).")
    ] = None,
    uri: Annotated[
        str | None, typer.Option("--uri", help="List this durable store (no server).")
    ] = None,
    endpoint_url: Annotated[
        str | None, typer.Option(help="S3-compatible endpoint (or env AWS_ENDPOINT_URL).")
    ] = None,
    hashes: Annotated[
        bool, typer.Option("--hashes", help="Verify sha256 (reads every byte); default sizes.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """A job's checkpoints: step, time, size, verified locally, durable."""
    from lazarus import cli_checkpoints
    from lazarus.activities.checkpoints.listing import list_checkpoints
    from lazarus.activities.checkpoints.storage import CheckpointInputError, store_errors

    if job is None and directory is None and uri is None:
        _fail("give a JOB, or --dir PATH and/or --uri URI to list without a server", code=2)
    if job is not None:

        async def action(client: Client) -> tuple[str, str | None]:
            handle, _ = await _describe(client, job)
            status_, note = await _query_status(handle)
            if status_ is None:
                raise Refusal(f"{note or 'the job did not answer'}; or use --dir/--uri")
            if not status_.checkpoint_dir:
                raise Refusal(f"job '{job}' reports no checkpoint directory; use --dir")
            return status_.checkpoint_dir, getattr(status_, "durable_checkpoint_uri", None)

        found_dir, found_uri = _with_client(ctx, action)
        directory = directory or found_dir
        uri = uri or found_uri
    try:
        rows = list_checkpoints(directory, uri, endpoint_url=endpoint_url, hashes=hashes)
    except CheckpointInputError as exc:
        _fail(str(exc), code=2)
    except store_errors() as exc:
        _fail(f"{uri}: cannot read the durable store: {exc}", code=2)
    if as_json:
        _print_json(cli_checkpoints.checkpoints_json(rows))
    elif not rows:
        _out().print(f"no checkpoints in {directory or ''} {uri or ''}".strip(), markup=False)
    else:
        _out().print(cli_checkpoints.checkpoints_table(rows))


def run() -> None:
    """The console entry point: ``app`` with an exit that skips interpreter shutdown.

    The Temporal client's Rust core keeps native threads alive; a normal shutdown
    occasionally races them and aborts (SIGABRT) a command that already printed its
    answer, turning exit code 0 into -6. Everything is flushed first, so nothing the
    command wrote is lost."""
    code = 0
    try:
        app()
    except SystemExit as exc:
        if isinstance(exc.code, int):
            code = exc.code
        elif exc.code is not None:
            print(exc.code, file=sys.stderr)
            code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
