"""Where a run's memory checkpoint tier lives on every node: one function, both floors.

The launcher sets it as ``LAZARUS_MEMORY_CHECKPOINT_DIR`` for every rank, the
checkpoint search lists it on every relaunch node, and the end of a run removes it.
The workflow computes it too (to pass it to the search), so it lives on the domain
floor, free of I/O: a path derived from the job and the run, never looked up.

Per run, not per job: a job started again (a new run) must never resume from an
earlier run's snapshots, which a crashed controller may have left in tmpfs; the disk
tier is where checkpoints survive from one run to the next.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import PurePosixPath

from lazarus.domain import environment

MEMORY_ROOT = "/dev/shm/lazarus"
"""The tier's *logical* root: the same on every node, so one resume path serves
every node, and computable by the workflow, which knows no user ids. Nothing is ever
written there: each node maps it to the private root of the user its ranks run as
(:func:`on_node`), at the last moment, where the files are touched."""
PRIVATE_ROOT_PREFIX = "/dev/shm/lazarus-"
"""``/dev/shm/lazarus-<uid>``: tmpfs, which survives a process's death, not a node's.
One root per user, created 0700 and refused unless its owner is that user: on a
shared node (a Slurm partition, a fleet host) no other user can read a job's model
and optimizer state there, plant a forged snapshot, or swap a directory for a
symlink. ``/dev/shm`` is sticky, so nobody else can rename or remove the root
once it is ours; a user who squats the name only turns the tier off for us (the
rank says why, and disk serves)."""
REPLICAS_DIR = "replicas"
"""Under a run's memory directory: ``replicas/slot-<i>/step-N/``, the snapshots this
node holds for the node in slot ``i`` (its ring predecessor)."""
REPLICA_PORTS = range(20000, 32768)
"""Where replica receivers listen: below Linux's ephemeral range, like the derived
rendezvous ports (:data:`activities.launcher.DERIVED_PORTS`)."""
LEGACY_RUN_KEY = "_"
"""The run key of a job without run directories (``run_root`` is the job directory)."""


def memory_checkpoint_dir(job_id: str, run_root: str | None, root: str = MEMORY_ROOT) -> str:
    """``<root>/<job_id>/<run key>``, the run key being the last part of ``run_root``
    (``<run_dir>/<job_id>/<run_key>``, as in ``LaunchRequest.run_root``); None (the
    legacy layout, generations straight under the job directory) gives ``_``.

    ``job_id`` is a job name (letters, digits, ``._-``), so it is one path component;
    a run key is the workflow's own id, checked here all the same, because the result
    is deleted recursively at the end of a run."""
    run_key = PurePosixPath(run_root).name if run_root is not None else LEGACY_RUN_KEY
    for what, part in (("job id", job_id), ("run key", run_key)):
        if part in ("", ".", "..") or "/" in part or "\x00" in part:
            raise ValueError(f"memory checkpoint dir: {what} {part!r} is not one path component")
    return str(PurePosixPath(root) / job_id / run_key)


def private_root(uid: int) -> str:
    """The memory tier's root for the user ``uid`` on any node."""
    return f"{PRIVATE_ROOT_PREFIX}{uid}"


def on_node(path: str, uid: int) -> str:
    """``path`` under the logical root, as it lies on a node whose ranks run as
    ``uid``; any other path (already mapped, or not the tier's) unchanged."""
    logical = PurePosixPath(path)
    if not logical.is_relative_to(MEMORY_ROOT):
        return path
    return str(PurePosixPath(private_root(uid)) / logical.relative_to(MEMORY_ROOT))


def environment_on_node(env: dict[str, str], uid: int) -> dict[str, str]:
    """A rank's environment with the tier's paths (its directory, and a resume point
    in the tier) mapped by :func:`on_node`: a script that reads them itself, not
    through :mod:`lazarus.rank`, finds the files where they are."""
    mapped = dict(env)
    for name in (environment.MEMORY_CHECKPOINT_DIR, environment.RESUME_FROM):
        if mapped.get(name):
            mapped[name] = on_node(mapped[name], uid)
    return mapped


NODE_DIR_PREFIX = "node-"


