"""``lazarus``: start, watch and steer training jobs, and run the server and worker.

This is the app floor, and presentation only: everything that talks to Temporal
goes through :class:`lazarus.app.client.JobClient` (the supported Python API), and this
module turns its results into rich tables or ``--json`` and its errors into exit
codes. It runs no activity code (issue 40, part 2): start's checks, ``--fresh``, the
resume notice, a dry run's plan and the checkpoint verbs are typed calls to a worker
(:meth:`~lazarus.app.client.JobClient.check_start` and its siblings); it imports the
worker room only for ``lazarus worker``, which runs one.
Failures a person can fix (a bad spec, no server, a job name that does not
exist) end in one line on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, NoReturn, TypeVar

import typer
import yaml
from rich.text import Text

from lazarus.app import cli_render as render
from lazarus.app import cli_wait
from lazarus.app.cli_output import console, plain, say
from lazarus.app.cli_wait import ThroughOperatorOption, TimeoutOption
from lazarus.app.client import (
    ClientError,
    JobClient,
    JobHandle,
    JobNotFound,
    StatusUnavailable,
    plan_start,
)
from lazarus.app.devserver import (
    DEFAULT_PORT,
    DEFAULT_STATE_DIR,
    DEFAULT_UI_PORT,
    DevServerError,
    dev_server_command,
)
from lazarus.app.outcome import Outcome
from lazarus.app.settings import (
    ConnectionProblem,
    ConnectionSettings,
    connect,
    web_ui_url,
)
from lazarus.domain.api import workflow_id_for
from lazarus.domain.checkpoint_views import ResumePlan
from lazarus.domain.job_view import Incident, JobStatus, Phase
from lazarus.domain.spec import JobSpec, SpecError, load_spec
from lazarus.domain.version import __version__
from lazarus.domain.worker_calls import StartCheckResult

T = TypeVar("T")

app = typer.Typer(
    name="lazarus",
    help="Keep distributed training jobs running through failures.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts are plain text: "[rank N]" is not a style tag
)


class Refusal(ClientError):
    """A request this CLI turns down for a reason the user can act on (the client's
    own refusals are the other :class:`ClientError` subclasses)."""


# --- plumbing -----------------------------------------------------------------------------


def _fail(message: str, code: int = 1) -> NoReturn:
    say(message, stderr=True)
    raise typer.Exit(code)


def _print_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=False))


JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def _said(job: str, action: str, message: str, as_json: bool, accepted: bool = True) -> None:
    """A steering verb's answer: its line, or with ``--json`` one object (``job``,
    ``action``, ``accepted``, ``message``). Refusals never come here: they stay one
    plain line on stderr with a non-zero exit, as every error does."""
    if as_json:
        _print_json({"job": job, "action": action, "accepted": accepted, "message": message})
    else:
        say(message)


def _settings(ctx: typer.Context) -> ConnectionSettings:
    settings = ctx.find_root().obj
    if not isinstance(settings, ConnectionSettings):  # invoked without the app callback
        settings = ConnectionSettings.from_env()
    return settings


def _with_client(ctx: typer.Context, action: Callable[[JobClient], Awaitable[T]]) -> T:
    """Connect, run ``action``, and turn every failure a person can fix into one line."""
    settings = _settings(ctx)

    async def main() -> T:
        client = await connect(settings)
        jobs = JobClient(client, task_queue=settings.task_queue, address=settings.address)
        try:
            return await action(jobs)
        except JobNotFound as exc:
            raise await exc.with_suggestion(jobs) from None

    try:
        return asyncio.run(main())
    except JobNotFound as exc:  # every verb that names a job: a script can tell a typo
        _fail(str(exc), Outcome.NO_SUCH_JOB.exit_code)
    except (ConnectionProblem, ClientError) as exc:
        _fail(str(exc))


# --- app ----------------------------------------------------------------------------------


def _print_version(asked: bool) -> None:
    """``lazarus --version``: the installed distribution's version, as ``pip`` and a
    bug report would name it."""
    if asked:
        typer.echo(f"lazarus {__version__}")
        raise typer.Exit()


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
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_version,
            help="Print Lazarus's version and exit.",
        ),
    ] = False,
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
        bool,
        typer.Option(
            "--dry-run",
            help="Show the plan, as the worker that would launch it makes it; start "
            "nothing, move nothing, contact no node.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    check_nodes: Annotated[
        bool,
        typer.Option(
            "--check-nodes/--no-check-nodes",
            help="Check the nodes first, on the worker: every ssh node is reached (host "
            "key, identity, interpreter); on local nodes the command's program must exist.",
        ),
    ] = True,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="Start from step 0: move existing checkpoints aside (kept, not deleted).",
        ),
    ] = False,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Then block until the job ends or needs an operator, and exit with its "
            "outcome, as 'lazarus wait' does.",
        ),
    ] = False,
    timeout: TimeoutOption = None,
    through_operator: ThroughOperatorOption = False,
) -> None:
    """Start a job from its spec (a job name runs at most once at a time).

    Says first whether the job will resume from an existing checkpoint (its step,
    the job that wrote it, and when), so a leftover never passes for progress."""
    from lazarus.app import cli_checkpoints

    try:
        spec = load_spec(spec_file, name_override=name)
        plan_start(spec)  # the job's name, checked here (no server needed)
    except SpecError as exc:
        _fail("\n".join(exc.lines), code=2)
    if not wait and (timeout is not None or through_operator):
        _fail("--timeout and --through-operator go with --wait", code=2)
    if wait and dry_run:
        _fail("--wait starts the job; --dry-run starts nothing: give one of them", code=2)
    settings = _settings(ctx)
    workflow_id = workflow_id_for(spec.name)

    async def check(jobs: JobClient) -> StartCheckResult:
        """The checks on a worker (activities/start_checks.py): the CLI runs none."""
        if not dry_run:  # --fresh must not pull a running job's checkpoints from under it
            await jobs.ensure_not_running(spec.name)
        with console().status("checking on the worker ..."):
            return await jobs.check_start(
                spec,
                spec_file=str(spec_file),
                check_nodes=check_nodes,
                fresh=fresh,
                dry_run=dry_run,
            )

    if dry_run:
        checked = _with_client(ctx, check)
        _refuse_on(checked)
        resume = checked.resume
        plan = plan_start(spec, settings.task_queue, checked)
        if as_json:
            _print_json(
                {
                    **render.dry_run_json(plan),
                    "resume_from": cli_checkpoints.resume_json(resume),
                }
            )
        else:
            say("resolved spec", style="bold")
            say(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
            console().print(render.render_dry_run(plan))
            if fresh:
                say(f"--fresh would move the checkpoints in {spec.checkpoint_dir} aside")
            elif resume is not None:
                for line in cli_checkpoints.resume_lines(resume, spec.name):
                    say(line)
        return
    said: list[str] = []
    resumes: list[ResumePlan | None] = []

    async def action(jobs: JobClient) -> str:
        checked = await check(jobs)
        _refuse_on(checked)
        if fresh:
            said.extend(cli_checkpoints.set_aside_lines(checked.set_aside))
        if checked.resume is not None:
            said.extend(cli_checkpoints.resume_lines(checked.resume, spec.name))
        resumes.append(checked.resume)
        if not as_json:
            for line in said:
                say(line)
        handle = await jobs.start(spec)
        if spec.slurm is not None and spec.slurm.submits:
            await _follow_first_submit(jobs, handle, as_json)
        return handle.run_id

    run_id = _with_client(ctx, action)
    url = web_ui_url(settings, workflow_id)
    started: dict[str, object] = {
        "job": spec.name,
        "workflow_id": workflow_id,
        "run_id": run_id,
        "ui": url,
        "resume_from": cli_checkpoints.resume_json(resumes[0] if resumes else None),
        "checkpoint_dir": spec.checkpoint_dir,
        "notes": said,
    }
    if not as_json:
        console().print(
            Text.assemble(
                "started job ", plain(spec.name, style="bold"), f" as workflow {workflow_id}"
            )
        )
        if url:
            say(f"web UI: {url}")
        if not wait:
            say(f"follow it with: lazarus status {spec.name} --watch")
        for note in render.start_notes(spec):
            say(note, style="yellow")
    if wait:
        _wait_and_exit(ctx, spec.name, timeout, through_operator, as_json, started=started)
    if as_json:
        _print_json(started)


async def _follow_first_submit(jobs: JobClient, handle: JobHandle, as_json: bool) -> None:
    """Submit mode: the workflow's first step submits the allocation; show its wait in
    the queue until the job leaves PENDING (Ctrl-C stops watching, not the job). A
    job Slurm refused has failed: its reason, and exit code 1."""
    say(
        f"job {handle.job} is PENDING: its first step submits the Slurm allocation",
        stderr=as_json,
    )
    view = await jobs.wait_while_pending(handle, lambda line: say(line, stderr=as_json))
    if view.phase == Phase.FAILED.value:
        reason = view.status.operator_reason if view.status is not None else None
        raise Refusal(f"job {handle.job} failed: {reason or 'see lazarus status'}")


def _refuse_on(checked: StartCheckResult) -> None:
    """What the worker's checks found: bad input ends the start with exit code 2 (one
    line per problem, naming the spec file and field), a --fresh that cannot keep its
    promise with 1; warnings and an unreadable checkpoint directory are said."""
    for warning in checked.warnings:
        say(warning)
    if checked.problems:
        _fail("\n".join(checked.problems), code=2)
    if checked.refusal is not None:
        _fail(checked.refusal)
    if checked.resume_unreadable is not None:
        say(f"note: {checked.resume_unreadable}")


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
    if watch and (as_json or not sys.stdout.isatty()):
        _with_client(ctx, lambda jobs: cli_wait.watch_lines(jobs, job, as_json))
        return
    if watch:
        _with_client(ctx, lambda jobs: cli_wait.watch_live(jobs, job, console()))
        return
    view = _with_client(ctx, lambda jobs: jobs.status(job))
    if as_json:
        _print_json(render.status_json(view))
    else:
        console().print(render.render_status(view))


@app.command(help=cli_wait.WAIT_HELP)
def wait(
    ctx: typer.Context,
    job: Annotated[str, typer.Argument(help="Job name.")],
    timeout: TimeoutOption = None,
    through_operator: ThroughOperatorOption = False,
    as_json: JsonFlag = False,
) -> None:
    _wait_and_exit(ctx, job, timeout, through_operator, as_json)


def _wait_and_exit(
    ctx: typer.Context,
    job: str,
    timeout: float | None,
    through_operator: bool,
    as_json: bool,
    started: dict[str, object] | None = None,
) -> NoReturn:
    """``wait`` and ``start --wait``: follow the job (a line on stderr per phase or
    generation change, unless ``--json``), then say the outcome on stdout and exit
    with its code (:data:`~lazarus.app.outcome.EXIT_CODES`). With ``--json`` after a
    start, one document: the start's, with the wait's under ``wait``."""
    try:
        result = _with_client(ctx, cli_wait.waiting(job, timeout, through_operator, as_json))
    except KeyboardInterrupt:
        _fail(f"stopped waiting for job '{job}' (the job goes on)", code=130)
    if result is None:
        _fail(f"no job named '{job}'; see 'lazarus list'", code=Outcome.NO_SUCH_JOB.exit_code)
    cli_wait.say_outcome(result, as_json, started)
    raise typer.Exit(result.outcome.exit_code)


@app.command()
def logs(
    ctx: typer.Context,
    job: Annotated[str, typer.Argument(help="Job name.")],
    rank: Annotated[
        int | None, typer.Option("--rank", metavar="N", help="Only this rank (default: all).")
    ] = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing new lines until the generation ends."),
    ] = False,
    tail: Annotated[
        int | None,
        typer.Option("--tail", metavar="N", min=0, help="Only the last N lines of each log."),
    ] = None,
    generation: Annotated[
        int | None,
        typer.Option(
            "--generation", metavar="N", min=1, help="This generation (default: the current one)."
        ),
    ] = None,
    previous: Annotated[
        bool,
        typer.Option(
            "--previous",
            help="The newest generation that ended in a failure (crash, hang, lost node).",
        ),
    ] = False,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            metavar="WHEN",
            help="Only lines since a duration ago (5m, 1h30m) or a time (ISO 8601).",
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="One JSON object per line: generation, rank, node, line, time."
        ),
    ] = False,
) -> None:
    """Print the rank logs (rank-N.log) of one generation of the job, whole: local
    nodes' files are read here, ssh and slurm nodes' by a worker, through their agent.
    With several ranks each line starts with [rank N]."""
    from lazarus.app import cli_logs

    async def action(jobs: JobClient) -> tuple[JobStatus, JobSpec]:
        view = await jobs.status(job)
        if view.status is None:
            raise Refusal(f"job '{job}' did not say where its logs are: {view.note or 'no status'}")
        return view.status, await jobs.spec(job)

    status_, spec = _with_client(ctx, action)
    try:
        since_at = cli_logs.parse_since(since) if since is not None else None
        chosen = cli_logs.pick_generation(status_, generation, previous)
        if previous:
            say(cli_logs.previous_note(status_, chosen), stderr=True)
        found = cli_logs.rank_logs(status_, spec, rank, chosen)
        problems = cli_logs.show(
            found,
            spec,
            tail,
            follow,
            since=since_at,
            as_json=as_json,
            remote=cli_logs.WorkerLogs(_settings(ctx)),
        )
    except cli_logs.LogsProblem as exc:
        _fail(str(exc), code=2 if exc.bad_input else 1)
    except KeyboardInterrupt:
        return
    if problems:
        _fail("\n".join(problems))


@app.command("list")
def list_jobs(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Every job this namespace knows, newest run of each."""
    rows = _with_client(ctx, lambda jobs: jobs.list())
    if as_json:
        _print_json(render.job_list_json(rows))
    else:
        console().print(render.render_job_list(rows))


