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
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.contracts import LaunchRequest, LaunchResult, RankProcess
from activities.procfs import group_members, is_alive, signal_group
from activities.rundir import GenerationDir, generations, job_root, read_json, write_json_atomic
from lazarus import environment as env_names
from lazarus.spec import JobSpec

PID_FILE_WAIT_S = 30.0
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


def rank_environment(
    spec: JobSpec,
    gen: GenerationDir,
    rank: int,
    master_port: int,
    resume_step: int | None,
    resume_path: str | None,
) -> dict[str, str]:
    """The environment torchrun would set, plus Lazarus's own contract."""
    node = spec.nodes[0]
    env = dict(os.environ)
    env.update(spec.env)
    env.update(
        {
            env_names.RANK: str(rank),
            env_names.LOCAL_RANK: str(rank % spec.nproc_per_node),
            env_names.GROUP_RANK: str(rank // spec.nproc_per_node),
            env_names.WORLD_SIZE: str(spec.world_size),
            env_names.LOCAL_WORLD_SIZE: str(spec.nproc_per_node),
            env_names.MASTER_ADDR: node.host,
            env_names.MASTER_PORT: str(master_port),
            env_names.RESTART_COUNT: str(gen.generation - 1),
            env_names.JOB_ID: spec.job_id,
            env_names.GENERATION: str(gen.generation),
            env_names.HEARTBEAT_FILE: str(gen.heartbeat_file(rank)),
            env_names.CHECKPOINT_DIR: spec.checkpoint_dir,
            env_names.CONTROL_FILE: str(gen.control_file),
            env_names.RUN_DIR: str(gen.path),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop(env_names.RESUME_FROM, None)
    env.pop(env_names.RESUME_STEP, None)
    if resume_path is not None and resume_step is not None:
        env[env_names.RESUME_FROM] = resume_path
        env[env_names.RESUME_STEP] = str(resume_step)
    # Like torchrun, which runs scripts with its own interpreter: `python` in a command
    # means the worker's environment unless the spec's PATH says otherwise.
    if "PATH" not in spec.env:
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # The wrapper is imported from this checkout even if the worker runs elsewhere.
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
    )
    return env


def _fence_older_generations(job_run_root: Path, generation: int) -> None:
    """Safety net behind the workflow's own ``stop``: nothing older may stay alive."""
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


def _start_rank(spec: JobSpec, gen: GenerationDir, rank: int, env: dict[str, str]) -> RankProcess:
    gen.exit_file(rank).unlink(missing_ok=True)
    wrapper = [
        sys.executable,
        "-m",
        "activities.rank_wrapper",
        "--rank",
        str(rank),
        "--gen-dir",
        str(gen.path),
        "--",
        *spec.command,
    ]
    # The wrapper forks and its parent exits at once; wait() reaps that parent only.
    subprocess.run(
        wrapper,
        cwd=spec.workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
        start_new_session=True,
        timeout=30,
    )
    deadline = time.monotonic() + PID_FILE_WAIT_S
    while time.monotonic() < deadline:
        record = read_json(gen.pid_file(rank))
        if record is not None:
            return _rank_process(gen, rank, record)
        exit_record = read_json(gen.exit_file(rank))
        if exit_record is not None and exit_record.get("error"):
            raise LaunchRefused(f"rank {rank}: {exit_record['error']}")
        time.sleep(0.01)
    raise TimeoutError(f"rank {rank}: wrapper wrote no pid file within {PID_FILE_WAIT_S:.0f} s")


def _rank_process(gen: GenerationDir, rank: int, record: dict[str, object]) -> RankProcess:
    return RankProcess(
        rank=rank,
        pid=int(str(record["pid"])),
        pgid=int(str(record["pgid"])),
        start_ticks=int(str(record["start_ticks"])),
        log_file=str(gen.log_file(rank)),
    )


def launch_generation(request: LaunchRequest) -> LaunchResult:
    """Blocking core of :func:`launch`; also used directly by tests and benches."""
    spec = request.spec
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
        if resolve_program(spec) is None:
            raise LaunchRefused(
                f"command: cannot find program {spec.command[0]!r} (workdir {spec.workdir}); "
                "fix the spec's command or PATH"
            )
        plan = read_json(gen.plan_file)
        if plan is None:
            plan = {"master_port": free_port(spec.nodes[0].host)}
            write_json_atomic(gen.plan_file, plan)
        master_port = int(plan["master_port"])
        write_json_atomic(gen.control_file, {"checkpoint_request": 0})
        resume_path = request.resume.path if request.resume else None
        resume_step = request.resume.step if request.resume else None
        ranks: list[RankProcess] = []
        adopted_any = False
        for rank in range(spec.world_size):
            existing = read_json(gen.pid_file(rank))
            if existing is not None:
                adopted_any = True
                ranks.append(_rank_process(gen, rank, existing))
                continue
            env = rank_environment(spec, gen, rank, master_port, resume_step, resume_path)
            ranks.append(_start_rank(spec, gen, rank, env))
        result = LaunchResult(
            generation=request.generation,
            master_addr=spec.nodes[0].host,
            master_port=master_port,
            run_dir=str(gen.path),
            ranks=ranks,
            launched_at=time.time(),
            adopted=adopted_any,
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


def ranks_alive(result: LaunchResult) -> int:
    return sum(1 for r in result.ranks if is_alive(r.pid, r.start_ticks))
