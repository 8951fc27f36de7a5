"""Node-to-node state transfer: one snapshot directory, authenticated and streamed.

Both copies of training state that cross the network use this one protocol: a rank's
push of each committed memory snapshot to its buddy (:mod:`lazarus.rank.replica`) and
the restore of a replica from its holder onto a spare (``python -m
lazarus.rank.transfer``, which the controller starts on the two nodes). The bytes
flow from node to node; the controller passes addresses and the key, never state.

Why a protocol of its own, and what it guarantees:

* **Both ends prove they hold the key before a byte of state moves.** The client
  sends a fresh nonce; the server answers with its own nonce and an HMAC over both;
  the client checks it (a squatter on the port learns nothing and receives nothing),
  then proves itself the same way with the header. A peer that fails gets the
  connection closed and no reason: refusals echo nothing to the unauthenticated.
* **The content is bound to its header.** Each file's sha256 is computed on both
  ends while it streams, and the sender's trailer carries them under an HMAC keyed
  by the session (both nonces), so a replayed or spliced stream fails. Nothing is
  committed before the trailer checks out.
* **Streamed, bounded memory.** A small pool of buffers (:data:`POOL_BUFFERS` x
  :data:`CHUNK`) goes round between the socket, the file and a hashing thread:
  hashlib releases the GIL on large updates, so hashing overlaps the I/O and a 1 GiB
  copy holds 16 MiB, never the state.
* **Never stuck on a dead peer.** Every socket operation has :data:`IO_TIMEOUT_S`,
  TCP keepalives probe a silent peer (a node that died sends no FIN), and the whole
  copy has a deadline that scales with its size (:func:`deadline_for`).

Keys: a per-run secret the launcher hands to the ranks in their environment (never
argv, a file or the workflow's history), from which each generation's key, each
port and each restore's key are derived (:mod:`lazarus.domain.memory_tier`). TLS is
not layered here: state crosses the network in clear but authenticated; the
security guide says how to encrypt where the network is not trusted.

Standard library only, like the rest of :mod:`lazarus.rank`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import queue
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

__all__ = [
    "CHUNK",
    "IO_TIMEOUT_S",
    "DigestingWriter",
    "Offer",
    "PeerUnproven",
    "Received",
    "TransferRefused",
    "deadline_for",
    "keepalive",
    "receive",
    "send",
]

MAGIC = "lazarus-transfer/2"
NONCE_BYTES = 32
LINE_LIMIT = 1 << 20
"""The header lists a few file names and sizes; a longer line is refused."""
CHUNK = 4 << 20
HASH_THREADS = 2
"""Threads hashing chunks beside the I/O: a spare or a buddy has cores to spare."""
POOL_BUFFERS = 6
IO_TIMEOUT_S = 10.0
"""Per socket operation, both ends. Long enough for a loaded node's scheduler hiccup,
short enough that a background thread gives up on a dead peer in seconds."""
CONNECT_TIMEOUT_S = 5.0
HANDSHAKE_TIMEOUT_S = 5.0
"""How long a sender waits for the listener's proof: a receiver answers at once, so a
silent listener (a squatter that accepts) is passed over quickly."""
MIN_RATE_BYTES_S = 50e6
"""The slowest copy that still counts as alive, for :func:`deadline_for`: 20 s a GB."""
BASE_DEADLINE_S = 30.0
UNPROVEN = "(closed, nothing said)"
"""Ends the reason :func:`receive` gives for a peer that never proved the key: it was
told nothing, and a receiver waiting for its real sender goes on waiting."""


class TransferRefused(RuntimeError):
    """The copy did not happen: the peer refused, failed to prove the key, or broke off."""


class PeerUnproven(TransferRefused):
    """The listener did not prove it holds the key (a squatter, or another job's
    receiver): nothing was sent, and the sender may try the next address."""


def deadline_for(total_bytes: int) -> float:
    """How long a copy of ``total_bytes`` may take at most, in seconds: a base for the
    handshake and a slow start, plus the bytes at :data:`MIN_RATE_BYTES_S`."""
    return BASE_DEADLINE_S + total_bytes / MIN_RATE_BYTES_S


def keepalive(sock: socket.socket) -> None:
    """Probe a silent peer after 2 s, every second, three times: a dead node is seen
    in about 5 s even when no byte is due."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


