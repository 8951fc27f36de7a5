"""The files a rank's keeper writes about it on its node: the pid record once the
rank runs, the exit record when it ends. Standard library only: the Slurm task
(:mod:`lazarus.rank.slurm_task`) runs under a node's own interpreter with only
``lazarus-rank`` installed, and the controller's rank wrapper and zygote
(``activities.nodes``) write the same records with these functions."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from lazarus.domain.checkpoint_layout import temp_path_for


def write_atomic(path: Path, payload: dict[str, object]) -> None:
    """``payload`` as JSON at ``path``, renamed into place (readers poll it)."""
    tmp = temp_path_for(path)
    with open(tmp, "w") as handle:
        json.dump(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def start_ticks(pid: int) -> int:
    """The process's start time in clock ticks (``/proc/PID/stat`` field 22): with the
    pid, what tells a process from a later one that reused its pid."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rindex(")") + 2 :].split()[19])


def exit_record(rank: int, returncode: int, ended_at: float) -> dict[str, object]:
    """The exit-status file's payload; ``returncode`` as Popen gives it (negative: the
    signal that killed the rank). Shared with the zygote, whose ranks end the same way."""
    sig_name = None
    if returncode < 0:
        try:
            sig_name = signal.Signals(-returncode).name
        except ValueError:
            sig_name = f"SIG{-returncode}"
    return {"rank": rank, "exit_code": returncode, "signal": sig_name, "ended_at": ended_at}


def pid_record(rank: int, child_pid: int) -> dict[str, object]:
    """The pid file's payload, written by the rank's keeper (this process, the session
    and group leader) once its rank runs: start ticks guard both pids against reuse.
    The Slurm task adds the step's id."""
    me = os.getpid()
    return {
        "rank": rank,
        "wrapper_pid": me,
        "pgid": os.getpgid(0),
        "wrapper_start_ticks": start_ticks(me),
        "pid": child_pid,
        "start_ticks": start_ticks(child_pid),
        "started_at": time.time(),
    }
