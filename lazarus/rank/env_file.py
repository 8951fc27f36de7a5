"""``env_from_file`` read on the node where a rank runs: ``KEY=VALUE`` lines in a
file only its owner may read. Standard library only: the Slurm task
(:mod:`lazarus.rank.slurm_task`) reads it under the node's own interpreter; the
controller's local nodes read it with the same code
(:mod:`activities.nodes.secret_env`)."""

from __future__ import annotations

import os
import re
import stat

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A variable name (the spec's ``ENV_NAME_PATTERN``; a test keeps them equal)."""


class EnvFileError(Exception):
    """The file cannot be used; the message names it, never a line's content."""


def parse_env_lines(text: str, path: str) -> dict[str, str]:
    """``KEY=VALUE`` lines: the value is literal to the end of the line (no quotes, no
    expansion); blank lines and lines starting with ``#`` are skipped."""
    values: dict[str, str] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not ENV_NAME.fullmatch(key):
            raise EnvFileError(
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
        raise EnvFileError(f"env_from_file: {path} does not exist on this node") from None
    except OSError as exc:
        raise EnvFileError(f"env_from_file: cannot stat {path}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise EnvFileError(f"env_from_file: {path} is not a regular file")
    if info.st_mode & 0o077:
        raise EnvFileError(
            f"env_from_file: {path} is readable or writable by group or others (mode "
            f"{stat.S_IMODE(info.st_mode):04o}); it holds secrets: chmod 600 {path}"
        )
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise EnvFileError(f"env_from_file: cannot read {path}: {reason}") from None
    return parse_env_lines(text, path)
