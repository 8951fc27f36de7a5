"""The replica secret of a run, derived from the worker's key: never stored, never sent
to the workflow.

Memory replicas cross the network (:mod:`lazarus.rank.transfer`), so both ends must
prove they belong to the job. The launcher hands each rank its run's secret in the
environment; the restore step hands each node the key of one copy on stdin. Both
must agree across activity retries on any worker and across controller restarts,
yet the secret may not live in the workflow's history (anyone who can read the job
could read it). So it is derived: ``HMAC(worker key, memory directory)``, where the
memory directory names the job and the run. A retried launch derives the same
secret (adopted ranks and fresh ones agree); a new run of the job gets a new one.

The worker's key is 32 random bytes (hex) in the file :data:`KEY_FILE_ENV` names, by
default ``$XDG_CONFIG_HOME/lazarus/replica.key``, created 0600 on first use. Workers
that share a task queue must share the key (the Helm chart mounts one Secret); a
worker with another key derives other secrets, so the replicas of the ranks it
launches are refused by the others' (said on the ranks' stderr), and disk serves.
A key file others can read is refused, as ssh refuses such a private key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import tempfile
from pathlib import Path

KEY_FILE_ENV = "LAZARUS_REPLICA_KEY_FILE"
KEY_BYTES = 32


class ReplicaKeyError(RuntimeError):
    """The worker's replica key cannot be used; the message names the file."""


def key_file() -> Path:
    named = os.environ.get(KEY_FILE_ENV)
    if named:
        return Path(named)
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "lazarus" / "replica.key"


def worker_key(path: Path | None = None) -> bytes:
    """The worker's key, created (0600, in a 0700 directory) when the file is missing."""
    path = path or key_file()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return _create(path)
    except OSError as exc:
        raise ReplicaKeyError(f"{KEY_FILE_ENV}: cannot open {path}: {exc.strerror}") from None
    with os.fdopen(fd) as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077:
            raise ReplicaKeyError(
                f"{KEY_FILE_ENV}: {path} must be a regular file only its owner can read "
                f"(mode {stat.S_IMODE(info.st_mode):04o}): chmod 600 {path}"
            )
        text = handle.read().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise ReplicaKeyError(f"{KEY_FILE_ENV}: {path} does not hold hex") from None
    if len(key) < 16:
        raise ReplicaKeyError(f"{KEY_FILE_ENV}: {path} holds under 16 bytes")
    return key


def _create(path: Path) -> bytes:
    """Write a new key whole, then link it into place: a worker that reads the file
    at the same moment sees no file or the whole key, never half of one; of two
    workers creating it at once, the second reads the first's."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = secrets.token_bytes(KEY_BYTES)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".replica-key-")  # 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(key.hex() + "\n")
        try:
            os.link(temp, path)
        except FileExistsError:
            return worker_key(path)
    finally:
        os.unlink(temp)
    return key


def run_secret(memory_dir: str) -> str:
    """The replica secret (hex) of the run whose memory tier is ``memory_dir``."""
    return hmac.new(worker_key(), f"replicas/{memory_dir}".encode(), hashlib.sha256).hexdigest()
