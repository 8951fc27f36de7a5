"""``python -m bench snapshot-cost``: what a memory-tier snapshot of a large state costs,
per GB, through the rank helper's own code path.

The simulator charges each memory snapshot the time the ranks are held back by it.
The figure it had was a fraction of a step measured on the example's few-KB state
(``examples/snapshot_overhead.py``), applied to a 5.7 TB state. This measures the
snapshot at realistic sizes instead (256 MB to 1 GB of float32 tensors, one rank, no
process group), through :func:`lazarus.rank.torch.snapshot`:

- **blocking** (the figure the simulator uses): the call's own time. It copies the
  state into CPU memory (into the previous snapshot's buffers, as every snapshot after
  the first does) and returns; that copy is all a step waits for;
- **background**: :func:`lazarus.rank.torch.flush_snapshots` right after, which waits
  for the thread that writes the copy to the node's tmpfs and commits it. It runs
  beside the next steps; it only matters if it outlasts the memory interval, since the
  next snapshot waits for it.

The first snapshot of each size allocates its buffers and is reported apart. On a GPU
the copy is a device-to-host transfer; here (CPU only) it is a host memory copy.

    python -m bench snapshot-cost                        # 256, 512, 1024 MB, 5 repeats
    python -m bench snapshot-cost --sizes-mb 64 --repeats 2   # checks the bench
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import write_cost_results

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
    parser = commands.add_parser(
        "snapshot-cost",
        help="a memory-tier snapshot's blocking copy and background write, per GB",
        description=(__doc__ or "").splitlines()[0],
    )
    parser.add_argument(
        "--sizes-mb", default="256,512,1024", help="state sizes in MiB (default 256,512,1024)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="snapshots per size after the first")
    parser.add_argument("--json-out", type=Path)


def sizes_mb(text: str) -> list[int]:
    """``--sizes-mb``'s comma-separated MiB."""
    return [int(size) for size in str(text).split(",") if size.strip()]


def tmpfs_scratch(prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A scratch directory in tmpfs (``/dev/shm``, where the memory tier lives), or
    the default temporary directory where there is none; removed on exit."""
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    return tempfile.TemporaryDirectory(dir=shm, prefix=prefix)


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
