"""Lazarus for Lightning's ``Trainer``: ``callbacks=[LazarusCallback()]`` and
``trainer.fit(model, ckpt_path=resume_ckpt_path())``.

Why a callback and not Lightning's ``ModelCheckpoint``: ``ModelCheckpoint`` writes
where and when it likes, and a file it is half-way through writing looks like any
other. This callback saves with ``trainer.save_checkpoint`` (Lightning's own format,
loops and optimizer state included) into the step directory Lazarus names
(:func:`lazarus.rank.checkpoint_path`), and rank 0 commits it (manifest +
``COMMITTED``) after a barrier, so the controller only ever resumes from a whole
save and can fall back past a bad one. It saves on the controller's requests (the
just-in-time save of ``pause``) and on the interval (the controller's, else
``every``), and heartbeats every batch so a hung rank is told from a slow one.

Lightning under Lazarus: Lazarus launches each rank itself with the torchrun
variables (``TORCHELASTIC_RUN_ID``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``), so
Lightning picks its ``TorchElasticEnvironment`` and does not spawn processes:
``Trainer(strategy="ddp", accelerator="cpu", devices=<nproc_per_node>,
num_nodes=<nodes>)``. Rejoin in place is not supported: a failure restarts the
whole generation, which resumes from :func:`resume_ckpt_path`.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

import lazarus.rank as lz
import lazarus.rank.torch as lz_torch
from lazarus.rank.integrations.ledger import loss_of, resume_file

CHECKPOINT_FILE = "lightning.ckpt"
"""The file ``trainer.save_checkpoint`` writes inside a Lazarus step directory."""


def resume_ckpt_path() -> str | None:
    """The Lightning checkpoint to pass to ``trainer.fit(ckpt_path=...)``: the one in
    the step directory the controller chose (outside Lazarus, the newest committed
    one), or None to start fresh. Call it once, at startup."""
    return resume_file(CHECKPOINT_FILE)


class LazarusCallback(pl.Callback):
    """Heartbeats every batch; saves into the verified ledger when asked or due.

    ``every``: the script's own disk interval in optimizer steps (the controller's
    interval, when it sets one, wins; None: save only when the controller asks).
    """

    def __init__(self, every: int | None = None) -> None:
        self.every = every

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step
        lz.heartbeat(step, loss=loss_of(outputs))
        # A collective: every rank asks at the same batch, rank 0 decides.
        if lz_torch.should_checkpoint(step, every=self.every):
            self.save(trainer, step)

    def save(self, trainer: pl.Trainer, step: int) -> None:
        """Save ``step`` with Lightning's own ``save_checkpoint`` (every rank calls it;
        rank 0 writes) and commit it once every rank is past the save."""
        path = lz.checkpoint_path(step) / CHECKPOINT_FILE
        trainer.save_checkpoint(path)
        trainer.strategy.barrier("lazarus-checkpoint")
        if trainer.global_rank == 0:
            lz.commit_checkpoint(step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        lz.flush_heartbeat()
