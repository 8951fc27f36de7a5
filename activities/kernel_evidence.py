"""The kernel's own word on whether a SIGKILLed rank ran out of memory.

A SIGKILL carries no sender: the OOM killer, a cgroup limit, an operator's
``kill -9`` and a scheduler's watchdog all look the same from the exit status.
Calling every bare SIGKILL ``oom_host`` made a playbook such as
``oom_host: {ladder: [escalate]}`` page a person for each ``kill -9``. Only the
kernel knows, and it leaves two traces:

* the ``oom_kill`` counter in the cgroup v2 ``memory.events`` of the rank's cgroup
  (hierarchical, counted against the victim's cgroup whatever limit was hit), or in
  ``memory.oom_control`` on a cgroup v1 memory hierarchy. The supervisor records it
  when it first sees the rank alive and compares at exit;
* the kernel log (``/dev/kmsg``, else ``dmesg``): "Out of memory: Killed process PID"
  or "oom-kill:... pid=PID". Often unreadable to unprivileged users
  (``kernel.dmesg_restrict``), so it is best effort and read with a byte bound.

Only ranks on the controller's own machine (the local launcher) can be looked at:
``/proc`` and the cgroup tree of a remote node are not visible from here.

Every path is injectable (:class:`KernelSources`) so tests use fake files.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

KMSG_MAX_BYTES = 4 << 20
"""The kernel ring buffer is 128 KiB to a few MiB; never read more than this."""

DMESG_TIMEOUT_S = 2.0

CLOCK_SLACK_S = 1.0
"""The kernel log's clock and a process's start time are both "since boot" but are
kept by different kernel clocks; records this much older than the start still count."""

_MAX_READS = 100_000

_KILLED_PID = re.compile(r"Killed process (\d+)\b|\boom-kill:.*?\bpid=(\d+)\b")
_DMESG_TIME = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\]\s?")


@dataclass(frozen=True)
class KernelSources:
    """Where the kernel's records are read from (real paths by default)."""

    proc_root: Path = Path("/proc")
    cgroup_root: Path = Path("/sys/fs/cgroup")
    kmsg_path: Path | None = Path("/dev/kmsg")
    dmesg_command: tuple[str, ...] | None = ("dmesg",)
    """Run when ``kmsg_path`` cannot be read; None: never run anything."""
    max_bytes: int = KMSG_MAX_BYTES
    clock_ticks: int = field(default_factory=lambda: os.sysconf("SC_CLK_TCK"))


@dataclass(frozen=True)
class _Baseline:
    pid: int
    counter: Path
    """The file holding the ``oom_kill`` counter of the rank's memory cgroup."""
    oom_kills: int
    started_s: float | None
    """The process's start, in seconds since boot (the kernel log's clock)."""


def oom_counter(pid: int, sources: KernelSources) -> Path | None:
    """The file with the ``oom_kill`` counter of a live process's memory cgroup:
    ``memory.events`` of its cgroup v2 (``0::/path`` in /proc/PID/cgroup; mounted at
    the cgroup root, or under ``unified/`` on a hybrid host), else ``memory.oom_control``
    of its cgroup v1 memory hierarchy. None when neither can be read."""
    try:
        text = (sources.proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    candidates: list[Path] = []
    for line in text.splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        relative = path.strip().lstrip("/")
        if line.startswith("0::"):
            candidates.insert(0, sources.cgroup_root / relative / "memory.events")
            candidates.insert(1, sources.cgroup_root / "unified" / relative / "memory.events")
        elif "memory" in controllers.split(","):
            candidates.append(sources.cgroup_root / "memory" / relative / "memory.oom_control")
    return next((c for c in candidates if oom_kill_count(c) is not None), None)


def oom_kill_count(counter: Path) -> int | None:
    """The ``oom_kill`` line of ``memory.events`` / ``memory.oom_control``, or None."""
    try:
        text = counter.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def _started_s(pid: int, sources: KernelSources) -> float | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot), in seconds."""
    try:
        raw = (sources.proc_root / str(pid) / "stat").read_text()
        ticks = int(raw[raw.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    return ticks / sources.clock_ticks


def _read_kmsg(path: Path, max_bytes: int) -> list[tuple[float | None, str]] | None:
    """(seconds since boot, message) records, or None when the file cannot be read.

    ``/dev/kmsg`` returns one record per read and EAGAIN at the end (opened
    non-blocking); a plain file (tests) returns many lines per read and then EOF.
    EPIPE means a record was overwritten while reading: skip on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    chunks: list[bytes] = []
    total = 0
    try:
        for _ in range(_MAX_READS):
            if total >= max_bytes:
                break
            try:
                chunk = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue
                if exc.errno == errno.EAGAIN:
                    break
                return None if not chunks else _parse_kmsg(b"".join(chunks))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    return _parse_kmsg(b"".join(chunks))


