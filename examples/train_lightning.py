"""A PyTorch Lightning job under Lazarus: the user's ``Trainer`` unchanged, plus one
callback (:class:`lazarus.rank.integrations.lightning.LazarusCallback`) and one
resume call. Deterministic (fixed data, no shuffling, seeded), so a run interrupted
and resumed from an epoch-end checkpoint ends with the weights of a fault-free run.

    lazarus start examples/jobs/lightning_demo.yaml          # 2 ranks, DDP over gloo

``--out`` names where rank 0 saves the final ``state_dict`` (the tests compare it).
``--no-lazarus`` drops the callback: the job still restarts under Lazarus, from no
checkpoint (docs/guides/frameworks.md shows the difference).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lazarus.rank.integrations.lightning import LazarusCallback, resume_checkpoint

BATCH = 8


class Regression(LightningModule):
    """A tiny model with a real optimizer state (momentum), slowed to ``step_time``
    a step so a fault can land mid-run."""

    def __init__(self, step_time: float) -> None:
        super().__init__()
        self.layer = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
        self.step_time = step_time

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        features, target = batch
        time.sleep(self.step_time)
        return nn.functional.mse_loss(self.layer(features), target)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def data(steps_per_epoch: int, world: int) -> DataLoader[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(1234)
    count = steps_per_epoch * BATCH * world
    features = torch.randn(count, 16, generator=generator)
    target = features.sum(dim=1, keepdim=True).tanh()
    return DataLoader(TensorDataset(features, target), batch_size=BATCH, shuffle=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--steps-per-epoch", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-lazarus", action="store_true", help="no callback, no resume")
    args = parser.parse_args()

    seed_everything(0, workers=True)
    model = Regression(args.step_time)
    callbacks: list[Callback] = []
    if not args.no_lazarus:
        callbacks.append(LazarusCallback(every_n_steps=args.steps_per_epoch))
    trainer = Trainer(
        accelerator="cpu",
        strategy="ddp",
        # What the launcher set (Lazarus as torchrun): Lightning checks it matches.
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        max_epochs=args.epochs,
        callbacks=callbacks,
        enable_checkpointing=False,  # Lightning's own ModelCheckpoint: the ledger replaces it
        enable_progress_bar=False,
        logger=False,
        deterministic=True,
    )
    world = int(os.environ.get("WORLD_SIZE", "1"))
    ckpt_path = None if args.no_lazarus else resume_checkpoint()
    trainer.fit(model, data(args.steps_per_epoch, world), ckpt_path=ckpt_path)
    if args.out is not None and trainer.global_rank == 0:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