@dataclass(frozen=True)
class Offer:
    """What the sender says it sends: its header, authenticated before any byte."""

    fields: dict[str, Any]
    """Free-form facts the receiver judges (job, generation, slot, step)."""
    files: list[tuple[str, int]]
    """Plain file names and sizes, in the order they stream."""

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.files)


@dataclass
class Received:
    """One accepted copy: where it was written and what it cost."""

    offer: Offer
    directory: Path
    bytes: int
    seconds: float
    sha256: list[str] = field(default_factory=list)


# --- keys and lines ---------------------------------------------------------------------


def _mac(key: bytes, *parts: bytes) -> str:
    digest = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


class _Lines:
    """Reads ``\\n``-terminated lines and exact byte counts from one socket through a
    small buffer (a syscall per chunk, never per byte)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._pending = bytearray()

    def line(self) -> bytes:
        while b"\n" not in self._pending:
            if len(self._pending) > LINE_LIMIT:
                raise TransferRefused(f"a line longer than {LINE_LIMIT} bytes")
            chunk = self.sock.recv(65536)
            if not chunk:
                raise TransferRefused("the peer closed the connection")
            self._pending += chunk
        line, _, rest = bytes(self._pending).partition(b"\n")
        self._pending = bytearray(rest)
        return line

    def read_into(self, view: memoryview) -> int:
        """Fill ``view`` (buffered bytes first); 0 only at the end of the stream."""
        if self._pending:
            count = min(len(view), len(self._pending))
            view[:count] = self._pending[:count]
            del self._pending[:count]
            return count
        return self.sock.recv_into(view)


def _split_signed(line: bytes) -> tuple[bytes, str]:
    body, _, mac = line.rpartition(b" ")
    return body, mac.decode("ascii", errors="replace")


# --- hashing beside the I/O -------------------------------------------------------------


class _Pipeline:
    """Buffers that go round: the I/O thread fills one (socket or file), hands it to
    the hashing threads, and takes the next free one. At most :data:`POOL_BUFFERS`
    buffers exist, so memory stays bounded whatever the size.

    Each buffer's :data:`CHUNK` is hashed on its own, by whichever of
    :data:`HASH_THREADS` threads takes it (hashlib releases the GIL), so hashing runs
    on several cores beside the I/O; a file's digest is the sha256 of its chunks'
    digests in order (:func:`file_digest`), the same on both ends."""

    _DONE = object()

    def __init__(self, hashing: bool = True) -> None:
        self.hashing = hashing
        self.free: queue.Queue[bytearray] = queue.Queue()
        for _ in range(POOL_BUFFERS):
            self.free.put(bytearray(CHUNK))
        self._slots = threading.Semaphore(POOL_BUFFERS)
        self._work: queue.Queue[Any] = queue.Queue()
        self._digests: dict[int, bytes] = {}
        self._files: list[tuple[int, int]] = []
        self._next = 0
        self._file_start = 0
        self._threads = [
            threading.Thread(target=self._hash, name=f"lazarus-transfer-hash-{n}", daemon=True)
            for n in range(HASH_THREADS if hashing else 0)
        ]
        for thread in self._threads:
            thread.start()

    def buffer(self) -> bytearray:
        return self.free.get(timeout=IO_TIMEOUT_S)

    def hash(self, buffer: bytearray, count: int) -> None:
        """Hash ``buffer``'s first ``count`` bytes, then put it back in the pool."""
        if not self.hashing:
            self.free.put(buffer)
            return
        self._work.put((self._next, memoryview(buffer)[:count], lambda: self.free.put(buffer)))
        self._next += 1

    def hash_view(self, view: memoryview) -> None:
        """Hash ``view`` (a slice of a mapped file): at most :data:`POOL_BUFFERS`
        slices wait at once, so the mapping is read about as fast as it fills."""
        if not self.hashing:
            return
        if not self._slots.acquire(timeout=IO_TIMEOUT_S):
            raise TimeoutError("hashing fell behind")
        self._work.put((self._next, view, self._slots.release))
        self._next += 1

    def drain(self) -> None:
        """Wait until every slice handed to :meth:`hash_view` is hashed (before its
        mapping is closed)."""
        for _ in range(POOL_BUFFERS):
            if not self._slots.acquire(timeout=IO_TIMEOUT_S):
                raise TimeoutError("hashing fell behind")
        for _ in range(POOL_BUFFERS):
            self._slots.release()

    def next_file(self) -> None:
        self._files.append((self._file_start, self._next))
        self._file_start = self._next

    def finish(self) -> list[str]:
        for _ in self._threads:
            self._work.put(self._DONE)
        for thread in self._threads:
            thread.join(IO_TIMEOUT_S)
        if not self.hashing:
            return []
        return [
            file_digest(self._digests.get(n, b"") for n in range(start, end))
            for start, end in self._files
        ]

    def _hash(self) -> None:
        while True:
            item = self._work.get()
            if item is self._DONE:
                return
            index, view, done = item
            self._digests[index] = hashlib.sha256(view).digest()
            del item, view  # a mapping's slice: released before its mapping closes
            done()