def _parse_kmsg(data: bytes) -> list[tuple[float | None, str]]:
    records: list[tuple[float | None, str]] = []
    for line in data.decode(errors="replace").splitlines():
        head, sep, message = line.partition(";")
        if not sep or line.startswith(" "):
            continue  # a continuation line (KEY=value) or not a record
        fields = head.split(",")
        at: float | None = None
        if len(fields) >= 3 and fields[2].isdigit():
            at = int(fields[2]) / 1e6
        records.append((at, message))
    return records


def _read_dmesg(command: tuple[str, ...], max_bytes: int) -> list[tuple[float | None, str]]:
    try:
        done = subprocess.run(
            list(command),
            capture_output=True,
            timeout=DMESG_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode != 0:
        return []
    records: list[tuple[float | None, str]] = []
    for line in done.stdout[-max_bytes:].decode(errors="replace").splitlines():
        match = _DMESG_TIME.match(line)
        if match is None:
            records.append((None, line))
        else:
            records.append((float(match.group(1)), line[match.end() :]))
    return records


def kernel_log_line(pid: int, sources: KernelSources, since_s: float | None = None) -> str | None:
    """The newest kernel log line that says the OOM killer killed ``pid``.

    Records older than ``since_s`` (seconds since boot: the process's start) are
    about an earlier process that had the same pid, and are ignored."""
    records = None
    if sources.kmsg_path is not None:
        records = _read_kmsg(sources.kmsg_path, sources.max_bytes)
    if records is None and sources.dmesg_command:
        records = _read_dmesg(sources.dmesg_command, sources.max_bytes)
    for at, message in reversed(records or []):
        if since_s is not None and at is not None and at < since_s - CLOCK_SLACK_S:
            break
        for match in _KILLED_PID.finditer(message):
            if int(match.group(1) or match.group(2)) == pid:
                return message.strip()[:300]
    return None


class OomWatch:
    """Per rank, the cgroup OOM-kill counter as it was when supervision first saw the
    rank alive; at the rank's death, :meth:`evidence` says what changed."""

    def __init__(self, sources: KernelSources | None = None) -> None:
        self._sources = sources or KernelSources()
        self._baselines: dict[int, _Baseline] = {}
        self._watched: dict[int, int] = {}
        """rank -> the pid last looked at (also when its cgroup was unreadable)."""

    def watch(self, rank: int, pid: int) -> None:
        """Record the baseline of a live rank, once per pid: called on every poll."""
        if self._watched.get(rank) == pid:
            return
        self._watched[rank] = pid
        self._baselines.pop(rank, None)
        counter = oom_counter(pid, self._sources)
        count = oom_kill_count(counter) if counter is not None else None
        if counter is None or count is None:
            return
        self._baselines[rank] = _Baseline(pid, counter, count, _started_s(pid, self._sources))

    def evidence(self, rank: int, pid: int) -> list[str]:
        """Lines proving an OOM kill of this rank, or [] when the kernel says nothing."""
        found: list[str] = []
        baseline = self._baselines.get(rank)
        if baseline is not None and baseline.pid == pid:
            now = oom_kill_count(baseline.counter)
            if now is not None and now > baseline.oom_kills:
                found.append(
                    f"{baseline.counter}: oom_kill rose from {baseline.oom_kills} to {now} "
                    f"while rank {rank} (pid {pid}) ran"
                )
        since = baseline.started_s if baseline is not None and baseline.pid == pid else None
        line = kernel_log_line(pid, self._sources, since)
        if line is not None:
            found.append(f"kernel log: {line}")
        return found
