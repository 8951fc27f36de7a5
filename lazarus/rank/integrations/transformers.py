"""Lazarus for Hugging Face's ``Trainer``: ``callbacks=[LazarusTrainerCallback()]``
and ``trainer.train(resume_from_checkpoint=resume_checkpoint())``.

HF saves a checkpoint as a ``checkpoint-N`` directory under ``output_dir`` (model,
optimizer, scheduler, trainer state, one RNG file per rank); ``resume_from_checkpoint``
accepts any directory holding those files. So the callback lets HF save as it always
does and, once every rank has saved, rank 0 *moves* the files of ``checkpoint-N``
into Lazarus's step directory (:func:`lazarus.rank.checkpoint_path`, a rename on the
same filesystem: no copy) and commits it (manifest + ``COMMITTED``). That keeps HF's
own saving code, and keeps the verified ledger the one place checkpoints live, which
pointing ``output_dir`` at the ledger would not: HF's names and rotation would then
fight Lazarus's ``step-NNNNNNNN`` layout. Keep ``output_dir`` on the same filesystem
as the checkpoint directory.

It also heartbeats every step (hang and straggler detection) and sets
``control.should_save`` when the controller asks for a checkpoint (the just-in-time
save of ``pause``) or its interval is due. Rejoin in place is not supported: a
failure restarts the whole generation.

The data position: on a resume HF skips the batches of the resumed epoch that the
checkpoint's step already trained, so a mid-epoch resume goes on at the exact next
batch, in the epoch's own order (HF seeds it by epoch). ``ignore_data_skip=True``
turns that off and the resumed epoch starts over: the callback warns when it is set.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import transformers

import lazarus.rank.torch as lz_torch
from lazarus.rank import checkpoints, heartbeats
from lazarus.rank.integrations.ledger import move_into, resume_file

PREFIX_CHECKPOINT_DIR = "checkpoint"
"""HF's checkpoint directory prefix (``transformers.trainer_utils.PREFIX_CHECKPOINT_DIR``)."""


def resume_checkpoint() -> str | None:
    """The directory to pass to ``trainer.train(resume_from_checkpoint=...)``: the step
    the controller chose (outside Lazarus, the newest committed), or None."""
    return resume_file()


class LazarusTrainerCallback(transformers.TrainerCallback):
    """Heartbeats every step; turns the controller's requests into HF saves and
    commits HF's checkpoints into the verified ledger.

    ``every``: the script's own interval in steps when the controller sets none
    (None: HF's own ``save_steps`` still saves, and those saves are committed too).
    """

    def __init__(self, every: int | None = None) -> None:
        self.every = every

    def on_train_begin(
        self,
        args: transformers.TrainingArguments,
        state: transformers.TrainerState,
        control: transformers.TrainerControl,
        **kwargs: Any,
    ) -> None:
        if args.ignore_data_skip and state.is_world_process_zero:
            warnings.warn(
                "lazarus: ignore_data_skip=True, so a resume from a checkpoint saved "
                "mid-epoch starts that epoch over (batches trained twice, weights unlike "
                "an uninterrupted run's); HF's default skips them",
                stacklevel=2,
            )

    def on_step_end(
        self,
        args: transformers.TrainingArguments,
        state: transformers.TrainerState,
        control: transformers.TrainerControl,
        **kwargs: Any,
    ) -> None:
        heartbeats.heartbeat(state.global_step)
        # A collective: every rank asks at the same step, rank 0 decides.
        if lz_torch.should_checkpoint(state.global_step, every=self.every):
            control.should_save = True

    def on_save(
        self,
        args: transformers.TrainingArguments,
        state: transformers.TrainerState,
        control: transformers.TrainerControl,
        **kwargs: Any,
    ) -> None:
        step = state.global_step
        saved = Path(str(args.output_dir)) / f"{PREFIX_CHECKPOINT_DIR}-{step}"
        target = checkpoints.checkpoint_path(step)
        _barrier()  # every rank's RNG file is written
        if state.is_world_process_zero:
            move_into(saved, target)
            checkpoints.commit_checkpoint(step)
        _barrier()  # nobody saves the next step over a commit in progress

    def on_train_end(
        self,
        args: transformers.TrainingArguments,
        state: transformers.TrainerState,
        control: transformers.TrainerControl,
        **kwargs: Any,
    ) -> None:
        heartbeats.flush_heartbeat()


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
