"""Fault injection against a job's ranks, for the demo, the benchmarks and the tests.
It signals processes on this machine, so it is a test tool, not part of the client
(it was ``lazarus/app/chaos.py`` until issue 40).

It reads the same run directory the controller does, so "kill rank 1 at step 30"
means the same thing everywhere, and a game day can use it against a real job.
Every helper takes a run root (``<run_dir>/<job_id>/<run_key>``) or the job
directory (``<run_dir>/<job_id>``), which means its most recently active run.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from activities.nodes.procfs import is_alive
from activities.nodes.rundir import (
    GenerationDir,
    generations,
    generations_below,
    latest_run,
    read_json,
)


@dataclass(frozen=True)
class InjectedFault:
    rank: int
    pid: int
    signal: str
    generation: int
    at: float
    step: int | None


def run_root_of(root: Path) -> Path:
    """``root`` itself when it is a run root (or a legacy job directory), else the job
    directory's most recently active run; ``root`` when nothing has started yet."""
    return latest_run(root) or Path(root)


def newest_generation(job_run_root: Path) -> GenerationDir | None:
    gens = generations(run_root_of(job_run_root))
    return gens[-1] if gens else None


def current_step(job_run_root: Path, generation: int | None = None) -> tuple[int, int | None]:
    """(generation, newest step any of its ranks reported)."""
    gen = (
        GenerationDir.of(run_root_of(job_run_root), generation)
        if generation
        else newest_generation(job_run_root)
    )
    if gen is None:
        return 0, None
    steps = [
        int(r["step"])
        for p in gen.path.glob("rank-*.heartbeat.json")
        if (r := read_json(p)) is not None and "step" in r
    ]
    return gen.generation, (max(steps) if steps else None)


def wait_for_step(
    job_run_root: Path, step: int, timeout_s: float = 120.0, min_generation: int = 1
) -> tuple[int, int]:
    """Block until a generation >= ``min_generation`` reports ``step``; returns (gen, step)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        generation, seen = current_step(job_run_root)
        if generation >= min_generation and seen is not None and seen >= step:
            return generation, seen
        time.sleep(0.05)
    raise TimeoutError(f"{job_run_root}: step {step} not reached in {timeout_s:.0f} s")


def rank_pid(job_run_root: Path, rank: int) -> tuple[int, int]:
    """(generation, pid) of a rank in the newest generation."""
    gen = newest_generation(job_run_root)
    record = read_json(gen.pid_file(rank)) if gen else None
    if gen is None or record is None:
        raise LookupError(f"{job_run_root}: rank {rank} has no pid file yet")
    return gen.generation, int(record["pid"])


def signal_rank(
    job_run_root: Path, rank: int, sig: signal.Signals = signal.SIGKILL
) -> InjectedFault:
    generation, pid = rank_pid(job_run_root, rank)
    _, step = current_step(job_run_root, generation)
    os.kill(pid, sig)
    return InjectedFault(
        rank=rank, pid=pid, signal=sig.name, generation=generation, at=time.time(), step=step
    )


def live_ranks_by_generation(job_run_root: Path) -> dict[Path, list[int]]:
    """The live rank pids of each generation folder (pid and start time from each pid
    file), across every run of the job given its directory. A rank carried over into a
    newer generation (``rejoin``: its pid file there links to the old one) counts once,
    for the newest generation that holds it: that is the one it acts for."""
    acting_for: dict[int, Path] = {}
    for gen in sorted(generations_below(job_run_root), key=lambda g: (g.path.parent, g.generation)):
        for pid_file in gen.path.glob("rank-*.pid"):
            record = read_json(pid_file)
            if record and is_alive(int(record["pid"]), int(record["start_ticks"])):
                acting_for[int(record["pid"])] = gen.path
    live: dict[Path, list[int]] = {}
    for pid, path in acting_for.items():
        live.setdefault(path, []).append(pid)
    return live


def ranks_alive_twice(job_run_root: Path) -> dict[int, list[int]]:
    """The ranks with more than one live process, and their pids, across every
    generation and run of the job given its directory: the fencing invariant says
    this is always empty. A rank carried over (``rejoin``) is one pid in two
    generations' files, so it counts once."""
    pids: dict[int, set[int]] = {}
    for gen in generations_below(job_run_root):
        for pid_file in gen.path.glob("rank-*.pid"):
            record = read_json(pid_file)
            if record and is_alive(int(record["pid"]), int(record["start_ticks"])):
                rank = int(pid_file.name.removeprefix("rank-").removesuffix(".pid"))
                pids.setdefault(rank, set()).add(int(record["pid"]))
    return {rank: sorted(found) for rank, found in sorted(pids.items()) if len(found) > 1}


def live_rank_processes(job_run_root: Path) -> list[int]:
    """Every rank process alive across all generations (of every run, given a job
    directory): at most world size, always."""
    return [pid for pids in live_ranks_by_generation(job_run_root).values() for pid in pids]


def kill_node(job_run_root: Path, node: str) -> list[int]:
    """A local node "dies": every rank it hosts is killed with its wrapper, so no
    exit status is written, exactly as when a machine vanishes."""
    gen = newest_generation(job_run_root)
    launch = read_json(gen.launch_file) if gen else None
    if gen is None or launch is None:
        raise LookupError(f"{job_run_root}: no launched generation")
    killed: list[int] = []
    for rank in launch["ranks"]:
        if rank.get("node") == node:
            os.killpg(int(rank["pgid"]), signal.SIGKILL)
            killed.append(int(rank["rank"]))
    return killed
