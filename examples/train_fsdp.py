"""A tiny FSDP2 job on CPU (gloo) with sharded checkpoints through
:mod:`lazarus.rank.dcp`: every rank writes its shards, rank 0 commits.

Deterministic: the model is seeded and each step's batch depends only on the step,
so a run that crashes and resumes from a checkpoint ends with the same weights as
one that never failed. Resuming on fewer ranks works too (DCP reshards on load).
At the end rank 0 saves the full (gathered) state dict to ``--out``."""

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
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard

import lazarus.rank as lazarus_rank
import lazarus.rank.torch as lazarus_torch
from lazarus.rank.dcp import load_sharded, save_sharded


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument(
        "--step-time",
        type=float,
        default=0.0,
        help="extra sleep per step, seconds: room for a test to kill a rank mid-run",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--checkpoint-dir", type=Path, help="used when LAZARUS_CHECKPOINT_DIR is unset"
    )
    return parser.parse_args(argv)


def batch_for(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same global batch at a step whatever the world size."""
    generator = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(8, 8, generator=generator)
    return inputs, inputs.sum(dim=1, keepdim=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.checkpoint_dir is not None and lazarus_rank.checkpoint_dir() is None:
        lazarus_rank.configure(checkpoint_dir=args.checkpoint_dir)
    lazarus_torch.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()

    model_state, optim_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state}
    resumed = load_sharded(state)
    completed = 0
    if resumed is not None:
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        completed = resumed

    while completed < args.steps:
        # Every rank sees the whole batch, so the gradient (and the weights) do not
        # depend on the world size.
        inputs, targets = batch_for(completed)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        if args.step_time > 0:
            time.sleep(args.step_time)
        completed += 1
        lazarus_rank.heartbeat(completed, loss=loss.item())
        if lazarus_torch.should_checkpoint(completed, every=args.ckpt_every):
            model_state, optim_state = get_state_dict(model, optimizer)
            save_sharded(completed, {"model": model_state, "optim": optim_state})

    lazarus_rank.flush_heartbeat()
    full = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if dist.get_rank() == 0 and args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        temp = args.out.with_name(f".{args.out.name}.{os.getpid()}.tmp")
        torch.save(full, temp)
        os.replace(temp, args.out)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
