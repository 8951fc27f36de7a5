"""Memory-tier replicas, rank side: each node's committed snapshot, held by a buddy too.

A memory snapshot lives in its node's tmpfs, so a lost node takes its snapshots with
it, and a spare that replaces it holds none: without a copy elsewhere, a node loss
falls back to disk and loses up to a disk interval. With
``checkpoints.memory_replicas``, the launcher gives every rank three variables
(:func:`lazarus.domain.memory_tier.replica_environment`): the node in slot ``i``
pushes each committed snapshot to the node in slot ``(i + 1) mod n`` (its buddy, a
ring), whose local rank 0 runs a small receiver thread on the address and port the
launcher chose for this generation.

The snapshot thread hands each committed step to a pusher thread and returns, so
only committed snapshots travel and the training step never waits for the buddy;
one push at a time, and a step committed while a push is in flight replaces any
step still waiting (the buddy gets the newest, RAM stays bounded). One plain TCP
connection per snapshot: a JSON header line (job, generation, slot, step, file
names and sizes), the files' bytes
(``sendfile``: no copy through Python), then the receiver's one-line answer.

The receiver writes ``<run>/replicas/slot-<i>/step-N/`` under the node's private
root (:func:`lazarus.rank.memory.secure`: 0700 directories, 0600 files, no symlink
followed) with the disk tier's commit protocol: the files and the origin's own
manifest (sizes, job, generation) first, then ``COMMITTED``, only once every file
has the size the manifest records. Refused, and nothing left behind:

* a peer other than the node the launcher named (``LAZARUS_MEMORY_REPLICA_FROM``);
* a header for another job or another generation (a stale pusher of a generation
  the job left must not plant its timeline in the replicas);
* a file name that is not one plain path component;
* a copy cut short (the pushing node died mid-copy: a torn replica) or one whose
  files do not match the manifest.

Bounded: after each commit, the receiver keeps the newest ``LAZARUS_MEMORY_KEEP``
replicas of the slot it just received and deletes every older replica of any slot
(marker first). RAM per node: its own snapshots plus ``keep`` replicas (+1 in
flight).

Nothing secret travels beyond training state itself: no token, no environment. The
receiver binds only to the node's address the launcher gave, never ``0.0.0.0``.

Standard library only, like the rest of :mod:`lazarus.rank`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lazarus.rank as lazarus_rank
from lazarus.domain import chaos_points, checkpoint_layout, environment, memory_tier
from lazarus.rank import memory

__all__ = [
    "HEADER_LIMIT",
    "Receiver",
    "ReplicaRefused",
    "ensure_receiver",
    "push",
    "push_committed",
    "stop_receiver",
    "wait_for_pushes",
]

PROTOCOL_VERSION = 1
HEADER_LIMIT = 1 << 20
"""A header longer than this is refused (it lists a few file names and sizes)."""
CONNECT_TIMEOUT_S = 10.0
"""How long a push waits to reach the buddy: a buddy that is gone must not hold the
snapshot thread (and so the next snapshot) for long."""
IO_TIMEOUT_S = 60.0
"""Per socket operation, both ends: a peer that stops sending or reading is given up."""
_CHUNK = 1 << 20


class ReplicaRefused(RuntimeError):
    """The buddy refused a push, or the push could not complete."""


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` as a (host, port) pair; ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"replica address {text!r} is not host:port")
    return host.strip("[]"), int(port)


# --- the pushing side -----------------------------------------------------------------


def push(snapshot: Path, to: str, *, slot: int, job_id: str | None, generation: int) -> int:
    """Send committed ``snapshot`` to the receiver at ``to`` as slot ``slot``'s copy.
    Returns the bytes sent; raises :class:`ReplicaRefused` (with the receiver's
    reason) or OSError. Never follows a symlink inside the snapshot."""
    step = checkpoint_layout.parse_step_dir(snapshot.name)
    if step is None or not checkpoint_layout.is_committed(snapshot) or snapshot.is_symlink():
        raise ReplicaRefused(f"{snapshot} is not a committed snapshot")
    names = sorted(
        child.name
        for child in snapshot.iterdir()
        if child.name not in (checkpoint_layout.COMMIT_MARKER, checkpoint_layout.MANIFEST)
        and not child.name.endswith(checkpoint_layout.TEMP_SUFFIX)
    )
    names.append(checkpoint_layout.MANIFEST)  # last: the receiver commits after it
    handles = []
    try:
        for name in names:
            fd = os.open(snapshot / name, os.O_RDONLY | os.O_NOFOLLOW)
            handles.append(os.fdopen(fd, "rb"))
        files = [
            (name, os.fstat(handle.fileno()).st_size)
            for name, handle in zip(names, handles, strict=True)
        ]
        header = {
            "v": PROTOCOL_VERSION,
            "job_id": job_id,
            "generation": generation,
            "slot": slot,
            "step": step,
            "files": [list(entry) for entry in files],
        }
        host, port = parse_address(to)
        sent = 0
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as sock:
            sock.settimeout(IO_TIMEOUT_S)
            # Small writes (header, manifest) must not wait on the buddy's delayed ACK.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                sock.sendall(json.dumps(header).encode() + b"\n")
                for (_, size), handle in zip(files, handles, strict=True):
                    if size:
                        done = sock.sendfile(handle, 0, size)
                        if done != size:
                            raise ReplicaRefused(f"sent {done} of {size} bytes")
                        sent += done
            except (BrokenPipeError, ConnectionResetError) as exc:
                # The receiver refused early and closed: its reason, if it got out.
                answer = _read_line(sock) if isinstance(exc, BrokenPipeError) else ""
                if not answer:
                    raise
            else:
                answer = _read_line(sock)
    finally:
        for handle in handles:
            handle.close()
    try:
        reply = json.loads(answer)
    except ValueError:
        reply = None
    if not isinstance(reply, dict) or reply.get("ok") != step:
        why = reply.get("error") if isinstance(reply, dict) else answer[:200]
        raise ReplicaRefused(f"buddy at {to} refused step {step}: {why or 'no answer'}")
    return sent


_last_push_error: str | None = None


@dataclass(frozen=True)
class _Push:
    snapshot: Path
    to: str
    slot: int
    job_id: str | None
    generation: int


_pending: _Push | None = None
_pusher: threading.Thread | None = None
_push_lock = threading.Lock()
_idle = threading.Condition(_push_lock)


def push_committed(snapshot: Path) -> bool:
    """Hand a snapshot this node just committed to the background pusher, when
    replicas are on (True: handed over). The snapshot thread returns at once, so the
    next snapshot, and so the training step, never waits for the buddy. One push at a
    time: a step committed while a push is in flight replaces any step still waiting,
    so the buddy always gets the newest and RAM stays bounded. A failure is reported
    on stderr (once per distinct reason) and never raised: training goes on, and the
    node's own snapshot and disk still serve."""
    global _pending, _pusher
    to = os.environ.get(environment.MEMORY_REPLICA_TO)
    if not to:
        return False
    me = lazarus_rank.info()
    job = _Push(
        snapshot, to, lazarus_rank._env_int(environment.GROUP_RANK, 0), me.job_id, me.generation
    )
    with _push_lock:
        _pending = job
        if _pusher is None:
            _pusher = threading.Thread(target=_push_loop, name="lazarus-replica-push", daemon=True)
            _pusher.start()
    return True