def file_digest(chunk_digests: Iterable[bytes]) -> str:
    """A file's digest: the sha256 of its :data:`CHUNK` digests, in order (a hash
    list, so the chunks hash in parallel and a holder can keep one value per file)."""
    digest = hashlib.sha256()
    for chunk in chunk_digests:
        digest.update(chunk)
    return digest.hexdigest()


class DigestingWriter:
    """A file object for ``torch.save`` that writes through to ``handle`` and computes
    the file's :func:`file_digest` on the way, exactly as a receiver will (sha256 of
    each :data:`CHUNK` at its offset in the file, on :data:`HASH_THREADS` threads).

    Why: a memory snapshot is pushed to the buddy right after it is written. With
    its digest recorded here the push goes by ``sendfile`` (:func:`send` with
    ``digests``) and the sender never reads the snapshot back: one pass over the
    bytes instead of two, on a node whose cores train. A large ``write`` is hashed
    in place while it is written (every slice of it is hashed before ``write``
    returns, so the caller may reuse its buffer); small writes gather in one
    :data:`CHUNK` buffer of this object's own."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self._pipeline = _Pipeline()
        self._partial = bytearray()

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        count = len(view)
        if self._partial:
            take = min(CHUNK - len(self._partial), count)
            self._partial += view[:take]
            self._handle.write(view[:take])
            view = view[take:]
            if len(self._partial) == CHUNK:
                self._hash_partial()
        try:
            while len(view) >= CHUNK:
                piece = view[:CHUNK]
                self._pipeline.hash_view(piece)  # hashed on a thread while it is written
                self._handle.write(piece)
                view = view[CHUNK:]
        finally:
            self._pipeline.drain()
        if len(view):
            self._partial += view
            self._handle.write(view)
        return count

    def flush(self) -> None:
        self._handle.flush()

    def digest(self) -> str:
        """The file's digest; call once, after the last write."""
        if self._partial:
            self._hash_partial()
        self._pipeline.next_file()
        return self._pipeline.finish()[0]

    def _hash_partial(self) -> None:
        self._pipeline.hash_view(memoryview(bytes(self._partial)))
        self._partial = bytearray()


def digest_of(path: Path) -> str:
    """:func:`file_digest` of a file on disk (tests, and a holder without a record)."""
    chunks: list[bytes] = []
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            chunks.append(hashlib.sha256(block).digest())
    return file_digest(chunks)


# --- the sending side -------------------------------------------------------------------


