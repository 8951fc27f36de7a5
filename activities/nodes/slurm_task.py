"""The two small processes of a Slurm generation, standard library only.

``srun`` (on the controller's machine): starts the ``srun`` client of one node's
step of the generation detached. It forks, the parent exits at once (the worker
reaps it), and the child starts a new session, writes ``slurm-srun-<node>.pid``,
runs ``srun`` with its output in ``slurm-srun-<node>.log`` and records its exit in
``slurm-srun-<node>.exit.json``. So the step's client is never a child of the
worker: a worker crash or restart does not touch it.

``task`` (on a compute node, one per rank, run by ``srun``; one step per node): in
the foreground, so Slurm tracks it and ``scancel`` signals reach it. It computes the rank's own
variables from the node's slot in the generation's node list (``SLURMD_NODENAME``)
and ``SLURM_LOCALID``: the rank slots follow the plan's node order, which after a
spare took a dead node's slot need not be Slurm's sorted order. Slurm's own task
variables are rewritten to match (:func:`slurm_identity`): each node's ranks are a
step of their own (``-N1``), so Slurm numbers every node's tasks from 0
(``SLURM_PROCID`` 0..nproc-1, ``SLURM_NODEID`` 0, ``SLURM_NTASKS`` nproc on every
node), and a script that reads them (Lightning's ``SLURMEnvironment``, a
``SLURM_PROCID == 0`` guard around a save) would see as many rank 0s as nodes, and
after a spare swap a numbering that is not ``RANK``'s. It then runs the rank with
its output in the rank's log and writes the same pid and exit files as
:mod:`activities.nodes.rank_wrapper`, plus the step's id (``slurm_step``). It
ignores SIGTERM, SIGINT and SIGHUP so it outlives the rank long enough to record
how the rank ended; only a SIGKILL of the whole step (``scancel --signal=KILL``)
takes it down first, and then the stop that sent it records the exit instead.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from activities.nodes.rank_wrapper import exit_record, pid_record, start_ticks, write_atomic
from activities.nodes.rundir import SrunFiles
from lazarus.domain import environment as env_names

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


def _cannot_start(exit_path: Path, rank: int, error: str) -> int:
    """Record a rank that never started, as the rank wrapper does (exit 127)."""
    write_atomic(
        exit_path,
        {"rank": rank, "exit_code": 127, "signal": None, "ended_at": time.time(), "error": error},
    )
    return 127


def _run_task(args: argparse.Namespace, command: list[str]) -> int:
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
        from activities.nodes.secret_env import SecretEnvError, read_env_file

        try:
            env.update(read_env_file(args.env_file))
        except SecretEnvError as exc:
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


def _local_stop(args: argparse.Namespace) -> int:
    """On the node (``srun -w <node>``): stop ``--node``'s ranks forked from its zygote,
    as a local node's agent stops its ranks (process groups, start ticks checked, only
    that node's ranks), and print the result as one JSON line. Their cgroup is the
    zygote's step: cancelling that step would kill the zygote too."""
    from activities.nodes.local_agent import stop_ranks
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
    task = sub.add_parser("task", help="run one rank under srun")
    task.add_argument("--gen-dir", type=Path, required=True)
    task.add_argument("--nodes", required=True, help="the generation's nodes, in rank order")
    task.add_argument("--nproc", type=int, required=True)
    task.add_argument("--workdir", required=True)
    task.add_argument("--env-file")
    task.add_argument("--ranks", help="the step's ranks, by SLURM_LOCALID (default: all)")
    task.add_argument("command", nargs=argparse.REMAINDER)
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
        return _run_task(args, command)
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
