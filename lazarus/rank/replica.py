"""Memory-tier replicas, rank side: each node's committed snapshot, held by a buddy too.

A memory snapshot lives in its node's tmpfs, so a lost node takes its snapshots with
it, and a spare that replaces it holds none: without a copy elsewhere, a node loss
falls back to disk and loses up to a disk interval. With
``checkpoints.memory_replicas``, the launcher gives every rank four variables
(:func:`lazarus.domain.memory_tier.replica_environment`): the node in slot ``i``
pushes each committed snapshot to the node in slot ``(i + 1) mod n`` (its buddy, a
ring), whose local rank 0 runs a small receiver thread on an address and a port
derived from this generation's key.

Every copy goes through :mod:`lazarus.rank.transfer`: both ends prove they hold the
generation's key (derived from the run's secret, which only the ranks' environment
carries) before a byte of state moves, and the content is checked against hashes the
sender MACs. So another user on a node can neither receive a snapshot by squatting
the port (it cannot be computed without the key, and the pusher checks the
receiver's proof first), nor plant a forged replica, nor wipe one; a refusal tells an
unauthenticated peer nothing.

The snapshot thread (:mod:`lazarus.rank.torch`) hands each committed step to a
pusher thread and waits for the buddy's answer before it ends; the training thread
never waits (a snapshot due meanwhile is skipped), and every node pushes the same
steps, so the survivors' newest snapshots include the step a lost node's buddy holds.
One push at a time; a step handed over while a push is in flight replaces any step
still waiting (RAM stays bounded).

The receiver writes each copy into a hidden directory under
``<run>/replicas/slot-<i>/`` in the node's private root (:func:`lazarus.rank.memory.secure`:
0700 directories, 0600 files, no symlink followed), commits it (``COMMITTED``
inside) only once every file has its manifest's size and its sender's hash, and
renames it to ``step-N`` in one step: a torn copy is never seen under a step's name.
Refused, with nothing left behind: a header for another job, generation or slot than
this receiver serves (a stale pusher of a generation the job left must not plant its
timeline), a copy cut short, or one whose content or manifest does not match.

Bounded: after each commit the receiver keeps the newest ``LAZARUS_MEMORY_KEEP``
replicas of that slot at or below the step it just received and deletes the older
ones, and the replicas of other slots that an older generation pushed. A push never
deletes a replica above its own step: within a generation pushes come in step order,
so only an older generation wrote one, and the search's timeline rule judges it.
RAM per node: its own snapshots plus ``keep`` replicas (+1 in flight).

Training never waits on a peer: the receiver runs in its own thread, every socket
operation has a timeout and TCP keepalives, and replacing the receiver at a new
generation (after a rejoin) shuts its connection in flight down rather than waiting
for it: the training thread returns in milliseconds even when the old pusher died
mid-push without a FIN.

Standard library only, like the rest of :mod:`lazarus.rank`.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import secrets
import shutil
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lazarus.domain import chaos_points, checkpoint_layout, environment, memory_tier
from lazarus.rank import identity, memory, transfer

__all__ = [
    "Receiver",
    "ReplicaRefused",
    "ensure_receiver",
    "push",
    "push_committed",
    "stop_receiver",
    "wait_for_pushes",
]

CLOSE_WAIT_S = 0.2
"""How long replacing a receiver waits for its thread after shutting its connection
down: the training thread calls it, and must never block on a peer."""
DIGESTS = "digests"
"""Key of a replica's ``COMMITTED`` marker: its files' digests as they arrived."""
INCOMING_PREFIX = ".incoming-"
"""A copy being received: hidden, never listed as a step, renamed once committed."""


class ReplicaRefused(transfer.TransferRefused):
    """The buddy refused a push, or the push could not complete."""


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` as a (host, port) pair; ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"replica address {text!r} is not host:port")
    return host.strip("[]"), int(port)


def known_digests(snapshot: Path, names: list[str]) -> list[str] | None:
    """The digests a replica's marker recorded for ``names`` (in that order), or
    None when it has none for every one (the sender then hashes as it sends)."""
    try:
        marker = json.loads((snapshot / checkpoint_layout.COMMIT_MARKER).read_text())
        recorded = marker[DIGESTS]
        found = [recorded[name] for name in names]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if all(isinstance(d, str) for d in found) else None


def snapshot_files(snapshot: Path) -> list[str]:
    """The plain files of a committed snapshot to copy, its manifest last (the
    receiver checks the sizes against it), its marker and temp files left out."""
    names = sorted(
        child.name
        for child in snapshot.iterdir()
        if child.name not in (checkpoint_layout.COMMIT_MARKER, checkpoint_layout.MANIFEST)
        and not child.name.endswith(checkpoint_layout.TEMP_SUFFIX)
    )
    return [*names, checkpoint_layout.MANIFEST]


# --- the pushing side -----------------------------------------------------------------


def push(
    snapshot: Path,
    to: str,
    *,
    key: bytes,
    slot: int,
    job_id: str | None,
    generation: int,
    known: Mapping[str, str] | None = None,
) -> int:
    """Send committed ``snapshot`` to the receiver at ``to`` as slot ``slot``'s copy,
    under ``key``. ``known``: digests computed as files were written (the state
    file's, :func:`lazarus.rank.state_file.save_snapshot_file`); with every large
    file's digest known the bytes go by ``sendfile``, unread here. Returns the bytes
    sent; raises :class:`ReplicaRefused` (with the receiver's reason, once it proved
    the key) or OSError. Never follows a symlink inside the snapshot."""
    step = checkpoint_layout.parse_step_dir(snapshot.name)
    if step is None or not checkpoint_layout.is_committed(snapshot) or snapshot.is_symlink():
        raise ReplicaRefused(f"{snapshot} is not a committed snapshot")
    fields = {"job_id": job_id, "generation": generation, "slot": slot, "step": step}
    names = snapshot_files(snapshot)
    digests = _all_digests(snapshot, names, known or {})
    host, first = parse_address(to)
    unproven: list[str] = []
    for port in memory_tier.candidate_ports(key, first):
        try:
            return transfer.send((host, port), key, snapshot, names, fields, digests=digests)
        except (transfer.PeerUnproven, ConnectionRefusedError) as exc:
            unproven.append(f"{port}: {exc}")  # a squatter, or not this port: the next
        except transfer.TransferRefused as exc:
            raise ReplicaRefused(f"buddy at {host}:{port}, step {step}: {exc}") from None
    raise ReplicaRefused(
        f"no buddy at {host} proved the key on any of its ports, step {step} not sent ("
        + "; ".join(unproven)
        + ")"
    )


SMALL_FILE_BYTES = 1 << 20
"""A file this small (the manifest) is hashed at push time when no digest was kept."""


def _all_digests(snapshot: Path, names: list[str], known: Mapping[str, str]) -> list[str] | None:
    """Every file's digest: the ``known`` ones, the small rest hashed now; None when a
    large file has none (the push then hashes as it sends, on several threads)."""
    digests: list[str] = []
    for name in names:
        path = snapshot / name
        if name in known:
            digests.append(known[name])
        elif path.stat().st_size <= SMALL_FILE_BYTES:
            digests.append(transfer.digest_of(path))
        else:
            return None
    return digests


_last_push_error: str | None = None
completed_pushes: collections.deque[tuple[int, int, float]] = collections.deque(maxlen=64)
"""(step, bytes, seconds) of the recent pushes that the buddy committed: a benchmark's
(and a curious script's) view of the push rate."""
pushes_skipped = 0
"""Committed steps replaced by a newer one before their push began (never queued)."""


@dataclass(frozen=True)
class _Push:
    snapshot: Path
    to: str
    key: bytes
    slot: int
    job_id: str | None
    generation: int
    known: Mapping[str, str]


_pending: _Push | None = None
_pusher: threading.Thread | None = None
_push_lock = threading.Lock()
_idle = threading.Condition(_push_lock)


def _generation_key(generation: int) -> bytes | None:
    """This generation's replica key, from the run's secret in the environment; None
    (and said once) without one: an unauthenticated replica is never sent or taken."""
    secret = os.environ.get(environment.MEMORY_REPLICA_SECRET)
    if not secret:
        _say_once("no replica secret in the environment: replicas off for this rank")
        return None
    try:
        return memory_tier.generation_key(secret, generation)
    except ValueError:
        _say_once(f"{environment.MEMORY_REPLICA_SECRET} is not hex: replicas off for this rank")
        return None


_said: set[str] = set()


def _say_once(what: str) -> None:
    if what not in _said:
        _said.add(what)
        print(f"lazarus.rank: memory replicas: {what}", file=sys.stderr)


def push_committed(snapshot: Path, known: Mapping[str, str] | None = None) -> bool:
    """Hand a snapshot this node just committed to the background pusher, when
    replicas are on (True: handed over). The snapshot thread returns at once, so the
    next snapshot, and so the training step, never waits for the buddy. One push at a
    time: a step committed while a push is in flight replaces any step still waiting
    (counted in :data:`pushes_skipped`), so the buddy always gets the newest and RAM
    stays bounded. A failure is reported on stderr (once per distinct reason) and
    never raised: training goes on, and the node's own snapshot and disk still
    serve."""
    global _pending, _pusher, pushes_skipped
    to = os.environ.get(environment.MEMORY_REPLICA_TO)
    if not to:
        return False
    me = identity.info()
    key = _generation_key(me.generation)
    if key is None:
        return False
    slot = identity._env_int(environment.GROUP_RANK, 0)
    job = _Push(snapshot, to, key, slot, me.job_id, me.generation, dict(known or {}))
    with _push_lock:
        if _pending is not None:
            pushes_skipped += 1
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
    started = time.monotonic()
    try:
        sent = push(
            job.snapshot,
            job.to,
            key=job.key,
            slot=job.slot,
            job_id=job.job_id,
            generation=job.generation,
            known=job.known,
        )
    except (OSError, ValueError, transfer.TransferRefused) as exc:
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
    step = checkpoint_layout.parse_step_dir(job.snapshot.name) or 0
    completed_pushes.append((step, sent, time.monotonic() - started))
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
    key: bytes


class Receiver:
    """Accepts replicas for this node, one connection at a time, in a daemon thread."""

    def __init__(self, config: _Config) -> None:
        self.config = config
        self._server = _listen(config.listen, config.key)
        self._server.settimeout(0.5)
        self._closed = threading.Event()
        self._conn: socket.socket | None = None
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
        """Stop at once: the connection in flight (a pusher that may be dead, its
        socket half-open) is shut down, not waited for, so whoever calls this (the
        training thread at a rejoin) returns within :data:`CLOSE_WAIT_S`; the copy it
        was receiving is torn and removed by the thread on its way out."""
        self._closed.set()
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._server.close()
        self._thread.join(timeout=CLOSE_WAIT_S)

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                self._conn = conn
                try:
                    self._receive(conn, peer[0])
                except Exception as exc:  # one bad push must never stop the receiver
                    self._note(f"{type(exc).__name__}: {exc}")
                finally:
                    self._conn = None

    def _note(self, why: str) -> None:
        self.refused.append(why)
        print(f"lazarus.rank: memory replica refused: {why}", file=sys.stderr)

    def _receive(self, conn: socket.socket, peer: str) -> None:
        config = self.config
        if peer not in _addresses_of(config.allowed_from):
            # Closed without a word: the peer learns nothing, not even who is expected.
            self._note(f"a connection from {peer}, not the node replicated (closed)")
            return
        incoming: list[Path] = []

        def judge(offer: transfer.Offer) -> Path | str:
            problem = _offer_problem(offer, config)
            if problem is not None:
                return problem
            slot = int(offer.fields["slot"])
            slot_dir = memory.secure(
                Path(memory_tier.replica_dir(str(config.root), slot)), create=True
            )
            slot_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # outside the private root
            target = slot_dir / f"{INCOMING_PREFIX}{secrets.token_hex(8)}"
            os.mkdir(target, 0o700)
            incoming.append(target)
            return target

        def commit(received: transfer.Received) -> str | None:
            chaos_points.chaos_point(chaos_points.REPLICA_BEFORE_COMMIT)
            step = int(received.offer.fields["step"])
            slot = int(received.offer.fields["slot"])
            problem = _replica_problem(received.directory, step, config)
            if problem is not None:
                return f"step {step} of slot {slot}: {problem}"
            marker = {
                "step": step,
                "committed_at": time.time(),
                "replica_of_slot": slot,
                # The sender's, under the session's MAC: a restore from this replica
                # sends them on, and the spare checks every byte against them.
                DIGESTS: dict(
                    zip([n for n, _ in received.offer.files], received.sha256, strict=True)
                ),
            }
            _write_private(
                received.directory / checkpoint_layout.COMMIT_MARKER, json.dumps(marker).encode()
            )
            final = received.directory.parent / checkpoint_layout.step_dir_name(step)
            _remove(final)
            os.rename(received.directory, final)
            self.committed.append((slot, step))
            prune(config.root, slot, step, config.keep, config.generation)
            return None

        try:
            # Not hashed here: the spare a replica is restored to checks it (see receive).
            outcome = transfer.receive(conn, config.key, judge, commit, verify=False)
        finally:
            for target in incoming:
                _remove(target)  # renamed away when committed: only a failed copy is left
        if isinstance(outcome, str):
            self._note(outcome)


def _listen(listen: str, key: bytes) -> socket.socket:
    """A listening socket on the first free candidate port (see
    :func:`lazarus.domain.memory_tier.candidate_ports`); the last error when none is."""
    host, first = parse_address(listen)
    error: OSError | None = None
    for port in memory_tier.candidate_ports(key, first):
        try:
            return socket.create_server((host, port), backlog=4)
        except OSError as exc:
            error = exc
    assert error is not None
    raise error


def _offer_problem(offer: transfer.Offer, config: _Config) -> str | None:
    """Why an authenticated offer is not one this receiver takes (said to the sender,
    which proved the key: it is this job's own pusher)."""
    fields = offer.fields
    if fields.get("job_id") != config.job_id:
        return "written by another job"
    if fields.get("generation") != config.generation:
        return "pushed by another generation"
    slot, step = fields.get("slot"), fields.get("step")
    if not _is_count(slot) or not _is_count(step):
        return "slot and step must be integers >= 0"
    if offer.files[-1][0] != checkpoint_layout.MANIFEST:
        return f"{checkpoint_layout.MANIFEST} must come last"
    if any(name == checkpoint_layout.COMMIT_MARKER for name, _ in offer.files):
        return f"{checkpoint_layout.COMMIT_MARKER} is written by the receiver"
    return None


def _replica_problem(target: Path, step: int, config: _Config) -> str | None:
    """Why the received files are not a whole snapshot of this job's ``step``."""
    problem = checkpoint_layout.size_problem(target)
    if problem is not None:
        return f"torn: {problem}"
    manifest = json.loads((target / checkpoint_layout.MANIFEST).read_text())
    if manifest.get("job_id") != config.job_id:
        return "its manifest names another job"
    if manifest.get("generation") != config.generation:
        return "its manifest names another generation"
    if manifest.get("step", step) != step:
        return "its manifest names another step"
    return None


def prune(root: Path, slot: int, step: int, keep: int, generation: int | None = None) -> list[Path]:
    """After slot ``slot``'s replica of ``step`` committed (pushed by ``generation``):
    keep that slot's newest ``keep`` committed replicas up to ``step``, and every one
    above it (only an older generation wrote those; the search's timeline rule judges
    them, a push never deletes them); delete the older ones of the slot, leftovers of
    failed copies, and other slots' replicas that an older generation pushed (a slot
    this node no longer buddies). Marker first; no symlink followed."""
    replicas = root / memory_tier.REPLICAS_DIR
    deleted: list[Path] = []
    if replicas.is_symlink() or not replicas.is_dir():
        return deleted
    for slot_dir in replicas.iterdir():
        if slot_dir.is_symlink() or not slot_dir.is_dir():
            continue
        mine = slot_dir.name == f"slot-{slot}"
        committed = checkpoint_layout.committed_steps(slot_dir)
        kept = {path for s, path in committed if s <= step}
        kept = set(sorted(kept)[-keep:]) | {path for s, path in committed if s > step}
        for child in slot_dir.iterdir():
            if checkpoint_layout.parse_step_dir(child.name) is None:
                continue
            if mine and child in kept:
                continue
            if not mine and not _older_generation(child, generation):
                continue
            _remove(child)
            deleted.append(child)
    return deleted


def _older_generation(snapshot: Path, generation: int | None) -> bool:
    """Whether a committed replica was pushed by a generation before ``generation``
    (unknown: treated as older only when there is a generation to compare with)."""
    if generation is None:
        return True
    try:
        written = json.loads((snapshot / checkpoint_layout.MANIFEST).read_text()).get("generation")
    except (OSError, ValueError, AttributeError):
        return True
    return not isinstance(written, int) or written < generation


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


def _addresses_of(host: str) -> set[str]:
    with contextlib.suppress(OSError):
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    return set()


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# --- this process's receiver ----------------------------------------------------------

_receiver: Receiver | None = None
_receiver_lock = threading.Lock()


def ensure_receiver() -> Receiver | None:
    """Run this node's receiver when replicas are on and this rank is its node's
    writer (local rank 0); replace it when the generation (so its key and port)
    changed, as after a rejoin in place, without waiting on the old one's peer. None
    when off, or when it cannot listen (said on stderr: this node then holds no
    replicas, and disk serves its predecessor's loss)."""
    global _receiver
    listen = os.environ.get(environment.MEMORY_REPLICA_LISTEN)
    allowed = os.environ.get(environment.MEMORY_REPLICA_FROM)
    root = memory.directory()
    if not listen or not allowed or root is None or not memory.is_writer():
        stop_receiver()
        return None
    me = identity.info()
    key = _generation_key(me.generation)
    if key is None:
        stop_receiver()
        return None
    config = _Config(listen, allowed, root, me.job_id, me.generation, memory.keep(), key)
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
