"""How the bench starts and watches the peers' jobs, from outside, as it does torchrun's.

:class:`NvrxLauncherJob`: ``ft_launcher`` is :class:`bench.torchrun.TorchrunJob` with
another command line and NVRx's log lines counted as detection. :class:`MemberJob`:
the peers that are not one agent (NVRx in-process, torchft): each member's output read
and timestamped by a thread, every process it ever started remembered (a fault goes to
the chosen rank; everything is killed at the end), its lines labelled with the member
and its own generation (the times it printed its ``up`` line).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from activities.nodes.procfs import is_alive, read_stat
from bench.jobs import REPO
from bench.measure import STEP_LINE
from bench.peers.settings import NvrxSettings
from bench.torchrun import (
    RESUMED_LINE,
    Line,
    ProcessWatch,
    TorchrunJob,
    _children,
    job_env,
    process_environ,
)

NVRX_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ \[(INFO|WARNING|ERROR)\]")
"""NVRx's own log prefix (``2026-12-04 02:39:22,638 [INFO] ...``)."""
NVRX_DETECTION = re.compile(
    r"UNHEALTHY|heartbeat timeout|[Hh]eartbeat.*(timed out|missing)|will restart worker group"
)
DISCARDED_LINE = re.compile(r"^discarded step (\d+)")


class NvrxLauncherJob(TorchrunJob):
    """The example under ``ft_launcher`` (:class:`NvrxSettings`); the script is
    :mod:`bench.peers.nvrx_train` (the example plus NVRx heartbeats)."""

    DETECTIONS = (*TorchrunJob.DETECTIONS, (NVRX_LINE, NVRX_DETECTION))
    """torch's own glog lines (a worker failed) or NVRx's (a heartbeat missed)."""

    def __init__(self, *args: object, settings: NvrxSettings, **kwargs: object) -> None:
        self.settings = settings
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def command(self, local_addr: str | None = None, is_host: bool = False) -> list[str]:
        base = super().command(local_addr, is_host)
        # python -m torch.distributed.run ... -> python -m <ft_launcher> ... --ft-*
        launcher = [base[0], "-m", "nvidia_resiliency_ext.fault_tolerance.launcher"]
        flags = base[3 : len(base) - len(self.example_args)]
        script = [str(REPO / "bench" / "peers" / "nvrx_train.py"), *self.example_args[1:]]
        return [*launcher, *flags, *self.settings.launcher_flags(), *script]


@dataclass(frozen=True)
class Member:
    """One process the bench starts for a peer's job."""

    name: str
    argv: list[str]
    env: dict[str, str]
    up_line: re.Pattern[str] | None = None
    """A line this member prints as each of its generations starts; with a group
    ``gen``, the generation is that number + 1 (NVRx's restart iteration, the same
    in every process), else a count of the lines (a torchft group's restarts)."""
    rank_is_child: bool = False
    """The rank is a child of this process (under torchrun), not the process itself."""


@dataclass(frozen=True)
class MemberPoint:
    t: float
    member: str
    generation: int
    """The member's own: 1 + how many times it printed ``up_line`` before, at least 1."""
    step: int
    committed: bool = True
    """False: a ``discarded step`` line (torchft did not commit it)."""


@dataclass
class Seen:
    pid: int
    start_ticks: int
    member: str
    seen_at: float
    env_rank: int | None

    @property
    def alive(self) -> bool:
        return is_alive(self.pid, self.start_ticks)


