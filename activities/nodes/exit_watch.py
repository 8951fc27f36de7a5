"""Exit notices for processes that are not our children: pidfds.

A rank is never a child of the worker (it runs under its wrapper, in its own process
group), so the worker cannot ``waitpid`` for it, and polling ``/proc`` notices a death
only at the next supervision round: up to ``poll_interval_s`` late. A pidfd
(``pidfd_open``, Linux 5.3) needs no parenthood: it becomes readable the moment the
whole process has exited, so the supervisor sleeps on the pidfds of every rank and of
every rank's recorder (the wrapper or zygote standby that writes its exit record and
exits right after) and polls at once when one fires.

Watching never signals anything. A pidfd is bound to one process, not to a pid
number: it is opened, then the start ticks are checked, so a pid reused since the pid
file was written is never watched in the rank's name. Where pidfds are unavailable
(an older kernel, a seccomp filter) :meth:`ExitWatch.fds` stays empty and supervision
falls back to its rounds.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

from activities.nodes.procfs import read_stat

Identity = tuple[int, int]
"""(pid, start ticks): one process, never another one that got its pid later."""


class ExitWatch:
    """Pidfds of the processes an agent polled; thread-safe (polls of several nodes
    run in threads while the event loop waits on the descriptors)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fds: dict[Identity, int] = {}
        self._ended: set[Identity] = set()
        """Fired and closed: never opened again (a zombie's pidfd stays readable)."""
        self._closed = False
        self._unsupported = not hasattr(os, "pidfd_open")

    def track(self, processes: Iterable[Identity]) -> None:
        """Watch these processes (those already watched or ended cost nothing). A
        process that is gone, or whose start ticks differ (its pid was reused), is
        skipped: the poll that named it already reports it dead."""
        for identity in processes:
            with self._lock:
                if (
                    self._closed
                    or self._unsupported
                    or identity in self._fds
                    or identity in self._ended
                ):
                    continue
            fd = self._open(identity)
            if fd is None:
                continue
            with self._lock:
                if self._closed or identity in self._fds:
                    os.close(fd)
                else:
                    self._fds[identity] = fd

    def _open(self, identity: Identity) -> int | None:
        pid, ticks = identity
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return None
        except OSError:  # ENOSYS, EPERM under seccomp: no notices on this machine
            self._unsupported = True
            return None
        # Checked after opening: the descriptor pins the process it names, so a match
        # now proves it is the one the pid file recorded.
        stat = read_stat(pid)
        if stat is None or stat.start_ticks != ticks:
            os.close(fd)
            return None
        return fd

    def fds(self) -> list[int]:
        """The descriptors to wait on: each becomes readable when its process ends."""
        with self._lock:
            return list(self._fds.values())

    def ended(self, fds: Iterable[int]) -> None:
        """These descriptors fired: close them, and never watch their processes again
        (a pidfd stays readable, so waiting on it again would never sleep). Call it
        only from the thread that waits on :meth:`fds`, after it stopped waiting."""
        fired = set(fds)
        with self._lock:
            for identity, fd in list(self._fds.items()):
                if fd in fired:
                    del self._fds[identity]
                    self._ended.add(identity)
                    os.close(fd)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)


def recorded_processes(record: dict[str, object]) -> list[Identity]:
    """The rank and its recorder from a pid file (``rank_wrapper.pid_record``): every
    identity it proves (a field missing or malformed is skipped)."""
    found: list[Identity] = []
    for pid_key, ticks_key in (("pid", "start_ticks"), ("wrapper_pid", "wrapper_start_ticks")):
        try:
            pid, ticks = int(str(record[pid_key])), int(str(record[ticks_key]))
        except (KeyError, ValueError):
            continue
        if pid > 1:
            found.append((pid, ticks))
    return found
