"""``lazarus fleet ...``: start a fleet, see its nodes, drain and return them, free the
lease of a job that ended without releasing it.

Rich tables for people, ``--json`` for machines; every failure a person can fix (a fleet
that is not running, a refused drain) is one line on stderr and exit 1; a bad config
file, like a bad job spec, exits 2 with one line per problem.
The fleet's name comes from ``--fleet`` or ``LAZARUS_FLEET``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, NoReturn, TypeVar

import typer
from rich.table import Table

from lazarus.app.cli_output import console, plain, say
from lazarus.app.client import ClientError
from lazarus.app.fleet_client import FleetClient, load_fleet_config
from lazarus.app.settings import ConnectionProblem, ConnectionSettings, connect
from lazarus.domain.fleet import FleetStatus

T = TypeVar("T")

fleet_app = typer.Typer(
    name="fleet",
    help="One durable memory per cluster: nodes, spares and lemons shared across jobs.",
    no_args_is_help=True,
    rich_markup_mode=None,  # help texts are plain text, as the main app's
)

FleetName = Annotated[
    str,
    typer.Option("--fleet", "-f", envvar="LAZARUS_FLEET", help="The fleet's name."),
]
AsJson = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def _fail(message: str, code: int = 1) -> NoReturn:
    say(message, stderr=True)
    raise typer.Exit(code)


def _with_fleets(ctx: typer.Context, action: Callable[[FleetClient], Awaitable[T]]) -> T:
    settings = ctx.find_root().obj
    if not isinstance(settings, ConnectionSettings):
        settings = ConnectionSettings.from_env()

    async def main() -> T:
        client = await connect(settings)
        fleets = FleetClient(client, task_queue=settings.task_queue, address=settings.address)
        return await action(fleets)

    try:
        return asyncio.run(main())
    except (ConnectionProblem, ClientError) as exc:
        _fail(str(exc))


@fleet_app.command("start")
def start(
    ctx: typer.Context,
    config_file: Annotated[Path, typer.Argument(help="The fleet's YAML config.")],
    as_json: AsJson = False,
    forget_state: Annotated[
        bool,
        typer.Option(
            "--forget-state",
            help="Start afresh although a fleet of this name ran before and was ended: "
            "its leases, quarantines and lemons are forgotten.",
        ),
    ] = False,
) -> None:
    """Start the fleet's workflow ('lazarus-fleet-NAME'); a worker must be running.
    Refused while it runs, and after an earlier run was ended unless --forget-state."""
    try:
        config = load_fleet_config(config_file)
    except ClientError as exc:  # a bad config is bad input, as a bad job spec is
        _fail(str(exc), code=2)
    workflow_id = _with_fleets(ctx, lambda fleets: fleets.start(config, forget_state=forget_state))
    if as_json:
        typer.echo(json.dumps({"fleet": config.name, "workflow_id": workflow_id}))
        return
    say(
        f"fleet {config.name} started ({workflow_id}): {len(config.nodes)} node(s), "
        f"{len(config.spares)} shared spare(s)"
    )


@fleet_app.command("status")
def status(ctx: typer.Context, fleet: FleetName, as_json: AsJson = False) -> None:
    """Counts by state, lemons, and the fleet's latest decisions."""
    view = _with_fleets(ctx, lambda fleets: fleets.status(fleet))
    if as_json:
        typer.echo(view.model_dump_json(indent=2))
        return
    counts = ", ".join(f"{state} {count}" for state, count in view.counts.items())
    say(f"fleet {view.name} (run {view.runs}): {counts}")
    say(
        f"shared spare target {view.spare_target}; lemons: {', '.join(view.lemons) or 'none'}; "
        + (
            f"probation: {view.probation_passes} passes"
            if view.probation_passes
            else "probation off (no health command): 'lazarus fleet return' brings nodes back"
        )
    )
    table = Table("at", "node", "job", "decision", title="latest decisions")
    for event in view.log[-15:]:
        table.add_row(
            _when(event.at), plain(event.node or ""), plain(event.job or ""), plain(event.what)
        )
    console().print(table)


@fleet_app.command("nodes")
def nodes(ctx: typer.Context, fleet: FleetName, as_json: AsJson = False) -> None:
    """Every node: state, job, why, incidents counted by the lemon rule, reputation."""
    view = _with_fleets(ctx, lambda fleets: fleets.status(fleet))
    if as_json:
        typer.echo(json.dumps([n.model_dump(mode="json") for n in view.nodes], indent=2))
        return
    console().print(_nodes_table(view))


def _nodes_table(view: FleetStatus) -> Table:
    table = Table(
        "node",
        "state",
        "job",
        "since",
        "reason",
        "incidents",
        "fail/node-h",
        "lemon",
        title=plain(f"fleet {view.name}"),
    )
    for node in view.nodes:
        state = node.state.value
        if node.state == "probation":
            state += f" {node.passes}/{view.probation_passes}"
        if node.drain_pending:
            state += " (drain pending)"
        rate = node.failures_per_node_hour
        table.add_row(
            plain(node.name),
            plain(state),
            plain(f"{node.job} ({node.role})" if node.role else node.job or ""),
            _when(node.since),
            plain(node.reason + (f" [{node.failure_class}]" if node.failure_class else "")),
            str(node.incidents),
            f"{rate:.2g}" if rate is not None else "-",
            "yes" if node.lemon else "",
        )
    return table


@fleet_app.command("drain")
def drain(
    ctx: typer.Context,
    node: str,
    fleet: FleetName,
    reason: Annotated[str, typer.Option("--reason", help="Why (shown in status).")],
) -> None:
    """Take a node out of service (a leased one when its job releases it)."""
    reply = _with_fleets(ctx, lambda fleets: fleets.drain(fleet, node, reason))
    say(reply)


@fleet_app.command("return")
def return_node(
    ctx: typer.Context,
    node: str,
    fleet: FleetName,
    fenced: Annotated[
        bool,
        typer.Option(
            "--fenced",
            help="You checked (or rebooted) the node: no stale rank runs there. Needed "
            "for a node its job could not reach when it ended.",
        ),
    ] = False,
) -> None:
    """Put a quarantined (fenced) node back in service, or cancel a pending drain."""
    reply = _with_fleets(ctx, lambda fleets: fleets.return_node(fleet, node, fenced=fenced))
    say(reply)


@fleet_app.command("release")
def release(
    ctx: typer.Context,
    job: Annotated[str, typer.Argument(help="The job whose lease to free.")],
    fleet: FleetName,
    fenced: Annotated[
        bool,
        typer.Option(
            "--fenced",
            help="You checked (or rebooted) the job's nodes, or its stops reached them: no "
            "rank of it runs there. Its nodes go back to service at once; without this "
            "they are quarantined until each is checked and returned "
            "('lazarus fleet return NODE --fenced').",
        ),
    ] = False,
) -> None:
    """Free the nodes of a job that ended without giving them back (terminated, or its
    release never reached the fleet). Refused while the job's workflow is open."""
    reply = _with_fleets(ctx, lambda fleets: fleets.release(fleet, job, fenced=fenced))
    say(reply)


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")
