"""Writing a file so that a reader (or a crash) sees the old file or the new one,
never half of one: a temporary name in the same directory, renamed into place."""

from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path

from lazarus.domain import checkpoint_layout

TEMP_SUFFIX = checkpoint_layout.TEMP_SUFFIX
"""Files ending in this are unfinished writes; the manifest never lists them."""


def _atomic_write(target: Path, data: bytes, *, durable: bool) -> None:
    """Write ``data`` to ``target`` so readers see the old file or the new one,
    never a mix. ``durable`` also fsyncs the file and its directory, so after a
    machine crash the new file is there and whole."""
    directory = target.parent
    directory.mkdir(parents=True, exist_ok=True)
    temp_name = temp_path_for(target)
    # O_EXCL and a per-process counter: two writers never share a temp file.
    # Mode 0o666 lets the umask decide, unlike mkstemp's private 0o600.
    fd = os.open(temp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        raise
    if durable:
        checkpoint_layout.fsync_directory(directory)


temp_path_for = checkpoint_layout.temp_path_for


_temp_counter = itertools.count()