def send(
    address: tuple[str, int],
    key: bytes,
    directory: Path,
    names: list[str],
    fields: dict[str, Any],
    *,
    connect_until: float | None = None,
    digests: list[str] | None = None,
) -> int:
    """Stream ``names`` (plain files of ``directory``, opened without following a
    symlink) to the receiver at ``address`` under ``key``. ``connect_until`` (a
    ``time.monotonic()`` instant) retries a refused connection until then: the
    receiver of a restore may still be starting. ``digests``: the files' digests,
    known already (a buddy verified them when the replica arrived): the bytes then go
    by ``sendfile``, unread by this process, and the receiver checks them against
    those. Returns the bytes sent; raises :class:`TransferRefused` or OSError."""
    handles = [os.fdopen(os.open(directory / n, os.O_RDONLY | os.O_NOFOLLOW), "rb") for n in names]
    try:
        files = [(n, os.fstat(h.fileno()).st_size) for n, h in zip(names, handles, strict=True)]
        offer = Offer(fields, files)
        deadline = time.monotonic() + deadline_for(offer.total_bytes)
        with _connect(address, connect_until) as sock:
            return _send_on(sock, key, offer, handles, deadline, digests)
    finally:
        for handle in handles:
            handle.close()


def _connect(address: tuple[str, int], until: float | None) -> socket.socket:
    while True:
        try:
            sock = socket.create_connection(address, timeout=CONNECT_TIMEOUT_S)
        except ConnectionRefusedError:
            if until is None or time.monotonic() >= until:
                raise
            time.sleep(0.05)
            continue
        sock.settimeout(IO_TIMEOUT_S)
        keepalive(sock)
        return sock


def _send_on(
    sock: socket.socket,
    key: bytes,
    offer: Offer,
    handles: list[Any],
    deadline: float,
    digests: list[str] | None = None,
) -> int:
    lines = _Lines(sock)
    client_nonce = secrets.token_bytes(NONCE_BYTES)
    sock.sendall(f"{MAGIC} {client_nonce.hex()}\n".encode())
    sock.settimeout(HANDSHAKE_TIMEOUT_S)  # a squatter that accepts and stays silent
    try:
        answer = lines.line().decode("ascii", errors="replace").split(" ")
        sock.settimeout(IO_TIMEOUT_S)
    except (TransferRefused, OSError):
        raise PeerUnproven("the receiver did not prove it holds the key: nothing sent") from None
    if len(answer) != 2:
        raise PeerUnproven("the receiver did not prove it holds the key: nothing sent")
    try:
        server_nonce = bytes.fromhex(answer[0])
    except ValueError:
        raise PeerUnproven("the receiver did not prove it holds the key: nothing sent") from None
    if not hmac.compare_digest(answer[1], _mac(key, b"server", client_nonce, server_nonce)):
        raise PeerUnproven("the receiver did not prove it holds the key: nothing sent")
    session = bytes.fromhex(_mac(key, b"session", client_nonce, server_nonce))
    header = json.dumps({"fields": offer.fields, "files": offer.files}).encode()
    proof = _mac(key, b"client", server_nonce, client_nonce)
    sock.sendall(proof.encode() + b" " + header + b" " + _mac(session, b"header", header).encode())
    sock.sendall(b"\n")
    verdict = _reply(lines.line())
    if verdict.get("go") is not True:
        raise TransferRefused(f"refused: {verdict.get('error') or 'no reason given'}")
    if digests is not None and len(digests) == len(offer.files):
        sent, hashes = _send_files(sock, offer, handles), digests
    else:
        sent, hashes = _hash_and_send(sock, offer, handles, deadline)
    trailer = json.dumps({"sha256": hashes}).encode()
    sock.sendall(trailer + b" " + _mac(session, b"trailer", header, trailer).encode() + b"\n")
    final = _reply(lines.line())
    if "ok" not in final:
        raise TransferRefused(f"refused: {final.get('error') or 'no reason given'}")
    return sent


def _send_files(sock: socket.socket, offer: Offer, handles: list[Any]) -> int:
    """The files by ``sendfile``: the kernel copies, this process reads nothing."""
    sent = 0
    for (name, size), handle in zip(offer.files, handles, strict=True):
        if size:
            done = sock.sendfile(handle, 0, size)
            if done != size:
                raise TransferRefused(f"{name}: sent {done} of {size} bytes (it shrank)")
            sent += done
    return sent


