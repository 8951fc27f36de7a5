"""``python -m bench snapshot-cost``: what a memory-tier snapshot of a large state costs,
per GB, through the rank helper's own code path.

256 MB to 1 GB of float32 tensors, one rank, no process group, through
:func:`lazarus.rank.torch.snapshot`: **blocking**, the call's own time (the copy into
CPU memory a step waits for: the simulator's figure), and **background**,
:func:`lazarus.rank.torch.flush_snapshots` right after (the write to tmpfs and commit,
beside the next steps). The first snapshot of each size allocates its buffers and is
reported apart. On a GPU the copy is a device-to-host transfer; here a host memory copy.
Used by the simulator: docs/results/2026-12-simulation.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench import costs
from bench.costs import sizes_mb, tmpfs_scratch, write_cost_results

GB = 1e9
CHUNK_BYTES = 64 * 2**20
"""Tensors of 64 MiB: a state is many tensors, and one huge tensor would flatter the copy."""


def make_state(size_bytes: int) -> dict[str, Any]:
    """A state dict of float32 tensors of ``size_bytes`` in all (random, so no page is
    shared or zero)."""
    import torch

    tensors: dict[str, Any] = {}
    left, index = size_bytes, 0
    while left > 0:
        chunk = min(left, CHUNK_BYTES)
        tensors[f"p{index}"] = torch.rand(chunk // 4)
        left -= chunk
        index += 1
    return {"model": tensors}


def measure(size_mb: int, repeats: int, scratch: Path) -> dict[str, Any]:
    """One size: the first snapshot, then ``repeats`` more, each blocking call and its
    background write timed apart."""
    import lazarus.rank.torch as lazarus_torch
    from lazarus.domain import environment
    from lazarus.rank import reset

    os.environ[environment.MEMORY_CHECKPOINT_DIR] = str(scratch / f"size-{size_mb}")
    os.environ[environment.MEMORY_EVERY_STEPS] = "1"
    reset._reset_state()
    size_bytes = size_mb * 2**20
    state = make_state(size_bytes)
    blocking: list[float] = []
    background: list[float] = []
    for step in range(1, repeats + 2):
        started = time.perf_counter()
        taken = lazarus_torch.snapshot(step, lambda: state)
        copied = time.perf_counter()
        lazarus_torch.flush_snapshots()
        written = time.perf_counter()
        if not taken:
            raise RuntimeError(f"snapshot of step {step} was not taken: is the memory tier on?")
        blocking.append(copied - started)
        background.append(written - copied)
    lazarus_torch._last_copy = None  # free the buffers before the next size
    gigabytes = size_bytes / GB
    steady = statistics.median(blocking[1:])
    writes = statistics.median(background[1:])
    return {
        "size_mb": size_mb,
        "gigabytes": gigabytes,
        "first_blocking_s": blocking[0],
        "blocking_s": blocking[1:],
        "background_s": background[1:],
        "blocking_median_s": steady,
        "background_median_s": writes,
        "blocking_s_per_gb": steady / gigabytes,
        "background_s_per_gb": writes / gigabytes,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| state | first snapshot (allocates) | blocking, median | per GB | background write + "
        "commit, median | per GB |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['size_mb']} MiB | {r['first_blocking_s']:.3f} s | {r['blocking_median_s']:.3f} s "
        f"| {r['blocking_s_per_gb']:.3f} s | {r['background_median_s']:.3f} s "
        f"| {r['background_s_per_gb']:.3f} s |"
        for r in rows
    ]
    return "\n".join(lines)


def add_command(commands: Any) -> None:
    parser = costs.add_parser(
        "snapshot-cost",
        commands,
        __doc__,
        help="a memory-tier snapshot's blocking copy and background write, per GB",
    )
    parser.add_argument(
        "--sizes-mb", default="256,512,1024", help="state sizes in MiB (default 256,512,1024)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="snapshots per size after the first")


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)  # one core's copy, and the machine is shared
    load = os.getloadavg()
    with tmpfs_scratch("lazarus-snapshot-cost-") as scratch:
        rows = [
            measure(size, max(1, args.repeats), Path(scratch)) for size in sizes_mb(args.sizes_mb)
        ]
    write_cost_results(
        "snapshot-cost",
        args.json_out,
        load,
        rows,
        markdown(rows),
        torch=torch.__version__,
        device="cpu",
    )
    return 0
