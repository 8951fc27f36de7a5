"""The worker's own policy: what the activities may run.

These settings live on the activities' floor because only mechanics read them
(:mod:`activities.command_policy`); the worker process loads them from its
environment at start, and a workflow input can never widen them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

ALLOWED_COMMANDS_ENV = "LAZARUS_ALLOWED_COMMANDS"
"""Allowed programs, separated by ``os.pathsep`` (``:``)."""
ALLOWED_COMMANDS_FILE_ENV = "LAZARUS_ALLOWED_COMMANDS_FILE"
"""A file of allowed programs, one per line (``#`` comments and blank lines ignored)."""


class WorkerSettingsError(Exception):
    """The worker's own settings are unusable; the message names the variable or file.
    ``lazarus worker`` reports it as one line at start, as it does a server it cannot
    reach."""


class WorkerSettings(BaseModel):
    """Settings only the worker reads: they bound what a workflow input can make it do.

    They come from the worker's environment (and a file it names), never from a
    workflow input: whoever can start a workflow must not be able to widen them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    allowed_commands: tuple[str, ...] | None = None
    """Absolute program paths or glob patterns (``fnmatch``: ``*`` also matches ``/``)
    that a job's ``command``, ``on_escalation`` and ``preflight.health_command`` may
    start. None (the default) allows any program; an empty allow-list allows none."""
    allowed_commands_source: str = ""
    """Where the list came from, for error messages that tell the operator what to edit."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerSettings:
        """Read ``LAZARUS_ALLOWED_COMMANDS`` and ``LAZARUS_ALLOWED_COMMANDS_FILE`` (both
        may be set: the lists are joined). Raises :class:`WorkerSettingsError`."""
        source = os.environ if env is None else env
        patterns: list[tuple[str, str]] = []
        sources: list[str] = []
        listed = source.get(ALLOWED_COMMANDS_ENV, "")
        if listed.strip():
            sources.append(ALLOWED_COMMANDS_ENV)
            patterns += [(p.strip(), ALLOWED_COMMANDS_ENV) for p in listed.split(os.pathsep)]
        file_name = source.get(ALLOWED_COMMANDS_FILE_ENV, "").strip()
        if file_name:
            path = Path(file_name).expanduser()
            where = f"{path} (named by {ALLOWED_COMMANDS_FILE_ENV})"
            sources.append(where)
            try:
                lines = path.read_text().splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                reason = getattr(exc, "strerror", None) or exc
                raise WorkerSettingsError(
                    f"allowed_commands: cannot read {where}: {reason}"
                ) from None
            for number, line in enumerate(lines, start=1):
                text = line.strip()
                if text and not text.startswith("#"):
                    patterns.append((text, f"{path} line {number}"))
        if not sources:
            return cls()
        for pattern, where in patterns:
            if not pattern:
                raise WorkerSettingsError(
                    f"allowed_commands: {where} has an empty entry; remove the stray separator"
                )
            if not pattern.startswith("/"):
                raise WorkerSettingsError(
                    f"allowed_commands: {pattern!r} in {where} is not an absolute path; write "
                    "the program's full path (e.g. /usr/bin/python3) or an absolute glob "
                    "(e.g. /opt/train/bin/*)"
                )
        return cls(
            allowed_commands=tuple(p for p, _ in patterns),
            allowed_commands_source=" and ".join(sources),
        )
