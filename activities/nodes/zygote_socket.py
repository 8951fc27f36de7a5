"""Where a node's zygote of a run listens, and the relay that runs a node-side verb in
a fork of it.

A verb the shim runs on an ssh or Slurm node (``rejoin``: :mod:`activities.nodes.carry`)
starts a fresh interpreter, and most of its start is importing pydantic and the node
records: 0.2 of the 0.25 s of CPU the carry took on a quiet test host, 0.5 s of wall
time on a loaded one, all of it between a crash and the replacement's fork. The
node's zygote (:mod:`activities.nodes.zygote`) has those imported already. So the
verb's process first offers its request to the zygote (:func:`run_in_zygote`); a fork
of the zygote runs it and the process only copies the answer lines back. Where no
zygote serves (none started, dead, refusing, still preloading, older code that does
not know the verb) nothing ran, and the verb runs in its own process as before.

Standard library only, and nothing else of Lazarus: this module is all the relay
imports before it knows whether it needs the rest.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

SOCKET_FILE = "zygote.sock"
ZYGOTE_DIR_PREFIX = ".zygote-"
RUN_OP = "run"
"""The request op of a verb run in a fork: ``{"op": "run", "verb": ..., "stdin": ...}``.
The zygote answers ``{"ok": false, "reason": ...}`` (nothing ran), or ``{"ok": true}``
and then the verb's own output lines, until the fork closes the connection."""
RELAY_TIMEOUT_S = 120.0
"""The most a relay waits for the zygote's next line: above the longest carry (its
fencing's kill and lock waits); the caller's own call times out sooner."""


def zygote_dir(run_root: str | Path, node: str) -> Path:
    """The directory of ``node``'s zygote of one run (a dot directory, so run and
    generation scans never mistake it for either)."""
    return Path(run_root) / f"{ZYGOTE_DIR_PREFIX}{node}"


def socket_address(run_dir: Path) -> tuple[str, int | None]:
    """The address to bind or connect ``run_dir/zygote.sock`` by, and a directory fd to
    close afterwards. Unix socket paths are limited to 107 bytes; a longer one is
    reached through ``/proc/self/fd/N/``, which the kernel resolves like any path."""
    path = str(run_dir / SOCKET_FILE)
    if len(path.encode()) <= 100:
        return path, None
    dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    return f"/proc/self/fd/{dir_fd}/{SOCKET_FILE}", dir_fd


def run_in_zygote(directory: Path, verb: str, stdin: bytes, out: BinaryIO) -> bool:
    """Run ``verb`` with ``stdin`` in a fork of the zygote in ``directory``, copying
    its answer lines to ``out``. False when the verb's own output never began (no
    zygote, one that refused, or a fork that died first): the caller then runs the
    verb itself, as the verbs run this way are safe to repeat. Once a line of the
    verb's is copied, its answer stands, whole or cut short."""
    try:
        text = stdin.decode()
        address, dir_fd = socket_address(directory)
    except (UnicodeDecodeError, OSError):
        return False
    request = json.dumps({"op": RUN_OP, "verb": verb, "stdin": text}).encode() + b"\n"
    copied = False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(RELAY_TIMEOUT_S)
            conn.connect(address)
            conn.sendall(request)
            lines = conn.makefile("rb")
            try:
                accepted = json.loads(lines.readline() or b"null")
            except ValueError:
                return False
            if not isinstance(accepted, dict) or accepted.get("ok") is not True:
                return False
            for line in lines:
                out.write(line)
                out.flush()
                copied = True
    except OSError:
        return copied
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    return copied


def relayed_main(verb: str, run: Callable[[bytes, BinaryIO], int]) -> int:
    """A node-side verb's ``main``: its request read from stdin, run in a fork of the
    zygote the request names (its ``run_root`` and ``node``) where that serves, else
    by ``run`` in this process; the answer lines on stdout either way."""
    stdin = sys.stdin.buffer.read()
    directory = _zygote_named_by(stdin)
    if directory is not None and run_in_zygote(directory, verb, stdin, sys.stdout.buffer):
        return 0
    return run(stdin, sys.stdout.buffer)


def _zygote_named_by(stdin: bytes) -> Path | None:
    """The zygote directory of a request's ``run_root`` and ``node``, read without
    validating (the verb validates wherever it runs); None when it names none."""
    try:
        request = json.loads(stdin)
    except ValueError:
        return None
    if not isinstance(request, dict):
        return None
    run_root, node = request.get("run_root"), request.get("node")
    if not isinstance(run_root, str) or not isinstance(node, str) or not run_root:
        return None
    return zygote_dir(run_root, node)