def _hash_and_send(
    sock: socket.socket, offer: Offer, handles: list[Any], deadline: float
) -> tuple[int, list[str]]:
    """The files through the buffer pool, each chunk hashed beside the sending."""
    pipeline = _Pipeline()
    sent = 0
    try:
        for (_, size), handle in zip(offer.files, handles, strict=True):
            left = size
            while left:
                if time.monotonic() > deadline:
                    bound = deadline_for(offer.total_bytes)
                    raise TransferRefused(f"the copy outran its {bound:.0f} s")
                buffer = pipeline.buffer()
                count = handle.readinto(memoryview(buffer)[: min(left, CHUNK)])
                if not count:
                    raise TransferRefused(f"{handle.name} shrank while it was sent")
                sock.sendall(memoryview(buffer)[:count])
                pipeline.hash(buffer, count)
                left -= count
                sent += count
            pipeline.next_file()
    finally:
        hashes = pipeline.finish()
    return sent, hashes


def _reply(line: bytes) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError:
        return {"error": "an answer that is not JSON"}
    return value if isinstance(value, dict) else {"error": "an answer that is not an object"}


# --- the receiving side -----------------------------------------------------------------

Judge = Callable[[Offer], "Path | str"]
"""Given an authenticated offer: the empty directory to write it into, or why not."""
Commit = Callable[[Received], "str | None"]
"""Given a whole, verified copy: None once committed, or why it was not."""


def receive(
    conn: socket.socket, key: bytes, judge: Judge, commit: Commit, *, verify: bool = True
) -> Received | str:
    """Serve one connection: authenticate, judge the offer, stream the files into the
    directory ``judge`` gave (0600 temp names, renamed once whole), check every hash
    and the trailer's MAC, then ``commit``. Returns what was received, or why not (a
    peer that failed to prove the key gets no reason; an authenticated one does).
    The caller owns ``conn`` and the directory's cleanup on failure.

    Without ``verify`` the content is not hashed here: the sender's digests, under the
    session's MAC, are taken as they are and kept in :attr:`Received.sha256`, for
    whoever later sends the files on to check them (a buddy's replica is hashed by the
    spare it is restored to, before anything there is committed; hashing at both ends
    of every push would double the CPU a replica costs a training node)."""
    conn.settimeout(IO_TIMEOUT_S)
    keepalive(conn)
    lines = _Lines(conn)
    hello = lines.line().decode("ascii", errors="replace").split(" ")
    if len(hello) != 2 or hello[0] != MAGIC:
        return f"a peer that does not speak the protocol {UNPROVEN}"
    try:
        client_nonce = bytes.fromhex(hello[1])
    except ValueError:
        return f"a peer that does not speak the protocol {UNPROVEN}"
    server_nonce = secrets.token_bytes(NONCE_BYTES)
    conn.sendall(
        f"{server_nonce.hex()} {_mac(key, b'server', client_nonce, server_nonce)}\n".encode()
    )
    try:
        proof, _, signed = lines.line().partition(b" ")
    except TransferRefused:
        return f"a peer that left before proving it holds the key {UNPROVEN}"
    expected = _mac(key, b"client", server_nonce, client_nonce)
    if not hmac.compare_digest(proof.decode("ascii", errors="replace"), expected):
        return f"a peer that did not prove it holds the key {UNPROVEN}"
    session = bytes.fromhex(_mac(key, b"session", client_nonce, server_nonce))
    header, mac = _split_signed(signed)
    if not hmac.compare_digest(mac, _mac(session, b"header", header)):
        return f"a header whose MAC does not match {UNPROVEN}"
    offer = _offer(header)
    if isinstance(offer, str):
        _answer(conn, {"error": offer})
        return offer
    target = judge(offer)
    if isinstance(target, str):
        _answer(conn, {"error": target})
        return target
    _answer(conn, {"go": True})
    started = time.monotonic()
    deadline = started + deadline_for(offer.total_bytes)
    problem, hashes = _receive_files(lines, target, offer, deadline, verify)
    if problem is None:
        trailer, mac = _split_signed(lines.line())
        claimed = _reply(trailer).get("sha256")
        if not hmac.compare_digest(mac, _mac(session, b"trailer", header, trailer)):
            problem = "the trailer's MAC does not match: the stream was altered"
        elif not _digest_list(claimed, len(offer.files)):
            problem = "the trailer lists no digest for every file"
        elif verify and claimed != hashes:
            problem = "the content does not match the sender's hashes"
        else:
            hashes = [str(d) for d in claimed] if isinstance(claimed, list) else hashes
    if problem is not None:
        _answer(conn, {"error": problem})
        return problem
    received = Received(offer, target, offer.total_bytes, time.monotonic() - started, hashes)
    why = commit(received)
    if why is not None:
        _answer(conn, {"error": why})
        return why
    _answer(conn, {"ok": offer.fields.get("step", True)})
    return received


