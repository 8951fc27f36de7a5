"""Process identity and liveness from /proc, safe against pid reuse and zombies.

A pid alone is not an identity: after a rank dies its pid can be reused, and
killing the reused pid would hit an innocent process. Every pid Lazarus records is
paired with the kernel's start time (field 22 of ``/proc/PID/stat``). Zombies
count as dead: with no reaping init in some containers they linger forever.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    pgrp: int
    start_ticks: int


def read_stat(pid: int) -> ProcStat | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name sits in parentheses and may itself contain spaces or parens.
    fields = raw[raw.rindex(")") + 2 :].split()
    return ProcStat(pid=pid, state=fields[0], pgrp=int(fields[2]), start_ticks=int(fields[19]))


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


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Signal a whole process group; False when it no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True
