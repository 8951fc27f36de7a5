"""The Slurm task: one rank of a Slurm generation, on its compute node.

Run by ``srun`` (one step per node, one task per rank) as ``<node python> -m
lazarus.rank.slurm_task task ...``, where ``<node python>`` is the node's own
interpreter (``nodes[].python`` or ``slurm.python``, default ``python3`` on the
ranks' PATH there). Standard library only and part of ``lazarus-rank``: a compute
node needs that helper (which its training scripts import anyway) and nothing of
the controller, neither its packages nor its interpreter's path.

In the foreground, so Slurm tracks it and ``scancel`` signals reach it. It computes
the rank's own variables from the node's slot in the generation's node list
(``SLURMD_NODENAME``) and ``SLURM_LOCALID``: the rank slots follow the plan's node
order, which after a spare took a dead node's slot need not be Slurm's sorted order.
Slurm's own task variables are rewritten to match (:func:`slurm_identity`): each
node's ranks are a step of their own (``-N1``), so Slurm numbers every node's tasks
from 0 (``SLURM_PROCID`` 0..nproc-1, ``SLURM_NODEID`` 0, ``SLURM_NTASKS`` nproc on
every node), and a script that reads them (Lightning's ``SLURMEnvironment``, a
``SLURM_PROCID == 0`` guard around a save) would see as many rank 0s as nodes, and
after a spare swap a numbering that is not ``RANK``'s. It then runs the rank with
its output in the rank's log and writes the same pid and exit files as the local
rank wrapper (:mod:`lazarus.rank.node_files`), plus the step's id
(``slurm_step``). It ignores SIGTERM, SIGINT and SIGHUP so it outlives the rank
long enough to record how the rank ended; only a SIGKILL of the whole step
(``scancel --signal=KILL``) takes it down first, and then the stop that sent it
records the exit instead.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lazarus.domain import environment as env_names
from lazarus.rank.env_file import EnvFileError, read_env_file
from lazarus.rank.node_files import exit_record, pid_record, write_atomic

_TRAPPED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def rank_slot(
    nodes: list[str], node: str, local_id: int, nproc: int, ranks: list[int] | None = None
) -> tuple[int, int]:
    """(rank, group rank) of the task with ``local_id`` on ``node``: the node's index in
    the generation's node order, times ``nproc``, plus its local id. With ``ranks``
    (a step for some of the node's ranks: those its zygote could not fork), the
    task with ``local_id`` runs ``ranks[local_id]``, which must be one of the node's."""
    if node not in nodes:
        raise ValueError(f"node {node!r} is not one of this generation's nodes {nodes}")
    group = nodes.index(node)
    if ranks is not None:
        if not 0 <= local_id < len(ranks):
            raise ValueError(f"SLURM_LOCALID {local_id} is outside the step's ranks {ranks}")
        rank = ranks[local_id]
        if rank // nproc != group:
            raise ValueError(f"rank {rank} is not one of node {node}'s ranks")
        return rank, group
    if not 0 <= local_id < nproc:
        raise ValueError(f"SLURM_LOCALID {local_id} is outside 0..{nproc - 1}")
    return group * nproc + local_id, group


SLURM_TASK_VARIABLES = (
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_NNODES",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_GTIDS",
)
"""The task variables :func:`slurm_identity` sets in a rank's environment, as one
job step over the generation's nodes in rank order would have set them. Left as
Slurm set them: ``SLURM_JOB_*`` (the allocation) and ``SLURM_STEP_*`` (the real
step, this node's: ``scancel``/``sstat`` on ``SLURM_JOB_ID.SLURM_STEP_ID`` reach it)."""


def slurm_identity(rank: int, nproc: int, group: int, nodes: int) -> dict[str, str]:
    """Slurm's task variables for ``rank``, consistent with ``RANK``/``LOCAL_RANK``/
    ``GROUP_RANK`` (:func:`lazarus.domain.environment.rank_identity`) and
    ``WORLD_SIZE``: ``SLURM_PROCID`` is the rank, ``SLURM_LOCALID`` its local rank,
    ``SLURM_NODEID`` its node's slot in the plan, ``SLURM_NTASKS`` the world size."""
    first = group * nproc
    world = nodes * nproc
    return {
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank - first),
        "SLURM_NODEID": str(group),
        "SLURM_NTASKS": str(world),
        "SLURM_NPROCS": str(world),
        "SLURM_NNODES": str(nodes),
        "SLURM_NTASKS_PER_NODE": str(nproc),
        "SLURM_GTIDS": ",".join(str(r) for r in range(first, first + nproc)),
    }