@app.command()
def pause(ctx: typer.Context, job: str, as_json: JsonFlag = False) -> None:
    """Stop the ranks and hold; 'resume' relaunches them from the last checkpoint."""
    _with_client(ctx, lambda jobs: jobs.pause(job))
    _said(job, "pause", f"asked job '{job}' to pause", as_json)


@app.command()
def resume(ctx: typer.Context, job: str, as_json: JsonFlag = False) -> None:
    """Relaunch a paused job, or one waiting for an operator."""
    _with_client(ctx, lambda jobs: jobs.resume(job))
    _said(job, "resume", f"asked job '{job}' to resume", as_json)


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
    as_json: JsonFlag = False,
) -> None:
    """Restart the job's ranks from the last checkpoint now, as if a rank had failed."""
    # An update, not a signal: the job validates it first, so a typo in --exclude-node
    # is refused with the reason instead of quarantining nothing and growing the world.
    reply = _with_client(
        ctx,
        lambda jobs: jobs.recover(
            job, reason=reason, exclude_node=exclude_node, checkpoint_first=checkpoint_first
        ),
    )
    _said(job, "recover", f"job '{job}': {reply}", as_json)


@app.command()
def drain(
    ctx: typer.Context,
    job: str,
    node: str,
    reason: Annotated[str, typer.Option(help="Recorded with the quarantine.")] = "",
    as_json: JsonFlag = False,
) -> None:
    """Move the job off NODE: quarantine it and relaunch its ranks on a spare."""
    reply = _with_client(ctx, lambda jobs: jobs.drain(job, node, reason=reason))
    _said(job, "drain", reply, as_json)


