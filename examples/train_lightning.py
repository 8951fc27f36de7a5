"""A tiny, deterministic Lightning job (``Trainer`` with DDP over gloo) that Lazarus
can kill and resume from Lightning's own checkpoint.

Under Lazarus each rank is launched with the torchrun variables, so Lightning uses its
``TorchElasticEnvironment``: ``devices`` is ``LOCAL_WORLD_SIZE``, ``num_nodes`` is
``WORLD_SIZE // LOCAL_WORLD_SIZE``. The one-line integration is
``callbacks=[LazarusCallback(every=...)]`` plus ``ckpt_path=resume_ckpt_path()``
(``--no-lazarus`` leaves both out: Lightning's own ``ModelCheckpoint`` into
``--checkpoint-dir``, resumed from its ``last.ckpt``, as a user would run it unchanged).

The data is a seeded synthetic regression set of ``--epoch-batches`` batches per rank
an epoch, shuffled by Lightning's ``DistributedSampler`` (its order a function of the
seed and the epoch). The loader is torchdata's ``StatefulDataLoader``: Lightning saves
its position in every checkpoint and restores it, so a run killed mid-epoch resumes at
the exact next batch and ends with weights equal to an uninterrupted one (a plain
``DataLoader`` restarts the epoch: Lightning warns that it is not resumable, and the
batches of the epoch before the save are trained twice). Rank 0 saves the final
``state_dict`` to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import RandomSampler, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from lazarus.rank.integrations.lightning import LazarusCallback, resume_ckpt_path

FEATURES = 8
BATCH_SIZE = 4


class Regressor(pl.LightningModule):
    """Two linear layers and SGD with momentum (optimizer state a resume must restore)."""

    def __init__(self, lr: float, step_time: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))
        self.lr = lr
        self.step_time = step_time

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        time.sleep(self.step_time)
        print(f"step {self.global_step + 1} loss {loss.item():.6f}", flush=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def dataset(seed: int, world_size: int, epoch_batches: int) -> TensorDataset:
    """``epoch_batches`` batches per rank: Lightning's DistributedSampler gives each
    rank its share of the epoch, so an epoch is ``epoch_batches`` optimizer steps."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH_SIZE * world_size * epoch_batches, FEATURES, generator=generator)
    y = x.sum(dim=1, keepdim=True).sin()
    return TensorDataset(x, y)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epoch-batches", type=int, default=4, help="batches per rank an epoch")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--checkpoint-dir", type=Path, default=Path(".lightning-ckpts"))
    parser.add_argument("--no-lazarus", action="store_true", help="Lightning alone")
    args = parser.parse_args(argv)

    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    pl.seed_everything(args.seed, verbose=False)
    model = Regressor(args.lr, args.step_time)
    callbacks: list[pl.Callback]
    if args.no_lazarus:
        from lightning.pytorch.callbacks import ModelCheckpoint

        callbacks = [
            ModelCheckpoint(
                dirpath=args.checkpoint_dir, every_n_train_steps=args.ckpt_every, save_last=True
            )
        ]
        last = args.checkpoint_dir / "last.ckpt"
        ckpt_path = str(last) if last.exists() else None
    else:
        callbacks = [LazarusCallback(every=args.ckpt_every)]
        ckpt_path = resume_ckpt_path()
    trainer = pl.Trainer(
        accelerator="cpu",
        strategy="ddp" if world > 1 else "auto",
        devices=local,
        num_nodes=max(1, world // local),
        max_steps=args.steps,
        max_epochs=-1,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=args.no_lazarus,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    if ckpt_path is not None:
        print(f"resumed from {ckpt_path}", flush=True)
    data = dataset(args.seed, world, args.epoch_batches)
    # torch's RandomSampler, not shuffle=True: torchdata's own sampler is one Lightning
    # wraps instead of replacing by its seeded DistributedSampler, and its order would
    # then come from the global RNG, which a resumed run does not restore.
    loader = StatefulDataLoader(data, batch_size=BATCH_SIZE, sampler=RandomSampler(data))
    trainer.fit(model, loader, ckpt_path=ckpt_path)
    if trainer.global_rank == 0 and args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.net.state_dict(), args.out)


if __name__ == "__main__":
    main()
