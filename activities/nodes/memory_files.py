"""Reading and writing one memory-tier snapshot directory on this machine.

What a node agent needs to copy a replica onto a spare (the local agent calls these;
the shim's ``memory-read``/``memory-put``/``memory-commit`` do the same on an ssh
node). Paths are logical (:data:`lazarus.domain.memory_tier.MEMORY_ROOT`), mapped to
this user's private root and checked by :func:`lazarus.rank.memory.secure`; one
level of plain files, none followed through a symlink, written 0600 and committed
marker last, so a copy cut short reads as torn, never as committed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from lazarus.domain.checkpoint_layout import (
    COMMIT_MARKER,
    MANIFEST,
    TEMP_SUFFIX,
    is_committed,
    parse_step_dir,
)
from lazarus.domain.memory_tier import on_node
from lazarus.rank.memory import secure


def plain_name_problem(name: str) -> str | None:
    """Why ``name`` is not a file name a snapshot copy may carry, or None."""
    if name in ("", ".", "..", COMMIT_MARKER) or "/" in name or "\x00" in name:
        return f"file name {name!r} is not one plain path component"
    if name.startswith(".") or name.endswith(TEMP_SUFFIX):
        return f"file name {name!r} is a hidden or temporary file"
    return None


def read_snapshot(path: str) -> dict[str, bytes]:
    directory = secure(Path(on_node(path, os.getuid())), create=False)
    if directory.is_symlink() or not is_committed(directory):
        raise FileNotFoundError(f"{path} is not a committed memory snapshot")
    files: dict[str, bytes] = {}
    for child in sorted(directory.iterdir()):
        if plain_name_problem(child.name) is not None or child.is_symlink():
            continue
        if not child.is_file():
            continue
        fd = os.open(child, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            files[child.name] = handle.read()
    return files


def write_snapshot(path: str, files: dict[str, bytes]) -> None:
    for name in files:
        problem = plain_name_problem(name)
        if problem is not None:
            raise ValueError(f"memory snapshot {path}: {problem}")
    if MANIFEST not in files:
        raise ValueError(f"memory snapshot {path}: no {MANIFEST}")
    directory = secure(Path(on_node(path, os.getuid())), create=True)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # outside the tier: not by secure
    if directory.is_symlink() or not directory.is_dir():
        raise NotADirectoryError(f"memory snapshot {path} is not a directory")
    (directory / COMMIT_MARKER).unlink(missing_ok=True)
    for name in sorted(files, key=lambda n: n == MANIFEST):  # the manifest last
        _write_private(directory / name, files[name])
    marker = {"step": parse_step_dir(directory.name), "committed_at": time.time()}
    _write_private(directory / COMMIT_MARKER, json.dumps(marker).encode())


def _write_private(target: Path, data: bytes) -> None:
    temp = target.with_name(f".{target.name}{TEMP_SUFFIX}")
    temp.unlink(missing_ok=True)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(temp, target)
