"""Launching a generation of ranks: idempotent per (job, generation), fenced by generation.

A retried ``launch`` (the worker died mid-launch, or Temporal timed it out) must
adopt whatever already started rather than start duplicates. The run directory
is the source of truth: the port is fixed in ``plan.json`` before any rank
starts, each rank's wrapper writes its pid file, and ``launch.json`` marks the
launch complete. A file lock serialises two attempts that overlap in time.

Fencing: a launch of generation N refuses if a newer generation exists, and kills
anything still alive from older ones, so two generations are never alive at once.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.contracts import CheckpointRef, LaunchRequest, LaunchResult, RankProcess
from activities.nodes.agent import NodeAgent, NodeRefused, RankLaunch, StartedRank
from activities.nodes.factory import agents, on_each
from activities.nodes.local_agent import RankStartFailed
from activities.nodes.shim_agent import ShimError
from activities.procfs import group_members, signal_group
from activities.rundir import GenerationDir, generations, job_root, read_json, write_json_atomic
from lazarus import environment as env_names
from lazarus.spec import JobSpec, NodeSpec

REPO_ROOT = Path(__file__).resolve().parent.parent


class LaunchRefused(Exception):
    """A launch that must not be retried: fenced, or a command that cannot start."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@contextmanager
def generation_lock(gen: GenerationDir) -> Iterator[None]:
    """Held by ``launch`` while it starts ranks and by ``stop`` before it signals, so a
    stop can never slip in between two rank starts and leave the later ones orphaned."""
    gen.path.mkdir(parents=True, exist_ok=True)
    with open(gen.lock_file, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def resolve_program(spec: JobSpec) -> str | None:
    """Where the command's program would come from, or None if it cannot start."""
    program = spec.command[0]
    search_path = spec.env.get("PATH") or os.pathsep.join(
        [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    )
    if os.sep in program:
        candidate = Path(spec.workdir) / program
        return str(candidate) if os.access(candidate, os.X_OK) else None
    return shutil.which(program, path=search_path)


def rank_search_path(spec_path: str | None) -> str:
    """Like torchrun, which runs scripts with its own interpreter: `python` in a command
    means the worker's environment, unless the spec sets PATH itself."""
    if spec_path is not None:
        return spec_path
    return os.pathsep.join(
        [str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]
    )


def derived_port(job_id: str, generation: int) -> int:
    """A port the whole world agrees on without asking a remote node: stable per
    (job, generation), so a retried launch computes the same one."""
    digest = hashlib.sha256(f"{job_id}/{generation}".encode()).digest()
    return 20000 + int.from_bytes(digest[:4], "big") % 30000


def rank_environment(
    spec: JobSpec,
    nodes: list[NodeSpec],
    node_index: int,
    gen: GenerationDir,
    rank: int,
    master_port: int,
    resume: CheckpointRef | None,
) -> dict[str, str]:
    """The environment torchrun would set, plus Lazarus's own contract."""
    local = nodes[node_index].launcher == "local"
    env = dict(os.environ) if local else {}
    env.update(spec.env)
    env.update(
        {
            env_names.RANK: str(rank),
            env_names.LOCAL_RANK: str(rank % spec.nproc_per_node),
            env_names.GROUP_RANK: str(node_index),
            env_names.WORLD_SIZE: str(len(nodes) * spec.nproc_per_node),
            env_names.LOCAL_WORLD_SIZE: str(spec.nproc_per_node),
            env_names.MASTER_ADDR: nodes[0].host,
            env_names.MASTER_PORT: str(master_port),
            env_names.RESTART_COUNT: str(gen.generation - 1),
            env_names.JOB_ID: spec.job_id,
            env_names.GENERATION: str(gen.generation),
            env_names.HEARTBEAT_FILE: str(gen.heartbeat_file(rank)),
            env_names.CHECKPOINT_DIR: spec.checkpoint_dir,
            env_names.CONTROL_FILE: str(gen.control_file),
            env_names.RUN_DIR: str(gen.path),
            env_names.NODE: nodes[node_index].name,
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop(env_names.RESUME_FROM, None)
    env.pop(env_names.RESUME_STEP, None)
    if resume is not None:
        env[env_names.RESUME_FROM] = resume.path
        env[env_names.RESUME_STEP] = str(resume.step)
    env["PATH"] = rank_search_path(spec.env.get("PATH"))
    # lazarus.rank is importable from this checkout even where it is not installed.
    extra = spec.env.get("PYTHONPATH") or (os.environ.get("PYTHONPATH") if local else None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), extra]))
    return env


def _fence_older_generations(job_run_root: Path, generation: int) -> None:
    """Safety net behind the workflow's own ``stop``: nothing older may stay alive here."""
    for gen in generations(job_run_root):
        if gen.generation > generation:
            raise LaunchRefused(
                f"generation {generation} is fenced: generation {gen.generation} already exists"
            )
        if gen.generation == generation:
            continue
        for pid_file in gen.path.glob("rank-*.pid"):
            record = read_json(pid_file)
            if record and group_members(int(record["pgid"])):
                signal_group(int(record["pgid"]), signal.SIGKILL)


def _master_port(spec: JobSpec, nodes: list[NodeSpec], generation: int) -> int:
    if nodes[0].launcher == "local":
        return free_port(nodes[0].host)
    return derived_port(spec.job_id, generation)


def launch_generation(request: LaunchRequest) -> LaunchResult:
    """Blocking core of :func:`launch`; also used directly by tests and benches."""
    spec = request.spec
    nodes = request.nodes or spec.nodes
    root = job_root(spec.run_dir, spec.job_id)
    gen = GenerationDir.of(root, request.generation)
    gen.path.mkdir(parents=True, exist_ok=True)
    with generation_lock(gen):
        _fence_older_generations(root, request.generation)
        if gen.stopped_file.exists():
            raise LaunchRefused(f"generation {request.generation} was stopped; launch a new one")
        done = read_json(gen.launch_file)
        if done is not None:
            return LaunchResult.model_validate({**done, "adopted": True})
        if nodes[0].launcher == "local" and resolve_program(spec) is None:
            raise LaunchRefused(
                f"command: cannot find program {spec.command[0]!r} (workdir {spec.workdir}); "
                "fix the spec's command or PATH"
            )
        plan = read_json(gen.plan_file)
        if plan is None:
            plan = {
                "master_port": _master_port(spec, nodes, request.generation),
                "nodes": [n.name for n in nodes],
            }
            write_json_atomic(gen.plan_file, plan)
        master_port = int(plan["master_port"])
        write_json_atomic(gen.control_file, {"checkpoint_request": 0})

        def start_on(agent: NodeAgent) -> list[StartedRank]:
            index = nodes.index(agent.node)
            first = index * spec.nproc_per_node
            launches = [
                RankLaunch(
                    rank=rank,
                    command=spec.command,
                    env=rank_environment(
                        spec, nodes, index, gen, rank, master_port, request.resume
                    ),
                    workdir=spec.workdir,
                )
                for rank in range(first, first + spec.nproc_per_node)
            ]
            return agent.start_ranks(str(gen.path), launches)

        with agents(nodes, spec.ssh) as opened:
            try:
                per_node = on_each(opened, start_on)
            except RankStartFailed as exc:
                raise LaunchRefused(f"command: {exc}; fix the spec's command or PATH") from exc
            except (NodeRefused, ShimError) as exc:
                raise LaunchRefused(str(exc)) from exc
        ranks = [
            RankProcess(
                rank=r.rank,
                node=node.name,
                pid=r.pid,
                pgid=r.pgid,
                start_ticks=r.start_ticks,
                log_file=r.log_file,
            )
            for node, started in zip(nodes, per_node, strict=True)
            for r in started
        ]
        result = LaunchResult(
            generation=request.generation,
            master_addr=nodes[0].host,
            master_port=master_port,
            run_dir=str(gen.path),
            ranks=ranks,
            launched_at=time.time(),
            adopted=any(r.adopted for started in per_node for r in started),
        )
        write_json_atomic(gen.launch_file, result.model_dump(mode="json", exclude={"adopted"}))
        return result


@activity.defn(name="launch")
async def launch(request: LaunchRequest) -> LaunchResult:
    """Start (or adopt) every rank of one generation, detached from this worker."""
    try:
        return await asyncio.to_thread(launch_generation, request)
    except LaunchRefused as exc:
        raise ApplicationError(str(exc), type="LaunchRefused", non_retryable=True) from exc
