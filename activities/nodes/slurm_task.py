"""The controller's side of a Slurm generation, and the task's entry point kept for
steps started before it moved.

``srun`` (on the controller's machine): starts the ``srun`` client of one node's
step of the generation detached. It forks, the parent exits at once (the worker
reaps it), and the child starts a new session, writes ``slurm-srun-<node>.pid``,
runs ``srun`` with its output in ``slurm-srun-<node>.log`` and records its exit in
``slurm-srun-<node>.exit.json``. So the step's client is never a child of the
worker: a worker crash or restart does not touch it.

``task`` runs on the compute node: it is :mod:`lazarus.rank.slurm_task`, part of
``lazarus-rank``, which the agent starts with the node's own interpreter (this role
only forwards to it). ``local-stop`` stops a node's ranks forked from its zygote
(warm starts, which need the controller's package on the node).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from activities.nodes.rundir import SrunFiles
from lazarus.rank.node_files import start_ticks, write_atomic
from lazarus.rank.slurm_task import (
    SLURM_TASK_VARIABLES,
    add_task_arguments,
    rank_slot,
    run_task,
    slurm_identity,
)

__all__ = ["SLURM_TASK_VARIABLES", "main", "rank_slot", "slurm_identity"]


def _run_srun(gen_dir: Path, node: str, command: list[str]) -> None:
    files = SrunFiles.of(node)
    with open(gen_dir / files.log, "ab", buffering=0) as log:
        try:
            child = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        except OSError as exc:
            log.write(f"lazarus: cannot start {command[0]!r}: {exc}\n".encode())
            write_atomic(
                gen_dir / files.exit, {"exit_code": 127, "ended_at": time.time(), "error": str(exc)}
            )
            return
    write_atomic(
        gen_dir / files.pid,
        {"pid": child.pid, "start_ticks": start_ticks(child.pid), "started_at": time.time()},
    )
    returncode = child.wait()
    write_atomic(gen_dir / files.exit, {"exit_code": returncode, "ended_at": time.time()})


def _local_stop(args: argparse.Namespace) -> int:
    """On the node (``srun -w <node>``): stop ``--node``'s ranks forked from its zygote,
    as a local node's agent stops its ranks (process groups, start ticks checked, only
    that node's ranks), and print the result as one JSON line. Their cgroup is the
    zygote's step: cancelling that step would kill the zygote too."""
    from activities.nodes.fencing import stop_ranks
    from activities.nodes.rundir import generations_below

    result = stop_ranks(
        generations_below(Path(args.run_root), args.keep),
        grace_s=args.grace,
        kill_wait_s=args.kill_wait,
        reporter=args.node,
        node=args.node,
    )
    print(result.model_dump_json(), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="role", required=True)
    srun = sub.add_parser("srun", help="start the step's srun client detached")
    srun.add_argument("--gen-dir", type=Path, required=True)
    srun.add_argument("--node", required=True, help="the node whose step this srun runs")
    srun.add_argument("command", nargs=argparse.REMAINDER)
    add_task_arguments(sub.add_parser("task", help="run one rank under srun"))
    stop = sub.add_parser("local-stop", help="stop this node's forked ranks (JSON on stdout)")
    stop.add_argument("--run-root", required=True)
    stop.add_argument("--node", required=True)
    stop.add_argument("--keep", type=int)
    stop.add_argument("--grace", type=float, required=True)
    stop.add_argument("--kill-wait", type=float, required=True)
    args = parser.parse_args(argv)
    if args.role == "local-stop":
        return _local_stop(args)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("missing the command after --")
    if args.role == "task":
        return run_task(args, command)
    if os.fork() > 0:
        return 0  # the worker reaps this parent; srun lives on in the child
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        _run_srun(args.gen_dir, args.node, command)
    finally:
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