@dataclass
class MemberJob(ProcessWatch):
    """Several processes making one job (:class:`Member`), watched from outside."""

    members: list[Member]
    log_path: Path
    started_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self._watch_init()
        self.points: list[MemberPoint] = []
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.seen: list[Seen] = []
        self.generations: dict[str, int] = {}
        self.ups: list[tuple[float, str, int]] = []
        """(when, member, its new generation): each ``up_line`` seen."""
        self.resumed_from: dict[int, int] = {}
        """Generation -> the step its ranks said they resumed from."""

    def start(self) -> None:
        self._open_log()
        self.started_at = time.time()
        for member in self.members:
            self.start_member(member)

    def start_member(self, member: Member) -> subprocess.Popen[bytes]:
        proc = self._popen(member.argv, job_env(member.env))
        self.procs[member.name] = proc
        stat = read_stat(proc.pid)
        with self._lock:
            self.seen.append(
                Seen(proc.pid, stat.start_ticks if stat else 0, member.name, time.time(), None)
            )
        self._thread(self._read_loop, f"peer-read-{member.name}", proc, member.name)
        return proc

    def _on_line(self, line: Line) -> None:
        member = next(m for m in self.members if m.name == line.label)
        up = member.up_line.search(line.text) if member.up_line is not None else None
        if up is not None:
            counted = self.generations.get(member.name, 0) + 1
            named = up.groupdict().get("gen")
            self.generations[member.name] = int(named) + 1 if named else counted
            self.ups.append((line.t, member.name, self.generations[member.name]))
        generation = max(1, self.generations.get(member.name, 1))
        if match := RESUMED_LINE.match(line.text):
            self.resumed_from.setdefault(generation, int(match[1]))
        elif match := STEP_LINE.match(line.text):
            self.points.append(MemberPoint(line.t, member.name, generation, int(match[1])))
        elif match := DISCARDED_LINE.match(line.text):
            self.points.append(
                MemberPoint(line.t, member.name, generation, int(match[1]), committed=False)
            )

    def _poll_once(self) -> None:
        """Remember every descendant of every member (ranks, monitors, helpers)."""
        now = time.time()
        with self._lock:
            known = {s.pid: s for s in self.seen}
            roots = [(s.pid, s.member) for s in self.seen if s.alive]
        frontier = roots
        while frontier:
            nxt: list[tuple[int, str]] = []
            for pid, member in frontier:
                for child in _children(pid):
                    if child in known:
                        continue
                    stat = read_stat(child)
                    if stat is None:
                        continue
                    env_rank = _env_rank(child)
                    entry = Seen(child, stat.start_ticks, member, now, env_rank)
                    known[child] = entry
                    with self._lock:
                        self.seen.append(entry)
                    nxt.append((child, member))
            frontier = nxt

    def _started(self) -> list[subprocess.Popen[bytes]]:
        return list(self.procs.values())

    def _seen(self) -> dict[int, int]:
        return {s.pid: s.start_ticks for s in self.seen}

    # ------------------------------------------------------------------ control

    def rank_process(self, member: str) -> Seen:
        """The process holding ``member``'s rank: the member itself, or (``rank_is_child``,
        under torchrun) its newest live child with ``RANK`` in its environment."""
        self._poll_once()
        spec = next(m for m in self.members if m.name == member)
        root = self.procs[member].pid
        with self._lock:
            mine = [s for s in self.seen if s.member == member and s.alive]
        if spec.rank_is_child:
            for entry in mine:
                if entry.env_rank is None:
                    # First seen between fork and exec, with its parent's environment.
                    entry.env_rank = _env_rank(entry.pid)
            ranks = [s for s in mine if s.env_rank is not None and s.pid != root]
            chosen = max(ranks, key=lambda s: s.seen_at) if ranks else None
        else:
            chosen = next((s for s in mine if s.pid == root), None)
        if chosen is None:
            raise LookupError(f"{member}: no live rank process")
        return chosen

    def generation(self, member: str) -> int:
        with self._lock:
            return max(1, self.generations.get(member, 1))

    def signal_member(self, member: str, sig: signal.Signals) -> Seen:
        target = self.rank_process(member)
        os.kill(target.pid, sig)
        return target

    def exited(self, names: list[str]) -> bool:
        return all(self.procs[name].poll() is not None for name in names)

    def returncode(self, name: str) -> int | None:
        return self.procs[name].poll()

    def restart(self, members: list[Member]) -> None:
        """What the soak's operator does: SIGKILL every process ever seen and start
        ``members`` afresh (fresh ports), watched by the same threads; each member's
        generation count goes on."""
        self.kill_processes()
        self.members = members
        for member in members:
            self.start_member(member)

    # ------------------------------------------------------------------ observation

    def snapshot(self) -> list[MemberPoint]:
        with self._lock:
            return list(self.points)

    def max_step(self, before: float | None = None) -> int | None:
        steps = [
            p.step for p in self.snapshot() if p.committed and (before is None or p.t <= before)
        ]
        return max(steps, default=None)

    def last_line(self, pattern: re.Pattern[str]) -> str | None:
        """The last line any member printed that matches ``pattern``."""
        with self._lock:
            lines = list(self.lines)
        return next((ln.text for ln in reversed(lines) if pattern.search(ln.text)), None)


def _env_rank(pid: int) -> int | None:
    """The ``RANK`` a process was started with, if any."""
    rank = (process_environ(pid) or {}).get("RANK", "")
    return int(rank) if rank.isdigit() else None