def wait_for_pushes(timeout_s: float) -> bool:
    """Wait until no push is pending or in flight (tests, and a clean exit)."""
    deadline = time.monotonic() + timeout_s
    with _idle:
        while _pusher is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _idle.wait(left)
    return True


def _push_loop() -> None:
    global _pending, _pusher
    while True:
        with _push_lock:
            job, _pending = _pending, None
            if job is None:
                _pusher = None
                _idle.notify_all()
                return
        _push_one(job)


def _push_one(job: _Push) -> bool:
    global _last_push_error
    try:
        push(job.snapshot, job.to, slot=job.slot, job_id=job.job_id, generation=job.generation)
    except (OSError, ValueError, ReplicaRefused) as exc:
        reason = f"{type(exc).__name__}: {exc}"
        if reason != _last_push_error:
            print(
                f"lazarus.rank: memory replica of {job.snapshot.name} not pushed to {job.to}: "
                f"{reason}",
                file=sys.stderr,
            )
        _last_push_error = reason
        return False
    _last_push_error = None
    return True


# --- the receiving side ---------------------------------------------------------------


@dataclass(frozen=True)
class _Config:
    listen: str
    allowed_from: str
    root: Path
    job_id: str | None
    generation: int
    keep: int


class Receiver:
    """Accepts replicas for this node, one connection at a time, in a daemon thread."""

    def __init__(self, config: _Config) -> None:
        self.config = config
        host, port = parse_address(config.listen)
        self._server = socket.create_server((host, port), backlog=4)
        self._server.settimeout(0.5)
        self._closed = threading.Event()
        self.committed: list[tuple[int, int]] = []
        """(slot, step) of each replica committed, for tests."""
        self.refused: list[str] = []
        """Why pushes were refused, for tests (and printed on stderr)."""
        self._thread = threading.Thread(
            target=self._serve, name="lazarus-replica-receiver", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.getsockname()[1])

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=IO_TIMEOUT_S)
        self._server.close()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(IO_TIMEOUT_S)
                try:
                    self._receive(conn, peer[0])
                except Exception as exc:  # one bad push must never stop the receiver
                    self._refuse(conn, f"{type(exc).__name__}: {exc}")

    def _refuse(self, conn: socket.socket, why: str) -> None:
        self.refused.append(why)
        print(f"lazarus.rank: memory replica refused: {why}", file=sys.stderr)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"error": why}).encode() + b"\n")

    def _receive(self, conn: socket.socket, peer: str) -> None:
        config = self.config
        if peer not in _addresses_of(config.allowed_from):
            self._refuse(conn, f"peer {peer} is not {config.allowed_from}, the node replicated")
            return
        # Buffered: the header line, then the files' bytes, without a syscall a byte.
        reader = conn.makefile("rb")
        line = reader.readline(HEADER_LIMIT + 1)
        if len(line) > HEADER_LIMIT:
            self._refuse(conn, f"a header longer than {HEADER_LIMIT} bytes")
            return
        header = _header_problem_or_fields(line.decode(errors="replace"), config)
        if isinstance(header, str):
            self._refuse(conn, header)
            return
        slot, step, files = header
        slot_dir = memory.secure(Path(memory_tier.replica_dir(str(config.root), slot)), create=True)
        slot_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # outside the private root
        target = slot_dir / checkpoint_layout.step_dir_name(step)
        _remove(target)
        os.mkdir(target, 0o700)
        try:
            problem = _receive_files(reader, target, files)
            if problem is None:
                chaos_points.chaos_point(chaos_points.REPLICA_BEFORE_COMMIT)
                problem = _replica_problem(target, step, config)
        except BaseException:
            _remove(target)
            raise
        if problem is not None:
            _remove(target)
            self._refuse(conn, f"step {step} of slot {slot}: {problem}")
            return
        marker = {"step": step, "committed_at": _now(), "replica_of_slot": slot}
        _write_private(target / checkpoint_layout.COMMIT_MARKER, json.dumps(marker).encode())
        self.committed.append((slot, step))
        prune(config.root, slot, step, config.keep)
        conn.sendall(json.dumps({"ok": step}).encode() + b"\n")


