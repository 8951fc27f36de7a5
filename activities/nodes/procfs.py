"""Process identity and liveness from /proc, safe against pid reuse and zombies.

A pid alone is not an identity: after a rank dies its pid can be reused, and
killing the reused pid would hit an innocent process. Every pid Lazarus records is
paired with the kernel's start time (field 22 of ``/proc/PID/stat``). Zombies
count as dead: with no reaping init in some containers they linger forever.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    pgrp: int
    start_ticks: int


def read_stat(pid: int) -> ProcStat | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name sits in parentheses and may itself contain spaces or parens.
    fields = raw[raw.rindex(")") + 2 :].split()
    return ProcStat(
        pid=pid,
        state=fields[0],
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        start_ticks=int(fields[19]),
    )


def is_alive(pid: int, expected_start_ticks: int | None = None) -> bool:
    stat = read_stat(pid)
    if stat is None or stat.state in ("Z", "X"):
        return False
    return expected_start_ticks is None or stat.start_ticks == expected_start_ticks


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group."""
    members: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = read_stat(int(entry.name))
        if stat is not None and stat.pgrp == pgid and stat.state not in ("Z", "X"):
            members.append(stat.pid)
    return members


def live_groups(pgids: Iterable[int]) -> dict[int, list[int]]:
    """Live (non-zombie) members of each of these groups that has any, in one /proc
    scan: a stop polls every group it waits on many times a second."""
    wanted = set(pgids)
    found: dict[int, list[int]] = {}
    if not wanted:
        return found
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = read_stat(int(entry.name))
        if stat is not None and stat.pgrp in wanted and stat.state not in ("Z", "X"):
            found.setdefault(stat.pgrp, []).append(stat.pid)
    return found


def owned_group(record: Mapping[str, object]) -> int | None:
    """The process group a rank pid file names, or None when it is not ours to signal.

    A pgid is the wrapper's pid. Linux never reuses it while any member lives, but once
    every member has died a new session leader may get it: a leader whose start ticks
    differ from the recorded ``wrapper_start_ticks`` is someone else's (the shim's
    ``group_is_ours`` makes the same check on remote nodes). Without that field, the
    rank's own pid and start ticks must still match. Our own group is never a target.
    """
    try:
        pgid = int(str(record["pgid"]))
    except (KeyError, ValueError):
        return None
    if pgid <= 1 or pgid == os.getpgrp():
        return None
    leader = read_stat(pgid)
    leads = leader is not None and leader.pgrp == pgid and leader.state not in ("Z", "X")
    wrapper_ticks = _int_or_none(record.get("wrapper_start_ticks"))
    if wrapper_ticks is not None:
        if leads and leader is not None and leader.start_ticks != wrapper_ticks:
            return None
        return pgid
    rank_pid = _int_or_none(record.get("pid"))
    rank_ticks = _int_or_none(record.get("start_ticks"))
    rank = read_stat(rank_pid) if rank_pid is not None else None
    if rank is not None and rank.pgrp == pgid and rank.start_ticks == rank_ticks:
        return pgid
    return None if leads else pgid


def _int_or_none(value: object) -> int | None:
    try:
        return int(str(value)) if value is not None else None
    except ValueError:
        return None


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Signal a whole process group; False when it no longer exists, or when it is not
    ours to signal (EPERM: another user's group got the pgid), which counts as gone:
    retrying cannot change whose it is."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True
