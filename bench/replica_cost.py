"""What memory-tier replicas cost a fault-free job: the example job's step rate with
the memory tier on, with and without ``memory_replicas``, in alternating runs.

Plain rank processes with the launcher's variables (one "node" and memory directory
each, the ring on 127.0.0.1), no controller: a replica's rank-side cost. Method and
figures: docs/results/2026-12-memory-replicas.md, "What replicas cost a fault-free step".
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import costs
from bench.costs import write_cost_results
from bench.jobs import EXAMPLE, REPO
from lazarus.domain import environment
from lazarus.domain.memory_tier import replica_environment
from lazarus.domain.ports import free_port

JOB = "bench-replicas"
STEP_LINE = re.compile(r"^step (\d+) loss")
TIMEOUT_S = 600.0


def one_run(workdir: Path, *, replicas: bool, ranks: int, steps: int, step_time: float) -> float:
    """Steps per second of one fault-free run (rank 0, first to last logged step)."""
    port = free_port()
    secret = secrets.token_hex(32)
    hosts = ["127.0.0.1"] * ranks
    procs: list[subprocess.Popen[str]] = []
    for rank in range(ranks):
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAZARUS_")}
        env.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": "0",
                "GROUP_RANK": str(rank),
                "WORLD_SIZE": str(ranks),
                "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "PYTHONPATH": str(REPO),
                environment.JOB_ID: JOB,
                environment.GENERATION: "1",
                environment.MEMORY_CHECKPOINT_DIR: str(workdir / f"node-{rank}"),
                environment.MEMORY_EVERY_STEPS: "1",
                environment.MEMORY_KEEP: "2",
                environment.CHECKPOINT_EVERY_STEPS: "0",  # disk only on request: none
            }
        )
        if replicas:
            env.update(replica_environment(secret, 1, hosts, rank))
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(EXAMPLE),
                    "--steps",
                    str(steps),
                    "--step-time",
                    str(step_time),
                    "--checkpoint-dir",
                    str(workdir / "checkpoints"),
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                text=True,
            )
        )
    stamps: list[tuple[int, float]] = []

    def read_rank0() -> None:
        assert procs[0].stdout is not None
        for line in procs[0].stdout:
            found = STEP_LINE.match(line)
            if found:
                stamps.append((int(found.group(1)), time.monotonic()))

    reader = threading.Thread(target=read_rank0, daemon=True)
    reader.start()
    try:
        for proc in procs:
            proc.wait(timeout=TIMEOUT_S)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    reader.join(timeout=10)
    errors = procs[0].stderr.read() if procs[0].stderr is not None else ""
    if any(p.returncode != 0 for p in procs) or len(stamps) < 2:
        raise RuntimeError(f"replica-cost run failed: {errors[-2000:]}")
    if replicas and "not pushed" in errors:
        raise RuntimeError(f"replicas were not pushed: {errors[-2000:]}")
    (first_step, first_at), (last_step, last_at) = stamps[0], stamps[-1]
    return (last_step - first_step) / (last_at - first_at)


def measure(pairs: int, ranks: int, steps: int, step_time: float) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"off": [], "on": []}
    for pair in range(pairs):
        order = ("off", "on") if pair % 2 == 0 else ("on", "off")
        for which in order:
            with tempfile.TemporaryDirectory(prefix="lazarus-replica-cost-") as tmp:
                rate = one_run(
                    Path(tmp), replicas=which == "on", ranks=ranks, steps=steps, step_time=step_time
                )
            rates[which].append(rate)
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    return {
        "ranks": ranks,
        "steps": steps,
        "step_time_s": step_time,
        "pairs": pairs,
        "steps_per_s": rates,
        "median_steps_per_s_off": off,
        "median_steps_per_s_on": on,
        "slowdown": 1.0 - on / off,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| step time (sleep) | ranks | steps/s, replicas off | steps/s, replicas on | slower by |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['step_time_s']:.3f} s | {row['ranks']} | {row['median_steps_per_s_off']:.2f} "
            f"| {row['median_steps_per_s_on']:.2f} | {row['slowdown'] * 100:+.1f}% |"
        )
    return "\n".join(lines)


def add_command(commands: Any) -> None:
    parser = costs.add_parser(
        "replica-cost",
        commands,
        __doc__,
        help="the example job's step rate with memory-tier replicas on and off",
    )
    parser.add_argument("--pairs", type=int, default=4, help="off/on pairs (default 4)")
    parser.add_argument("--ranks", type=int, default=3, help="ranks, one per node (default 3)")
    parser.add_argument("--steps", type=int, default=200, help="steps per run (default 200)")
    parser.add_argument(
        "--step-times",
        default="0,0.05",
        help="the example's sleep per step, comma-separated (default 0,0.05: "
        "compute-bound, and the bench's job shape)",
    )
    parser.add_argument("--quick", action="store_true", help="1 pair, 60 steps")


def run(args: argparse.Namespace) -> int:
    pairs, steps = (1, 60) if args.quick else (max(1, args.pairs), args.steps)
    step_times = [float(t) for t in str(args.step_times).split(",") if t.strip()]
    load = os.getloadavg()
    rows = [measure(pairs, args.ranks, steps, t) for t in step_times]
    write_cost_results("replica-cost", args.json_out, load, rows, markdown(rows))
    return 0
