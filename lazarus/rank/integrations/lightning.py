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

The data position: a checkpoint saved mid-epoch resumes at the exact next batch only
with a resumable training loader (``state_dict``/``load_state_dict``, e.g. torchdata's
``StatefulDataLoader``): Lightning saves its position in the checkpoint and restores
it. A plain ``DataLoader`` restarts the epoch (batches trained twice, weights unlike an
uninterrupted run's), so the callback warns at the start of training. After a resume
the callback also works around two faults of Lightning 2.6.6 (measured): it creates the
restored iterator before it sets the sampler's epoch (Lightning issue 21938), so the
first epoch after a resume is drawn in epoch 0's shuffled order; and a loader position
saved at an epoch's last batch makes the next epoch an empty one, skipped.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.fabric.utilities.data import _set_sampler_epoch
from lightning.pytorch.utilities import rank_zero_warn

import lazarus.rank.torch as lz_torch
from lazarus.rank import checkpoints, heartbeats
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
        self._loader_states: list[dict[str, Any]] = []
        self._resumed = False

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Keep the loaders' saved positions: :meth:`on_train_start` loads them again."""
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
        self._loader_states = list(fit_loop.get("state_dict", {}).get("combined_loader", []))
        self._resumed = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Warn about a loader that cannot resume mid-epoch; after a resume, restart the
        training iterator in the resumed epoch's order, at the saved position."""
        loaders = trainer.fit_loop._combined_loader
        fetcher = trainer.fit_loop._data_fetcher
        if loaders is None or fetcher is None:
            return
        if trainer.num_training_batches > 1 and not all(map(_resumable, loaders.flattened)):
            rank_zero_warn(
                "lazarus: the training DataLoader has no state_dict/load_state_dict, so a "
                "resume from a checkpoint saved mid-epoch starts that epoch over (batches "
                "trained twice, weights unlike an uninterrupted run's): use torchdata's "
                "StatefulDataLoader (docs/guides/frameworks.md)"
            )
        if not self._resumed:
            return
        self._resumed = False
        # Lightning created the restored iterator (and drew its first indices) before
        # setting the sampler's epoch: set it, load the saved positions again and
        # iterate anew. After a save at an epoch's last batch Lightning starts the next
        # epoch: from its start (the saved position, at the end, would empty it).
        # The fit loop's epoch tracker is a _ProcessedTracker, typed as its base class.
        epoch: int = trainer.fit_loop.epoch_progress.current.processed  # type: ignore[attr-defined]
        for loader in loaders.flattened:
            _set_sampler_epoch(loader, epoch)
        if self._loader_states and not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            loaders._load_state_dicts(self._loader_states)
        self._loader_states = []
        iter(fetcher)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step
        heartbeats.heartbeat(step, loss=loss_of(outputs))
        # A collective: every rank asks at the same batch, rank 0 decides.
        if lz_torch.should_checkpoint(step, every=self.every):
            self.save(trainer, step)

    def save(self, trainer: pl.Trainer, step: int) -> None:
        """Save ``step`` with Lightning's own ``save_checkpoint`` (every rank calls it;
        rank 0 writes) and commit it once every rank is past the save."""
        path = checkpoints.checkpoint_path(step) / CHECKPOINT_FILE
        trainer.save_checkpoint(path)
        trainer.strategy.barrier("lazarus-checkpoint")
        if trainer.global_rank == 0:
            checkpoints.commit_checkpoint(step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        heartbeats.flush_heartbeat()


def _resumable(loader: object) -> bool:
    """Whether Lightning saves and restores ``loader``'s position (its own test)."""
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )
