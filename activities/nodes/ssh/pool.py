"""Idle ssh connections a worker keeps between activities, so a recovery's activities
do not each pay a key exchange and a login.

An :class:`~activities.nodes.ssh.agent.SSHAgent` lives for one activity. Before this
pool, each one logged in afresh: a rank crash's recovery runs the checkpoint search,
the launch (its carry and its start) and the next supervision back to back, each on
the same nodes, each with its own handshake (0.15 to 0.2 s measured on the loaded
test hosts, more through a jump host). Now an agent that closes with a healthy
connection parks it here, and the next agent for the same node and the same ssh
settings takes it.

What is parked, and for how long:

- only a connection whose last command answered: one that timed out (a silent
  host, a partition) is closed, never handed to the next activity, which would
  otherwise wait on it for its connect timeout before learning what a fresh
  connect tells it at once;
- for at most :data:`IDLE_S`; then it is closed by a timer, so a worker keeps no
  connection to a node it stopped using (a drained or returned node);
- except one per node while an agent of the same login holds a connection (a
  supervision does, for a whole generation): a crash comes hours after the last
  login, and its recovery's search and preflight then run at once, one connection
  each. The supervision's own is parked as it ends, and the spare is the second:
  neither waits for a login (two fresh logins were 0.18 s of a 0.33 s search at 256
  MiB, in a crash measured on the quiet test hosts). SSH keepalives every
  :data:`KEEPALIVE_S` keep the spare, and any firewall state on its way, alive;
- keyed by every field of the node and the job's ssh settings: a connection is
  only reused for exactly the login (host, port, user, identity, jump hosts, host
  key file) that opened it, so nothing is shared that a fresh login would not give.

A taken connection is checked (its transport still active) and a dead one dropped;
a connection that died while parked fails its next command as a fresh one would,
and the agent reconnects once as it always did.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import paramiko

IDLE_S = 30.0
"""How long an idle connection is kept: longer than the gap between a recovery's
activities (well under a second) and a supervision's restart, short enough that
idle logins do not pile up on nodes."""
SPARES_WHILE_IN_USE = 1
"""Idle connections kept past :data:`IDLE_S` per login while an agent holds another."""
KEEPALIVE_S = 30
"""The SSH keepalive interval of a parked connection."""


@dataclass
class _Parked:
    client: paramiko.SSHClient
    jumps: list[paramiko.SSHClient]
    timer: threading.Timer | None = field(default=None)


def _close(parked: _Parked) -> None:
    parked.client.close()
    for jump in reversed(parked.jumps):
        jump.close()


class ConnectionPool:
    """Connections parked by key, each closed :data:`IDLE_S` after it was parked
    unless taken again first."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._parked: dict[str, list[_Parked]] = {}
        self._held: dict[str, set[int]] = {}
        """Per login, the connections live agents hold (by ``id``)."""

    def take(self, key: str) -> tuple[paramiko.SSHClient, list[paramiko.SSHClient]] | None:
        """A parked live connection for ``key`` (and its jump hosts' connections), or None."""
        while True:
            with self._lock:
                stack = self._parked.get(key)
                if not stack:
                    return None
                parked = stack.pop()
                if not stack:
                    del self._parked[key]
            if parked.timer is not None:
                parked.timer.cancel()
            transport = parked.client.get_transport()
            if transport is not None and transport.is_active():
                return parked.client, parked.jumps
            _close(parked)

    def hold(self, key: str, client: paramiko.SSHClient) -> None:
        """An agent now uses ``client`` (taken or freshly opened) for ``key``."""
        with self._lock:
            self._held.setdefault(key, set()).add(id(client))

    def release(self, key: str, client: paramiko.SSHClient) -> None:
        """The agent is done with ``client`` (parked or closed); idempotent."""
        with self._lock:
            held = self._held.get(key, set())
            held.discard(id(client))
            if not held:
                self._held.pop(key, None)

    def park(self, key: str, client: paramiko.SSHClient, jumps: list[paramiko.SSHClient]) -> None:
        """Keep ``client`` for the next agent with ``key``; closed after :attr:`idle_s`
        (unless it is the spare of a login in use)."""
        self.release(key, client)
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(KEEPALIVE_S)
        parked = _Parked(client, jumps)
        with self._lock:
            self._parked.setdefault(key, []).append(parked)
            self._arm(key, parked)

    def _arm(self, key: str, parked: _Parked) -> None:
        """Start ``parked``'s idle timer (under the lock)."""
        timer = threading.Timer(self.idle_s, self._expire, args=(key, parked))
        timer.daemon = True
        parked.timer = timer
        timer.start()

    def _expire(self, key: str, parked: _Parked) -> None:
        with self._lock:
            stack = self._parked.get(key, [])
            if parked not in stack:
                return  # taken meanwhile
            if self._held.get(key) and stack.index(parked) < SPARES_WHILE_IN_USE:
                self._arm(key, parked)  # the spare of a login in use
                return
            stack.remove(parked)
            if not stack:
                del self._parked[key]
        _close(parked)

    def close_all(self) -> None:
        """Close every parked connection (tests; a worker's shutdown)."""
        with self._lock:
            everything = [p for stack in self._parked.values() for p in stack]
            self._parked.clear()
        for parked in everything:
            if parked.timer is not None:
                parked.timer.cancel()
            _close(parked)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(stack) for stack in self._parked.values())


POOL = ConnectionPool()
"""This worker's pool: every :class:`SSHAgent` parks and takes here."""
