"""``--help`` that reads like a man page: ``lazarus start [OPTIONS] JOB.yaml``,
``--name NAME``, never ``{JOB.yaml}`` (Typer's mark of a required argument, which reads
as a set of choices) or a ``<str>``/``<bool>`` type tag after a name.

:func:`plain_help` gives every command of an app (its sub-apps too) the command and
group classes below, once, after the commands are registered. They only change how
parameters are *shown*: an argument is its metavar (or its name, upper-case), bare when
required and ``[NAME]`` when optional; an option that takes a value shows a word for it
(``--state-dir DIR``, ``--port PORT``, the choices ``a|b`` of an enum), a flag nothing.
Parsing, defaults and errors are Typer's own. ``tests/unit/test_cli_help.py`` renders
every command's help and fails on either pattern.
"""

from __future__ import annotations

import enum
from typing import Any

import typer
from typer import _click
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.models import DefaultPlaceholder

ARGUMENT_HELP = {
    "job": "The job's name.",
    "node": "The node's name, as the spec (or the fleet) names it.",
}
"""What an argument of these names is, where its verb does not say."""


def _option_word(option: TyperOption) -> str:
    """The metavar of an option that takes a value: its choices, else ``DIR`` or
    ``PATH`` for a path, else the last word of its longest flag (``--ui-port`` →
    ``PORT``)."""
    described = option.type_descriptor
    if described.is_choice:
        choices = described.choices or ()
        return "|".join(c.value if isinstance(c, enum.Enum) else str(c) for c in choices)
    longest = max(option.opts, key=len).lstrip("-")
    word = longest.rsplit("-", 1)[-1].upper()
    if described.is_path and word != "DIR":
        return "PATH"
    return word


def _argument_word(argument: TyperArgument) -> str:
    word = argument.metavar or (argument.name or "arg").upper()
    return word + ("..." if argument.nargs != 1 else "")


def _readable(params: list[_click.Parameter]) -> None:
    for param in params:
        if isinstance(param, TyperOption):
            if param.metavar is None and not param.is_flag and not param.count:
                param.metavar = _option_word(param)
        elif isinstance(param, TyperArgument):
            param.metavar = _argument_word(param)
            if not param.help:
                param.help = ARGUMENT_HELP.get(param.name or "")


def _usage(command: _click.Command, ctx: _click.Context) -> list[str]:
    pieces = [command.options_metavar] if command.options_metavar else []
    for param in command.get_params(ctx):
        if isinstance(param, TyperArgument):
            word = param.metavar or _argument_word(param)
            pieces.append(word if param.required else f"[{word}]")
        else:
            pieces.extend(param.get_usage_pieces(ctx))
    return pieces


def _format_parameters(
    command: _click.Command, ctx: _click.Context, formatter: _click.HelpFormatter
) -> None:
    arguments: list[tuple[str, str]] = []
    options: list[tuple[str, str]] = []
    for param in command.get_params(ctx):
        if isinstance(param, TyperArgument):
            if param.hidden:
                continue
            text = param.help or ""
            if param.required:
                text = f"{text}  [required]" if text else "[required]"
            arguments.append((param.metavar or _argument_word(param), text))
        else:
            record = param.get_help_record(ctx)
            if record is not None:
                options.append(record)
    if arguments:
        with formatter.section("Arguments"):
            formatter.write_dl(arguments)
    if options:
        with formatter.section("Options"):
            formatter.write_dl(options)


class PlainHelpCommand(TyperCommand):
    """A command whose help names its parameters in words (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _readable(self.params)

    def collect_usage_pieces(self, ctx: _click.Context) -> list[str]:
        return _usage(self, ctx)

    def format_options(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        _format_parameters(self, ctx, formatter)


class PlainHelpGroup(TyperGroup):
    """A group (``lazarus``, ``lazarus fleet``) whose own options read the same way."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _readable(self.params)

    def format_options(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        _format_parameters(self, ctx, formatter)
        self.format_commands(ctx, formatter)


def plain_help(app: typer.Typer) -> None:
    """Give ``app``, its commands and its sub-apps (recursively) the classes above,
    where no other class was asked for. Call it once every command is registered."""
    if app.info.cls in (None, TyperGroup) or isinstance(app.info.cls, DefaultPlaceholder):
        app.info.cls = PlainHelpGroup
    for command in app.registered_commands:
        if command.cls in (None, TyperCommand):  # Typer's default, filled in by app.command
            command.cls = PlainHelpCommand
    for group in app.registered_groups:
        if group.typer_instance is not None:
            plain_help(group.typer_instance)
