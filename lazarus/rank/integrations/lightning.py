"""Lazarus for PyTorch Lightning: one callback and one resume call.

    from lazarus.rank.integrations.lightning import LazarusCallback, resume_checkpoint

    trainer = L.Trainer(strategy="ddp", callbacks=[LazarusCallback(every_n_steps=50)])
    trainer.fit(model, data, ckpt_path=resume_checkpoint())

Lightning runs under Lazarus unchanged: Lazarus sets the variables torchrun sets,
``TORCHELASTIC_RUN_ID`` among them, so Lightning picks its ``TorchElasticEnvironment``
and takes rank, world and store from them, and a crash restarts the generation from
whatever checkpoint the script itself finds. What the callback adds:

* **Heartbeats every batch** (throttled by :func:`lazarus.rank.heartbeat`): a hung rank
  is told from a slow one, stragglers are measured, and status shows the step.
* **The verified ledger.** Lightning's own checkpoint (``trainer.save_checkpoint``,
  weights, optimizer and loop state) is written into
  :func:`lazarus.rank.checkpoint_path` and sealed by rank 0
  (:func:`lazarus.rank.commit_checkpoint`: manifest, then ``COMMITTED``). The
  controller then verifies it, falls back past a torn one, tiers it to S3 and picks
  the resume point, which :func:`resume_checkpoint` hands to ``trainer.fit``.
* **Checkpoints when the controller asks**: ``lazarus pause`` and preemption notices
  save just in time, at the next batch end.

Why at ``every_n_steps`` and not at any step: Lightning restarts an interrupted epoch
from its first batch unless the dataloader is stateful, so a checkpoint taken
mid-epoch resumes exactly only with such a loader. Choose ``every_n_steps`` as the
steps of an epoch (or a multiple) for a resume that matches a fault-free run, as the
example does; a request from the controller is answered at once regardless.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

import lazarus.rank as lazarus_rank
import lazarus.rank.torch as lazarus_torch

CHECKPOINT_FILE = "lightning.ckpt"
"""The file of Lightning's checkpoint inside a ledger step's directory."""


class LazarusCallback(Callback):
    """Heartbeats every batch; Lightning's checkpoint through the ledger every
    ``every_n_steps`` optimizer steps (the controller's interval wins when it sets
    one) and whenever the controller asks. See the module docstring."""

    def __init__(self, every_n_steps: int) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps={every_n_steps} must be >= 1")
        self.every_n_steps = every_n_steps

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step
        loss = _loss_of(outputs)
        lazarus_rank.heartbeat(step, **({"loss": loss} if loss is not None else {}))
        if lazarus_rank.checkpoint_dir() is None:
            return  # outside Lazarus, with no directory configured: no ledger to write
        # A collective: rank 0 decides, every rank saves (Lightning's save is one too).
        if lazarus_torch.should_checkpoint(step, every=self.every_n_steps):
            save(trainer, step)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        lazarus_rank.flush_heartbeat()


def save(trainer: Trainer, step: int) -> Path:
    """Lightning's checkpoint of ``step`` into the ledger, sealed by rank 0 once every
    rank is past the save (``trainer.save_checkpoint`` ends in a barrier). Every rank
    calls it."""
    path = lazarus_rank.checkpoint_path(step) / CHECKPOINT_FILE
    trainer.save_checkpoint(path)
    trainer.strategy.barrier("lazarus.save")
    if trainer.global_rank == 0:
        lazarus_rank.commit_checkpoint(step)
    return path


def resume_checkpoint() -> str | None:
    """The Lightning checkpoint the controller chose to resume from, for
    ``trainer.fit(ckpt_path=...)``; None on a fresh start (or outside Lazarus with no
    committed checkpoint). A resume point without Lightning's file (a memory-tier
    snapshot, say) is an error: this job's checkpoints are Lightning's."""
    directory = lazarus_rank.resume_path()
    if directory is None:
        return None
    path = Path(directory) / CHECKPOINT_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"the resume point {directory} has no {CHECKPOINT_FILE}: it was not written "
            "by LazarusCallback (turn the memory tier off for Lightning jobs)"
        )
    return str(path)


def _loss_of(outputs: Any) -> float | None:
    """The loss ``training_step`` returned (a tensor, or a dict's ``"loss"``), if any."""
    value: Any = outputs.get("loss") if isinstance(outputs, dict) else outputs
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