def _header_problem_or_fields(
    line: str, config: _Config
) -> str | tuple[int, int, list[tuple[str, int]]]:
    try:
        header = json.loads(line)
    except ValueError:
        return "the header is not JSON"
    if not isinstance(header, dict) or header.get("v") != PROTOCOL_VERSION:
        return "not a replica header of this version"
    if header.get("job_id") != config.job_id:
        return f"written by job {header.get('job_id')!r}, this is {config.job_id!r}"
    if header.get("generation") != config.generation:
        return (
            f"pushed by generation {header.get('generation')!r}, this node runs "
            f"generation {config.generation}"
        )
    slot, step, raw_files = header.get("slot"), header.get("step"), header.get("files")
    if not isinstance(slot, int) or not isinstance(step, int):
        return "slot and step must be integers >= 0"
    if not _is_count(slot) or not _is_count(step):
        return "slot and step must be integers >= 0"
    if not isinstance(raw_files, list) or not raw_files:
        return "no files"
    files: list[tuple[str, int]] = []
    for entry in raw_files:
        if not (isinstance(entry, list) and len(entry) == 2 and _is_count(entry[1])):
            return f"file entry {entry!r} is not [name, size]"
        name = entry[0]
        if (
            not isinstance(name, str)
            or name in ("", ".", "..", checkpoint_layout.COMMIT_MARKER)
            or "/" in name
            or "\x00" in name
            or name.startswith(".")
        ):
            return f"file name {name!r} is not one plain path component"
        files.append((name, entry[1]))
    if files[-1][0] != checkpoint_layout.MANIFEST:
        return f"{checkpoint_layout.MANIFEST} must come last"
    return slot, step, files


