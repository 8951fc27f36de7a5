"""``lazarus simulate``: the verb on the ``lazarus`` app. The options are the
simulator's own (:func:`workers.simulate.cli.add_options`), passed through as
written, so the verb and its alias ``python -m bench simulate`` take the same ones;
the simulator is imported when the verb runs, not when the CLI starts."""

from __future__ import annotations

import typer

HELP = (
    "What ETTR would a cluster get with these settings? Runs the real JobWorkflow on "
    "Temporal's time-skipping test server against simulated nodes that meet a seeded "
    "failure trace (Llama 3's rates by default), and reports ETTR, MTTR, interruptions "
    "and steps lost per configuration. Options: lazarus simulate --help "
    "(--quick, --nodes, --days, --rows, --profile, --checkpoint-s, ...); "
    "see docs/guides/simulator.md."
)


def register(app: typer.Typer) -> None:
    @app.command(
        "simulate",
        help=HELP,
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def simulate(ctx: typer.Context) -> None:
        from workers.simulate.cli import main

        raise typer.Exit(main(list(ctx.args)))
