"""A plain PyTorch DDP script, written for torchrun, that knows nothing of Lazarus.

It imports no ``lazarus`` module. Lazarus runs it as it is
(``examples/jobs/unchanged_quick.yaml``):

- it reads the variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...),
  which Lazarus sets too;
- every rank prints ``step <n> loss <x>`` once per step, flushed, so the spec's
  ``health.progress_regex`` follows it and a hung rank is found;
- it saves its own checkpoint every ``--ckpt-every`` steps (rank 0 writes a temporary
  file, then renames it, so a crash never leaves half a file), and at start every rank
  loads it when it exists. A restarted generation goes on from there.

Run it under torchrun the same way:
``torchrun --nproc-per-node 2 examples/train_unchanged.py --steps 60``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--ckpt", default="checkpoints/unchanged/state.pt")
    parser.add_argument("--step-time", type=float, default=0.0, help="sleep per step (s)")
    parser.add_argument("--out", default=None, help="rank 0 saves the final weights here")
    return parser.parse_args(argv)


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``step`` on ``rank``: a function of both alone, so a resumed run
    trains on exactly the batches an uninterrupted one would."""
    generator = torch.Generator().manual_seed(step * 1_000 + rank)
    inputs = torch.randn(16, 8, generator=generator)
    return inputs, inputs.sum(dim=1, keepdim=True)


def save(path: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    state = {"step": step, "model": model.state_dict(), "optim": optimizer.state_dict()}
    torch.save(state, partial)
    partial.replace(path)


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    if not path.exists():
        return 0
    state: dict[str, Any] = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optim"])
    return int(state["step"])


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ckpt = Path(args.ckpt)
    start = load(ckpt, model, optimizer)
    if start:
        print(f"resumed from step {start}", flush=True)
    trained: nn.Module = DistributedDataParallel(model) if distributed else model
    loss_fn = nn.MSELoss()
    for step in range(start + 1, args.steps + 1):
        inputs, targets = batch(step, rank)
        loss = loss_fn(trained(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        if step % args.ckpt_every == 0:
            if distributed:
                dist.barrier()  # every rank finished the step before it is saved
            if rank == 0:
                save(ckpt, step, model, optimizer)
        if args.step_time:
            time.sleep(args.step_time)
    if rank == 0 and args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), args.out)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