@app.command("return")
def return_node(ctx: typer.Context, job: str, node: str, as_json: JsonFlag = False) -> None:
    """Take NODE out of quarantine into the spares (after stopping anything stale on it)."""
    reply = _with_client(ctx, lambda jobs: jobs.return_node(job, node))
    _said(job, "return", reply, as_json)


@app.command()
def cancel(ctx: typer.Context, job: str, as_json: JsonFlag = False) -> None:
    """Stop the job's ranks and end it as CANCELLED (a no-op on a job that already ended)."""
    outcome = _with_client(ctx, lambda jobs: jobs.cancel(job))
    if outcome.already_closed_as is not None:
        message = f"job '{job}' is already closed ({outcome.already_closed_as}); nothing to cancel"
    else:
        message = f"cancelling job '{job}': its ranks are being stopped"
    _said(job, "cancel", message, as_json, accepted=outcome.requested)


@app.command()
def incidents(
    ctx: typer.Context,
    job: str,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Every failure of the job and what was done about it."""
    found: list[Incident] = _with_client(ctx, lambda jobs: jobs.incidents(job))
    if as_json:
        _print_json(render.incidents_json(found))
    elif not found:
        say(f"job '{job}' has had no incidents")
    else:
        console().print(render.render_incidents(found))


@app.command()
def report(
    ctx: typer.Context,
    job: str,
    out: Annotated[
        Path | None,
        typer.Option(help="The figure (PNG); default report.png, none with --json alone."),
    ] = None,
    html: Annotated[
        Path | None, typer.Option(help="A self-contained page: the figure and the tables.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the data behind the plot.")
    ] = False,
) -> None:
    """A job's run as a picture: step against wall time, incidents shaded by phase,
    checkpoints marked, and ETTR, MTTR and steps lost; works for finished jobs."""
    from lazarus.app import cli_report
    from lazarus.app.report import ReportDependencyMissing

    png = out if out is not None or as_json else cli_report.DEFAULT_PNG
    problems = cli_report.output_problems(png, html)
    if problems:
        _fail("\n".join(problems), code=2)
    data = _with_client(ctx, lambda jobs: cli_report.gather_report(jobs, job))
    try:
        written = cli_report.write_report(data, png, html)
    except (ReportDependencyMissing, ClientError) as exc:
        _fail(str(exc))
    if as_json:
        _print_json(cli_report.report_json(data, png, html))
        return
    console().print(cli_report.render_report(data))
    for line in written:
        say(line)


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
    say(f"Temporal dev server on {ip}:{port}, state in {state}")
    say(f"web UI: http://localhost:{ui_port}")
    say("stop it with Ctrl-C")
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
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Serve Prometheus metrics on this port at /metrics (env LAZARUS_METRICS_PORT)."
        ),
    ] = None,
    sdk_metrics_port: Annotated[
        int | None,
        typer.Option(
            help="The Temporal SDK's own metrics port (env LAZARUS_SDK_METRICS_PORT; default "
            "--metrics-port + 1; 0 turns them off)."
        ),
    ] = None,
    metrics_addr: Annotated[
        str | None,
        typer.Option(
            help="Bind address of both metrics endpoints (env LAZARUS_METRICS_ADDR; default "
            "127.0.0.1: they have no authentication). 0.0.0.0 publishes them on every "
            "interface, for a Prometheus on another host."
        ),
    ] = None,
) -> None:
    """Run the controller worker: the workflow and the activities that launch and watch ranks."""
    from lazarus.app.metrics import MetricsProblem, MetricsSettings

    # The worker room, heavy, and only this command needs it: it runs a worker here.
    from workers.controller import WorkerSettingsError, run_worker
    from workers.versioning import WorkerDeployment

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
        metrics = MetricsSettings.from_env(
            port=metrics_port, sdk_port=sdk_metrics_port, addr=metrics_addr
        )
        asyncio.run(run_worker(settings, queue, versioned, metrics))
    except (ConnectionProblem, WorkerSettingsError, MetricsProblem) as exc:
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

    if str(logfile) == "-":  # bytes, as a file is read: a log may hold invalid UTF-8
        text = sys.stdin.buffer.read().decode(errors="replace")
    else:
        try:
            text = logfile.read_text(encoding="utf-8", errors="replace")
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
    # Evidence lines are the log's own text ("[rank3]:", "[/INST]"): printed as they are.
    out = console()
    out.print(
        Text.assemble((str(payload["class"]), "bold"), f" (confidence {result.confidence:.2f})")
    )
    if result.suspect_rank is not None or result.suspect_node is not None:
        say(f"suspect: rank {_dash(result.suspect_rank)}, node {_dash(result.suspect_node)}")
    for line in result.evidence:
        out.print(Text.assemble(("  > ", "dim"), plain(line)), soft_wrap=True)


def _dash(value: object) -> str:
    return "—" if value is None else str(value)


@app.command()
def verify(
    ctx: typer.Context,
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
    """Check checkpoints against their manifest: marker, sizes, sha256. A worker reads
    them (as the job's restore would: its filesystem, its store credentials).

    Exits 0 when every checkpoint is good, 1 when one is corrupt (problems
    listed), 2 when it could not check (no such path, no checkpoint, store
    unreachable)."""
    from lazarus.app import cli_checkpoints

    found = _with_client(
        ctx,
        lambda jobs: jobs.verify_checkpoints(
            cli_checkpoints.absolute(target),
            endpoint_url=endpoint_url,
            sizes_only=sizes_only,
            world_size=world_size,
        ),
    )
    if found.input_error is not None or found.store_error is not None:
        _fail(found.input_error or found.store_error or "", code=2)
    results = found.results
    if as_json:
        _print_json(cli_checkpoints.verification_json(results))
    else:
        console().print(cli_checkpoints.render_verification(results))
    if not all(r.ok for r in results):
        raise typer.Exit(1)


@app.command()
def checkpoints(
    ctx: typer.Context,
    job: Annotated[
        str | None, typer.Argument(help="Job name (its directories come from its status).")
    ] = None,
    directory: Annotated[
        str | None,
        typer.Option("--dir", help="List this checkpoint directory (as the worker sees it)."),
    ] = None,
    uri: Annotated[str | None, typer.Option("--uri", help="List this durable store.")] = None,
    endpoint_url: Annotated[
        str | None, typer.Option(help="S3-compatible endpoint (or env AWS_ENDPOINT_URL).")
    ] = None,
    hashes: Annotated[
        bool, typer.Option("--hashes", help="Verify sha256 (reads every byte); default sizes.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """A job's checkpoints: step, time, size, verified locally, durable. A worker reads
    them (its filesystem, its store credentials)."""
    from lazarus.app import cli_checkpoints

    if job is None and directory is None and uri is None:
        _fail("give a JOB, or --dir PATH and/or --uri URI to list a directory or store", code=2)
    if job is not None:

        async def action(jobs: JobClient) -> tuple[str, str | None]:
            try:
                status_ = await jobs.query(job)
            except StatusUnavailable as exc:
                raise Refusal(f"{exc.reason}; or use --dir/--uri") from None
            if not status_.checkpoint_dir:
                raise Refusal(f"job '{job}' reports no checkpoint directory; use --dir")
            return status_.checkpoint_dir, getattr(status_, "durable_checkpoint_uri", None)

        found_dir, found_uri = _with_client(ctx, action)
        directory = directory or found_dir
        uri = uri or found_uri
    listed = _with_client(
        ctx,
        lambda jobs: jobs.list_checkpoints(
            cli_checkpoints.absolute(directory),
            cli_checkpoints.absolute(uri),
            endpoint_url=endpoint_url,
            hashes=hashes,
        ),
    )
    if listed.input_error is not None or listed.store_error is not None:
        _fail(listed.input_error or listed.store_error or "", code=2)
    rows = listed.rows
    if as_json:
        _print_json(cli_checkpoints.checkpoints_json(rows))
    elif not rows:
        say(f"no checkpoints in {directory or ''} {uri or ''}".strip())
    else:
        console().print(cli_checkpoints.checkpoints_table(rows))


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


from lazarus.app.cli_fleet import fleet_app  # noqa: E402 (the sub-app after the app it joins)

app.add_typer(fleet_app, name="fleet")

from lazarus.app import cli_help, cli_tools  # noqa: E402 (after every verb is registered)
from workers.simulate import verb as simulate_verb  # noqa: E402

cli_tools.register(app)  # spec schema, completion
simulate_verb.register(app)  # lazarus simulate
cli_help.plain_help(app)  # --help without {ARG} or <type> tags, on every verb
