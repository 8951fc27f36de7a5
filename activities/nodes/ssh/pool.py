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

    def park(self, key: str, client: paramiko.SSHClient, jumps: list[paramiko.SSHClient]) -> None:
        """Keep ``client`` for the next agent with ``key``; closed after :attr:`idle_s`."""
        parked = _Parked(client, jumps)
        timer = threading.Timer(self.idle_s, self._expire, args=(key, parked))
        timer.daemon = True
        parked.timer = timer
        with self._lock:
            self._parked.setdefault(key, []).append(parked)
        timer.start()

    def _expire(self, key: str, parked: _Parked) -> None:
        with self._lock:
            stack = self._parked.get(key, [])
            if parked not in stack:
                return  # taken meanwhile
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
