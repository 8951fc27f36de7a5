"""The tiny process that owns one rank, so its fate is recorded with no controller alive.

Started by the local launcher as ``python -m activities.nodes.rank_wrapper``. It forks
once and the parent exits at once, so the rank is never a child of the worker:
the worker reaps the short-lived parent and a crash or restart of the worker
cannot touch training. The surviving child starts a new session (its own process
group, which ``stop`` signals as a whole), writes the pid file, runs the rank,
and writes the exit-status file when the rank ends. Standard library only, and
quick to start, because it sits on the path of every (re)launch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lazarus.domain.checkpoint_layout import temp_path_for
from lazarus.domain.memory_tier import environment_on_node


def write_atomic(path: Path, payload: dict[str, object]) -> None:
    tmp = temp_path_for(path)
    with open(tmp, "w") as handle:
        json.dump(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def start_ticks(pid: int) -> int:
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
    """The pid file's payload, written by the wrapper (this process, the session and
    group leader) once its rank runs: start ticks guard both pids against reuse. Shared
    with the Slurm task, which adds the step's id."""
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


def _supervise_rank(rank: int, gen_dir: Path, command: list[str]) -> None:
    log_path = gen_dir / f"rank-{rank}.log"
    # The group gets SIGTERM from ``stop``; the rank handles it, and we must outlive
    # the rank long enough to record how it ended.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    with open(log_path, "ab", buffering=0) as log:
        try:
            child = subprocess.Popen(
                command,
                # The memory tier's paths as they lie on this node, for this user.
                env=environment_on_node(dict(os.environ), os.getuid()),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Restore default dispositions in the rank; SIG_IGN would be inherited.
                preexec_fn=lambda: [
                    signal.signal(s, signal.SIG_DFL)
                    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
                ],
            )
        except OSError as exc:
            log.write(f"lazarus: cannot start {command[0]!r}: {exc}\n".encode())
            write_atomic(
                gen_dir / f"rank-{rank}.exit.json",
                {
                    "rank": rank,
                    "exit_code": 127,
                    "signal": None,
                    "ended_at": time.time(),
                    "error": f"cannot start {command[0]!r}: {exc.strerror or exc}",
                },
            )
            return
    write_atomic(gen_dir / f"rank-{rank}.pid", pid_record(rank, child.pid))
    returncode = child.wait()
    write_atomic(gen_dir / f"rank-{rank}.exit.json", exit_record(rank, returncode, time.time()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--gen-dir", type=Path, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("missing the rank command after --")

    if os.fork() > 0:
        return 0  # the worker reaps this parent; the rank lives on in the child
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        _supervise_rank(args.rank, args.gen_dir, command)
    finally:
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
