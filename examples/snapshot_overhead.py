"""How much a memory snapshot every step slows the example's training step, on CPU.

Runs the example's model and optimizer (``examples/train_ddp.py``) in one process,
without and with ``lazarus.rank.torch.snapshot`` every step into a tmpfs directory,
and prints the median step time of each over a few runs. One process means no
cross-node barrier; the barrier runs in the snapshot thread, off the step's path.

    python examples/snapshot_overhead.py [--steps 300] [--runs 5] [--hidden 64] [--step-time 0]

``--hidden`` scales the model (the example's is 64) to see how the cost grows with
the state size; ``--step-time`` adds the example's stand-in for compute (a sleep,
0.05 s by default in the example), which the background write overlaps. With steps
shorter than one write, the next snapshot waits for the previous one, so a step
takes as long as a write. A measurement, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_ddp  # the example's model and data, from next door

import lazarus.rank.torch as lazarus_torch
from lazarus.domain import environment
from lazarus.rank import reset


def median_step_s(steps: int, hidden: int, step_time: float, snapshot_dir: Path | None) -> float:
    if snapshot_dir is None:
        os.environ.pop(environment.MEMORY_CHECKPOINT_DIR, None)
    else:
        os.environ[environment.MEMORY_CHECKPOINT_DIR] = str(snapshot_dir)
    reset._reset_state()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(train_ddp.INPUT_DIM, hidden), nn.Tanh(), nn.Linear(hidden, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    teacher = train_ddp.teacher_weights(0)
    loss_fn = nn.MSELoss()
    times = []
    for step in range(1, steps + 1):
        started = time.perf_counter()
        inputs, targets = train_ddp.batch_for(0, step, 0, teacher)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        if step_time > 0:
            time.sleep(step_time)
        lazarus_torch.snapshot(
            step, lambda: {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        )
        times.append(time.perf_counter() - started)
    lazarus_torch.flush_snapshots()
    return statistics.median(times[10:])  # skip warm-up


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=train_ddp.HIDDEN_DIM)
    parser.add_argument("--step-time", type=float, default=0.0, help="sleep per step, seconds")
    args = parser.parse_args()
    torch.set_num_threads(1)
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(dir=shm, prefix="lazarus-overhead-") as scratch:
        plain, snap = [], []
        for run in range(args.runs):
            plain.append(median_step_s(args.steps, args.hidden, args.step_time, None))
            snapshots = Path(scratch) / f"run-{run}"
            snap.append(median_step_s(args.steps, args.hidden, args.step_time, snapshots))
    base, with_snapshots = statistics.median(plain), statistics.median(snap)
    params = (train_ddp.INPUT_DIM + 1) * args.hidden + args.hidden + 1
    print(
        f"model: {params} parameters (hidden {args.hidden}), step sleep {args.step_time} s, "
        f"{args.steps} steps x {args.runs} runs"
    )
    print(f"median step without snapshots: {base * 1e3:.3f} ms")
    print(f"median step with a snapshot every step: {with_snapshots * 1e3:.3f} ms")
    overhead = with_snapshots - base
    print(f"overhead: {overhead * 1e3:.3f} ms/step ({with_snapshots / base - 1:+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