def node_memory_dir(memory_dir: str, node: str) -> str:
    """Where one node's snapshots and replicas live: ``<memory_dir>/node-<name>``.
    Nodes that share a machine's tmpfs (local logical nodes, or the Slurm nodes of a
    one-host test cluster) each write, prune and receive under a directory of their
    own, never another's; a rank reads its own node's copy through it. ``node`` is a
    spec node name (letters, digits, ``._-``), checked again here: the result is
    deleted recursively at the end of a run."""
    if node in ("", ".", "..") or "/" in node or "\x00" in node:
        raise ValueError(f"memory tier: node name {node!r} is not one path component")
    return str(PurePosixPath(memory_dir) / f"{NODE_DIR_PREFIX}{node}")


def on_node_dir(path: str, memory_dir: str, node: str) -> str:
    """``path`` (a step or replica under the run's ``memory_dir``, as the search names
    it) as it lies in ``node``'s own directory; any other path unchanged."""
    logical = PurePosixPath(path)
    if not logical.is_relative_to(memory_dir):
        return path
    return str(PurePosixPath(node_memory_dir(memory_dir, node)) / logical.relative_to(memory_dir))


def replica_dir(memory_dir: str, slot: int) -> str:
    """Where a node holds the replicas of the node in ``slot``:
    ``<memory_dir>/replicas/slot-<slot>``."""
    if slot < 0:
        raise ValueError(f"replica slot {slot} must be >= 0")
    return str(PurePosixPath(memory_dir) / REPLICAS_DIR / f"slot-{slot}")


def buddy_slot(slot: int, nodes: int) -> int:
    """The slot that holds ``slot``'s replicas: the next one, in a ring."""
    return (slot + 1) % nodes


def generation_key(secret: str, generation: int) -> bytes:
    """The key the replica pushes of ``generation`` are authenticated with, derived
    from the run's ``secret`` (hex, :data:`~lazarus.domain.environment.MEMORY_REPLICA_SECRET`):
    a fresh key per generation, so a pusher of a generation the job left cannot
    authenticate to the new one's receivers, and a survivor that rejoins derives the
    new key itself. Raises ValueError for a secret that is not hex."""
    return _derive(secret, f"generation/{generation}")


def restore_key(secret: str, step: int, slot: int) -> bytes:
    """The key of one replica restore (``step``, from its holder to the node that
    takes ``slot``): never a live receiver's key, so a restore and a push cannot be
    mistaken for each other; each copy's nonces make a session of its own."""
    return _derive(secret, f"restore/{step}/{slot}")


def keyed_port(key: bytes, slot: int) -> int:
    """Where the node in ``slot`` listens under ``key``: in :data:`REPLICA_PORTS`, and
    not computable without the key (another user on the node cannot squat it ahead
    of time), stable per (key, slot) so a retried launch gives the same one."""
    digest = hmac.new(key, f"port/{slot}".encode(), hashlib.sha256).digest()
    return REPLICA_PORTS[int.from_bytes(digest[:4], "big") % len(REPLICA_PORTS)]


PORT_CANDIDATES = 4
"""Ports a receiver may listen on, in order: the first free one. A user who squats one
(it takes the key to know which) only moves the receiver to the next; the pusher,
which checks each listener's proof of the key before sending, follows it."""


def candidate_ports(key: bytes, first: int) -> list[int]:
    """``first`` (from :func:`keyed_port`) and the alternates both ends derive from it."""
    ports = [first]
    for attempt in range(1, PORT_CANDIDATES):
        digest = hmac.new(key, f"port/{first}/{attempt}".encode(), hashlib.sha256).digest()
        ports.append(REPLICA_PORTS[int.from_bytes(digest[:4], "big") % len(REPLICA_PORTS)])
    return ports


def _derive(secret: str, label: str) -> bytes:
    return hmac.new(bytes.fromhex(secret), label.encode(), hashlib.sha256).digest()


def replica_environment(
    secret: str, generation: int, hosts: list[str], slot: int
) -> dict[str, str]:
    """The replica variables of the ranks of the node in ``slot`` (``hosts`` in slot
    order): where it listens, where it pushes, whom it accepts, and the run's secret
    their keys and ports derive from. Empty for one node: a replica on the node it
    protects protects nothing."""
    count = len(hosts)
    if count < 2:
        return {}
    key = generation_key(secret, generation)
    to = buddy_slot(slot, count)
    origin = (slot - 1) % count
    return {
        environment.MEMORY_REPLICA_LISTEN: address(hosts[slot], keyed_port(key, slot)),
        environment.MEMORY_REPLICA_TO: address(hosts[to], keyed_port(key, to)),
        environment.MEMORY_REPLICA_FROM: hosts[origin],
        environment.MEMORY_REPLICA_SECRET: secret,
    }


def address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
