"""Which of the worker's files a spec may name for SSH: ``ssh.known_hosts`` and a
node's ``identity_file`` (issue 37, N13).

The spec comes from the workflow input, which anyone who can reach the Temporal
frontend can write, and the worker reads the identity file and, with
``ssh.accept_new_host_keys``, appends ``host keytype key`` lines to ``known_hosts``,
wherever they point: a shell rc file, ``authorized_keys``, another user's key the
worker may read. So both must resolve (``~`` expanded, symlinks followed) under a
directory the worker's operator allows: ``LAZARUS_SSH_DIRS``, read from the worker's
own environment like its command allow-list, never from the input; by default the
worker user's ``~/.ssh``, where OpenSSH keeps both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

SSH_DIRS_ENV = "LAZARUS_SSH_DIRS"
"""Directories the SSH files a spec names may be in, separated by ``os.pathsep``
(``:``), ``~`` expanded; unset or empty: :data:`DEFAULT_SSH_DIRS`."""
DEFAULT_SSH_DIRS = ("~/.ssh",)


class SSHDirsError(ValueError):
    """``LAZARUS_SSH_DIRS`` is unusable; the message names the entry."""


def allowed_ssh_dirs(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The directories of ``LAZARUS_SSH_DIRS`` (the worker's environment by default),
    or :data:`DEFAULT_SSH_DIRS`. Raises :class:`SSHDirsError` for an entry that is not
    absolute once ``~`` is expanded: it would depend on the worker's directory."""
    listed = (os.environ if env is None else env).get(SSH_DIRS_ENV, "")
    dirs = tuple(d.strip() for d in listed.split(os.pathsep) if d.strip())
    for entry in dirs:
        if not Path(entry).expanduser().is_absolute():
            raise SSHDirsError(
                f"{SSH_DIRS_ENV}: {entry!r} is not an absolute path; write it in full, or as ~/..."
            )
    return dirs or DEFAULT_SSH_DIRS


def ssh_file_problem(field: str, path: str, dirs: Sequence[str]) -> str | None:
    """Why the worker may not use ``path``, named by the spec's ``field``, as an SSH
    file: a relative path, or one that resolves outside every directory of ``dirs``
    (symlinks followed, so a link in ``~/.ssh`` to ``~/.bashrc`` is outside); None when
    it may. A file that does not exist yet (``known_hosts`` before its first host) is
    judged by where it would be created."""
    expanded = Path(path).expanduser()
    if not expanded.is_absolute():
        return f"{field} {path} is not an absolute path; write it in full, or as ~/..."
    resolved = expanded.resolve()
    if any(resolved.is_relative_to(Path(d).expanduser().resolve()) for d in dirs):
        return None
    shown = path if str(resolved) == path else f"{path} (resolved: {resolved})"
    return (
        f"{field} {shown} is outside the directories this worker allows for SSH files "
        f"({', '.join(dirs)}); put the file there, or have the worker's operator add its "
        f"directory to {SSH_DIRS_ENV}"
    )
