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
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lazarus.domain.memory_tier import environment_on_node
from lazarus.rank.node_files import exit_record, pid_record, start_ticks, write_atomic

__all__ = ["exit_record", "main", "pid_record", "start_ticks", "write_atomic"]


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