def _cannot_start(exit_path: Path, rank: int, error: str) -> int:
    """Record a rank that never started, as the rank wrapper does (exit 127)."""
    write_atomic(
        exit_path,
        {"rank": rank, "exit_code": 127, "signal": None, "ended_at": time.time(), "error": error},
    )
    return 127


def run_task(args: argparse.Namespace, command: list[str]) -> int:
    """Run one rank in the foreground (this process is the Slurm task) and record it."""
    for sig in _TRAPPED:
        signal.signal(sig, signal.SIG_IGN)
    gen_dir: Path = args.gen_dir
    nodes = args.nodes.split(",")
    node = os.environ.get("SLURMD_NODENAME", "")
    ranks = [int(r) for r in args.ranks.split(",")] if args.ranks else None
    local_id = int(os.environ.get("SLURM_LOCALID", "0"))
    rank, group = rank_slot(nodes, node, local_id, args.nproc, ranks)
    exit_path = gen_dir / f"rank-{rank}.exit.json"
    exit_path.unlink(missing_ok=True)
    env: dict[str, str] = {}
    if args.env_file:
        # Read here, on the node, like the ssh shim: the values never leave it, and
        # they go under everything the launcher set.
        try:
            env.update(read_env_file(args.env_file))
        except EnvFileError as exc:
            return _cannot_start(exit_path, rank, str(exc))
    env.update(os.environ)
    env.update(env_names.rank_identity(rank, args.nproc, group))
    env.update(slurm_identity(rank, args.nproc, group, len(nodes)))
    env.update(
        {
            env_names.NODE: node,
            env_names.HEARTBEAT_FILE: str(gen_dir / f"rank-{rank}.heartbeat.json"),
        }
    )
    step = f"{env.get('SLURM_JOB_ID', '?')}.{env.get('SLURM_STEP_ID', '?')}"
    with open(gen_dir / f"rank-{rank}.log", "ab", buffering=0) as log:
        try:
            child = subprocess.Popen(
                command,
                cwd=args.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in _TRAPPED],
            )
        except OSError as exc:
            log.write(f"lazarus: cannot start {command[0]!r}: {exc}\n".encode())
            return _cannot_start(
                exit_path, rank, f"cannot start {command[0]!r}: {exc.strerror or exc}"
            )
    write_atomic(
        gen_dir / f"rank-{rank}.pid",
        {**pid_record(rank, child.pid), "slurm_step": step, "slurm_node": node},
    )
    returncode = child.wait()
    write_atomic(exit_path, exit_record(rank, returncode, time.time()))
    return returncode if returncode >= 0 else 128 - returncode


def parser() -> argparse.ArgumentParser:
    """``task``'s arguments (the controller's ``activities.nodes.slurm_task`` adds its
    own roles beside it)."""
    parse = argparse.ArgumentParser(description=__doc__)
    sub = parse.add_subparsers(dest="role", required=True)
    add_task_arguments(sub.add_parser("task", help="run one rank under srun"))
    return parse


def add_task_arguments(task: argparse.ArgumentParser) -> None:
    task.add_argument("--gen-dir", type=Path, required=True)
    task.add_argument("--nodes", required=True, help="the generation's nodes, in rank order")
    task.add_argument("--nproc", type=int, required=True)
    task.add_argument("--workdir", required=True)
    task.add_argument("--env-file")
    task.add_argument("--ranks", help="the step's ranks, by SLURM_LOCALID (default: all)")
    task.add_argument("command", nargs=argparse.REMAINDER)


def main(argv: list[str] | None = None) -> int:
    parse = parser()
    args = parse.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parse.error("missing the command after --")
    return run_task(args, command)


if __name__ == "__main__":
    sys.exit(main())
