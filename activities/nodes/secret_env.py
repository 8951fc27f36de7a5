"""Secrets for ranks that never enter workflow history: ``pass_env`` and ``env_from_file``.

The spec is the workflow's input, so it is stored in Temporal history and shown in
the Web UI; it names secrets but never holds them. ``pass_env`` names variables whose
values come from the worker's own environment when a generation is launched.
``env_from_file`` names a ``KEY=VALUE`` file read where the ranks run: here for local
nodes, by the shim on ssh nodes (``shim.sh`` parses the same format). A file that
anyone but its owner can read is refused, as ssh refuses such a private key: a secret
in a world-readable file is not a secret.

The other way round, the worker's own credentials are not for what it starts:
:func:`without_worker_secrets` removes them from the environment of ranks, of the
preflight health command, and of the Slurm commands (``srun`` exports its
environment to the node).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence

from lazarus.domain.environment import TEMPORAL_API_KEY
from lazarus.domain.spec import ENV_NAME_PATTERN

WORKER_SECRETS = frozenset({TEMPORAL_API_KEY})
"""The worker's own credentials (its Temporal API key): a job's programs never get
them. With the key, a rank or a health command could start, signal or terminate any
workflow of the namespace."""


class SecretEnvError(Exception):
    """A secret the launch cannot supply; the message names the variable or file."""


def without_worker_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without :data:`WORKER_SECRETS`, for a program the worker starts."""
    return {k: v for k, v in env.items() if k not in WORKER_SECRETS}


def passed_env(names: Sequence[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values of ``pass_env`` from this worker's environment, or raise naming the
    missing ones (a rank started without its API key fails far less clearly)."""
    source = os.environ if environ is None else environ
    missing = [name for name in names if name not in source]
    if missing:
        raise SecretEnvError(
            f"pass_env: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set "
            "in the worker's environment; set it where 'lazarus worker' runs and restart the "
            "worker (the value is read there at each launch, never stored in the job)"
        )
    return {name: source[name] for name in names}


def parse_env_lines(text: str, path: str) -> dict[str, str]:
    """``KEY=VALUE`` lines: the value is literal to the end of the line (no quotes, no
    expansion); blank lines and lines starting with ``#`` are skipped."""
    values: dict[str, str] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not ENV_NAME_PATTERN.fullmatch(key):
            raise SecretEnvError(
                f"env_from_file: {path} line {number}: expected KEY=VALUE with KEY a "
                "variable name (letters, digits, '_'); the line is not shown, it may hold a "
                "secret"
            )
        values[key] = value
    return values


def read_env_file(path: str) -> dict[str, str]:
    """Read ``env_from_file`` on this machine, refusing a file others could read."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise SecretEnvError(f"env_from_file: {path} does not exist on this node") from None
    except OSError as exc:
        raise SecretEnvError(f"env_from_file: cannot stat {path}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise SecretEnvError(f"env_from_file: {path} is not a regular file")
    if info.st_mode & 0o077:
        raise SecretEnvError(
            f"env_from_file: {path} is readable or writable by group or others (mode "
            f"{stat.S_IMODE(info.st_mode):04o}); it holds secrets: chmod 600 {path}"
        )
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise SecretEnvError(f"env_from_file: cannot read {path}: {reason}") from None
    return parse_env_lines(text, path)
