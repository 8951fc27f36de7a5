"""A tiny, deterministic Accelerate loop (DDP over gloo, CPU) that Lazarus can kill and
resume from Accelerate's own ``save_state``.

The integration is three calls from :mod:`lazarus.rank.integrations.accelerate`:
``load_state`` at startup, ``step_end`` after each step and ``save_state`` when it says
so. ``--no-lazarus`` uses ``accelerator.save_state``/``load_state`` into
``--checkpoint-dir`` directly, as a user would unchanged. The data is a seeded
regression set of ``--epoch-batches`` batches per process an epoch, shuffled by
Accelerate's seedable sampler (an epoch's order a function of the seed and the epoch);
``batches`` resumes it at the exact next batch of a resumed epoch, so a run killed
mid-epoch ends with weights equal to an uninterrupted one (rank 0 saves them to
``--out``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import accelerate
import torch
from accelerate.utils import DataLoaderConfiguration
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lazarus.rank.integrations import accelerate as lazarus_accelerate

FEATURES = 8
BATCH_SIZE = 4


def dataset(seed: int, processes: int, epoch_batches: int) -> TensorDataset:
    """``epoch_batches`` batches per process: an epoch is that many optimizer steps."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH_SIZE * processes * epoch_batches, FEATURES, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True).sin())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epoch-batches", type=int, default=4, help="batches per rank an epoch")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--checkpoint-dir", type=Path, default=Path(".accelerate-ckpts"))
    parser.add_argument("--no-lazarus", action="store_true", help="Accelerate alone")
    args = parser.parse_args(argv)

    accelerator = accelerate.Accelerator(
        cpu=True,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=args.seed),
    )
    torch.manual_seed(args.seed)
    net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    data = dataset(args.seed, accelerator.num_processes, args.epoch_batches)
    model, optimizer, loader = accelerator.prepare(
        net, optimizer, DataLoader(data, batch_size=BATCH_SIZE, shuffle=True)
    )

    if args.no_lazarus:
        start = 0
        marker = args.checkpoint_dir / "step"
        if marker.exists():
            accelerator.load_state(str(args.checkpoint_dir))
            start = int(marker.read_text())
    else:
        start = lazarus_accelerate.load_state(accelerator)
    if start:
        print(f"resumed from step {start}", flush=True)
    for step, (x, y) in lazarus_accelerate.batches(accelerator, loader, start, args.steps):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        time.sleep(args.step_time)
        print(f"step {step + 1} loss {loss.item():.6f}", flush=True)
        if args.no_lazarus:
            if (step + 1) % args.ckpt_every == 0:
                accelerator.save_state(str(args.checkpoint_dir))
                if accelerator.is_main_process:
                    (args.checkpoint_dir / "step").write_text(str(step + 1))
        elif lazarus_accelerate.step_end(
            accelerator, step + 1, every=args.ckpt_every, loss=loss.item()
        ):
            lazarus_accelerate.save_state(accelerator, step + 1)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process and args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(accelerator.unwrap_model(model).state_dict(), args.out)
    accelerator.end_training()


if __name__ == "__main__":
    main()