def _receive_files(
    reader: io.BufferedIOBase, target: Path, files: list[tuple[str, int]]
) -> str | None:
    """Write each file (0600, never through a symlink) as its bytes arrive; a
    connection that ends early is a torn copy."""
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    for name, size in files:
        temp = target / f"{name}{checkpoint_layout.TEMP_SUFFIX}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as handle:
            left = size
            while left:
                got = reader.readinto(view[: min(left, _CHUNK)])
                if got == 0:
                    return f"torn: the copy ended {left} bytes short in {name}"
                handle.write(view[:got])
                left -= got
        os.replace(temp, target / name)
    return None


def _replica_problem(target: Path, step: int, config: _Config) -> str | None:
    """Why the received files are not a whole snapshot of this job's ``step``."""
    problem = checkpoint_layout.size_problem(target)
    if problem is not None:
        return f"torn: {problem}"
    manifest = json.loads((target / checkpoint_layout.MANIFEST).read_text())
    if manifest.get("job_id") != config.job_id:
        return f"its manifest names job {manifest.get('job_id')!r}"
    if manifest.get("generation") != config.generation:
        return f"its manifest names generation {manifest.get('generation')!r}"
    return None


def prune(root: Path, slot: int, step: int, keep: int) -> list[Path]:
    """After slot ``slot``'s replica of ``step`` committed: keep that slot's newest
    ``keep`` committed replicas up to ``step`` and delete every other replica, of any
    slot. Above ``step`` is only what an older generation pushed (within one, pushes
    come in step order): a timeline the job left. Below, a slot this node no longer
    buddies, torn leftovers, or old copies. Marker first; no symlink followed."""
    replicas = root / memory_tier.REPLICAS_DIR
    deleted: list[Path] = []
    if replicas.is_symlink() or not replicas.is_dir():
        return deleted
    for slot_dir in replicas.iterdir():
        if slot_dir.is_symlink() or not slot_dir.is_dir():
            continue
        kept: set[Path] = set()
        if slot_dir.name == f"slot-{slot}":
            committed = [p for s, p in checkpoint_layout.committed_steps(slot_dir) if s <= step]
            kept = set(committed[-keep:])
        for child in slot_dir.iterdir():
            if checkpoint_layout.parse_step_dir(child.name) is None or child in kept:
                continue
            _remove(child)
            deleted.append(child)
    return deleted


def _remove(path: Path) -> None:
    if path.is_symlink():
        path.unlink()
        return
    if not path.exists():
        return
    with contextlib.suppress(OSError):
        (path / checkpoint_layout.COMMIT_MARKER).unlink()
    shutil.rmtree(path, ignore_errors=True)


def _write_private(target: Path, data: bytes) -> None:
    temp = target.with_name(f"{target.name}{checkpoint_layout.TEMP_SUFFIX}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(temp, target)


def _read_line(sock: socket.socket) -> str:
    """One ``\\n``-terminated line, at most :data:`HEADER_LIMIT` bytes."""
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            break
        data += chunk
        if len(data) > HEADER_LIMIT:
            raise ValueError(f"a line longer than {HEADER_LIMIT} bytes")
    return data.decode(errors="replace").strip()


def _addresses_of(host: str) -> set[str]:
    with contextlib.suppress(OSError):
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    return set()


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _now() -> float:
    return time.time()


# --- this process's receiver ----------------------------------------------------------

_receiver: Receiver | None = None
_receiver_lock = threading.Lock()


def ensure_receiver() -> Receiver | None:
    """Run this node's receiver when replicas are on and this rank is its node's
    writer (local rank 0); restart it when the generation (or its address) changed, as
    after a rejoin in place. None when off, or when it cannot listen (said on stderr:
    this node then holds no replicas, and disk serves its predecessor's loss)."""
    global _receiver
    listen = os.environ.get(environment.MEMORY_REPLICA_LISTEN)
    allowed = os.environ.get(environment.MEMORY_REPLICA_FROM)
    root = memory.directory()
    if not listen or not allowed or root is None or not memory.is_writer():
        stop_receiver()
        return None
    me = lazarus_rank.info()
    config = _Config(listen, allowed, root, me.job_id, me.generation, memory.keep())
    with _receiver_lock:
        if _receiver is not None and _receiver.config == config:
            return _receiver
        if _receiver is not None:
            _receiver.close()
            _receiver = None
        try:
            memory.secure(root)
            _receiver = Receiver(config)
        except (OSError, ValueError) as exc:
            print(
                f"lazarus.rank: memory replicas: cannot receive on {listen}: {exc}",
                file=sys.stderr,
            )
            return None
        return _receiver


def stop_receiver() -> None:
    global _receiver
    with _receiver_lock:
        if _receiver is not None:
            _receiver.close()
            _receiver = None