def _answer(conn: socket.socket, value: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(value).encode() + b"\n")


def plain_name_problem(name: object) -> str | None:
    """Why ``name`` is not one plain, visible file name, or None."""
    if not isinstance(name, str) or name in ("", ".", ".."):
        return f"file name {name!r} is not one plain path component"
    if "/" in name or "\x00" in name or name.startswith("."):
        return f"file name {name!r} is not one plain path component"
    return None


def _offer(header: bytes) -> Offer | str:
    try:
        value = json.loads(header)
    except ValueError:
        return "the header is not JSON"
    if not isinstance(value, dict) or not isinstance(value.get("fields"), dict):
        return "the header has no fields"
    raw = value.get("files")
    if not isinstance(raw, list) or not raw:
        return "the header lists no files"
    files: list[tuple[str, int]] = []
    for entry in raw:
        size = entry[1] if isinstance(entry, list) and len(entry) == 2 else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return f"file entry {entry!r} is not [name, size]"
        problem = plain_name_problem(entry[0])
        if problem is not None:
            return problem
        files.append((entry[0], size))
    if len({name for name, _ in files}) != len(files):
        return "the header names a file twice"
    return Offer(value["fields"], files)


def _digest_list(value: object, count: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) == count
        and all(isinstance(d, str) and len(d) == 64 for d in value)
    )


def _receive_files(
    lines: _Lines, target: Path, offer: Offer, deadline: float, verify: bool = True
) -> tuple[str | None, list[str]]:
    """Each file through the buffer pool into its temp file, its chunks hashed beside
    the receiving; renamed once whole.

    Why ``write`` from pooled buffers and not ``recv_into`` a mapping of the file: on
    tmpfs each first touch of a mapped page is a fault that allocates and zeroes it,
    262,144 of them a GiB, which cost more than the copy they save (measured here: 1.2
    GB/s through the pool, 0.85 GB/s through a mapping, hashing included)."""
    from lazarus.domain.checkpoint_layout import TEMP_SUFFIX

    pipeline = _Pipeline(hashing=verify)
    problem: str | None = None
    try:
        for name, size in offer.files:
            temp = target / f"{name}{TEMP_SUFFIX}"
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                problem = _receive_file(lines, fd, name, size, pipeline, deadline)
            finally:
                os.close(fd)
            if problem is not None:
                break
            os.replace(temp, target / name)
            pipeline.next_file()
    except (OSError, TimeoutError, queue.Empty) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    finally:
        hashes = pipeline.finish()
    return problem, hashes


def _receive_file(
    lines: _Lines, fd: int, name: str, size: int, pipeline: _Pipeline, deadline: float
) -> str | None:
    done = 0
    while done < size:
        if time.monotonic() > deadline:
            return "the copy outran its deadline"
        buffer = pipeline.buffer()
        view = memoryview(buffer)
        want = min(CHUNK, size - done)
        filled = 0
        while filled < want:
            got = lines.read_into(view[filled:want])
            if got == 0:
                pipeline.free.put(buffer)
                return f"torn: the copy ended {size - done - filled} bytes short in {name}"
            filled += got
        written = 0
        while written < want:
            written += os.write(fd, view[written:want])
        view.release()
        pipeline.hash(buffer, want)
        done += want
    return None
