"""The worker's allow-list for programs that come from a workflow input.

A job's ``command``, ``on_escalation`` and ``preflight.health_command`` arrive in the
workflow input, and whoever can reach the Temporal frontend can write that input.
The worker is the trust boundary, so the check runs here, in the activities, against
settings only the worker's operator controls (:class:`lazarus.app.settings.WorkerSettings`),
never against anything a client sends.

A program is resolved to an absolute path the way it will be started (through the
PATH it will see for a bare name, against the working directory for a relative one)
and must match an entry of ``allowed_commands``. The list limits which program
starts, not what it then does: allowing ``/usr/bin/python3`` allows any Python code.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from collections.abc import Sequence

from temporalio.exceptions import ApplicationError

from activities.worker_settings import (
    ALLOWED_COMMANDS_ENV,
    ALLOWED_COMMANDS_FILE_ENV,
    WorkerSettings,
    WorkerSettingsError,
)

ERROR_TYPE = "CommandNotAllowed"
"""The ``ApplicationError`` type the activities raise (non-retryable)."""


class CommandNotAllowed(Exception):
    """A program the worker's allow-list does not name (or an unusable allow-list)."""

    def application_error(self) -> ApplicationError:
        """The non-retryable error an activity raises: retrying cannot change the answer."""
        return ApplicationError(str(self), type=ERROR_TYPE, non_retryable=True)


def resolve(program: str, *, workdir: str, search_path: str | None, remote: bool) -> str:
    """The absolute path ``program`` will be started from, as far as the worker can tell.

    Raises :class:`CommandNotAllowed` when it cannot tell: a bare name on an ssh node
    is looked up on that node's PATH, which the worker cannot see.
    """
    if "/" in program:
        return os.path.normpath(os.path.join(workdir, program))
    if remote:
        raise CommandNotAllowed(
            f"program {program!r} is a bare name on an ssh node; with allowed_commands set, "
            "give its absolute path (the worker cannot see which file the node's PATH finds)"
        )
    found = shutil.which(program, path=search_path)
    if found is None:
        raise CommandNotAllowed(
            f"program {program!r} is not on PATH ({search_path or 'the worker PATH'}), so "
            "it cannot be checked against allowed_commands; give its absolute path"
        )
    return os.path.abspath(found)


def enforce(
    what: str,
    command: Sequence[str],
    *,
    workdir: str,
    search_path: str | None,
    remote: bool = False,
    settings: WorkerSettings | None = None,
) -> None:
    """Raise :class:`CommandNotAllowed` unless ``command``'s program is allowed.

    ``what`` names the spec field (``command``, ``on_escalation``,
    ``preflight.health_command``) so the message says which one to change. Without
    an allow-list in the worker's settings, everything is allowed.
    """
    if settings is None:
        try:
            settings = WorkerSettings.from_env()
        except WorkerSettingsError as exc:
            raise CommandNotAllowed(
                f"{what}: refused because the worker's allow-list is unusable: {exc}"
            ) from None
    allowed = settings.allowed_commands
    if allowed is None:
        return
    if not command or not command[0]:
        raise CommandNotAllowed(f"{what}: no program to check against allowed_commands")
    program = command[0]
    try:
        path = resolve(program, workdir=workdir, search_path=search_path, remote=remote)
    except CommandNotAllowed as exc:
        raise CommandNotAllowed(f"{what}: {exc}") from None
    candidates = {path}
    if not remote and os.path.exists(path):
        candidates.add(os.path.realpath(path))
    if any(fnmatch.fnmatchcase(c, pattern) for c in candidates for pattern in allowed):
        return
    shown = program if program == path else f"{program!r} ({path})"
    raise CommandNotAllowed(
        f"{what}: program {shown} is not in allowed_commands, the worker's allow-list "
        f"(from {settings.allowed_commands_source or 'the worker settings'}); the operator "
        f"of the worker may add it to {ALLOWED_COMMANDS_ENV} or {ALLOWED_COMMANDS_FILE_ENV}"
    )
