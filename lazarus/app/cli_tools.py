"""``lazarus spec schema`` and ``lazarus completion SHELL``: the verbs for a person's
tools (an editor, a shell), which contact nothing.

- ``spec schema`` prints the job spec's JSON Schema
  (:func:`lazarus.domain.spec_schema.job_spec_schema`); an editor's YAML extension
  then checks a spec as it is typed (``docs/reference/job-spec.md``).
- ``completion bash|zsh|fish`` prints the shell's completion script. It is Typer's (so
  Click's) own: the script calls ``lazarus`` back with ``_LAZARUS_COMPLETE`` set, and
  the app answers with the verbs, options and files that fit, from the same parser that
  runs the command, so it cannot fall behind a new verb.
"""

from __future__ import annotations

import enum
import json
from typing import Annotated

import typer
from typer._completion_classes import completion_init
from typer._completion_shared import get_completion_script

PROG_NAME = "lazarus"
COMPLETE_VAR = "_LAZARUS_COMPLETE"

spec_app = typer.Typer(
    name="spec",
    help="The job spec itself: its JSON Schema, for editors.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@spec_app.command("schema")
def schema(
    compact: Annotated[
        bool, typer.Option("--compact", help="One line instead of indented JSON.")
    ] = False,
) -> None:
    """Print the job spec's JSON Schema (draft 2020-12) for editors.

    Save it next to your specs (lazarus spec schema > job-spec.schema.json) and put
    '# yaml-language-server: $schema=job-spec.schema.json' on a spec's first line: VS
    Code's YAML extension then flags unknown fields, wrong types and out-of-range
    values as you type, and shows each field's description. The same file is
    docs/reference/job-spec.schema.json in the repository."""
    from lazarus.domain.spec_schema import job_spec_schema, render

    if compact:
        typer.echo(json.dumps(job_spec_schema(), separators=(",", ":"), ensure_ascii=False))
    else:
        typer.echo(render(), nl=False)


class Shell(enum.StrEnum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


def completion(
    shell: Annotated[
        Shell, typer.Argument(metavar="SHELL", help="bash, zsh or fish.", show_default=False)
    ],
) -> None:
    """Print the shell completion script for bash, zsh or fish.

    bash: eval "$(lazarus completion bash)" in ~/.bashrc. zsh: the same with zsh in
    ~/.zshrc, after compinit. fish: lazarus completion fish >
    ~/.config/fish/completions/lazarus.fish. Verbs, options and file names complete;
    job names do not (that would contact Temporal on every Tab)."""
    typer.echo(get_completion_script(prog_name=PROG_NAME, complete_var=COMPLETE_VAR, shell=shell))


def register(app: typer.Typer) -> None:
    """Add ``spec`` and ``completion`` to the main app."""
    app.add_typer(spec_app, name="spec")
    app.command("completion")(completion)
    # Typer's own completion classes answer _LAZARUS_COMPLETE (its zsh and fish scripts
    # need them); only its --install-completion options, off in this app, register them.
    completion_init()
