"""Lazarus for an Accelerate training loop: three calls.

Accelerate has no callback; its loop is the user's. ``load_state`` at startup,
``step_end`` after every optimizer step, and ``save_state`` when it says so::

    start = load_state(accelerator)            # 0, or the step Lazarus resumes from
    for step in range(start, total):
        ...
        if step_end(accelerator, step + 1, loss=loss, every=10):
            save_state(accelerator, step + 1)

``save_state`` writes with Accelerate's own ``accelerator.save_state`` (model,
optimizer, scheduler, RNG per process) into Lazarus's step directory and commits it
on the main process after ``wait_for_everyone``, so the checkpoint joins the verified
ledger; ``load_state`` restores the step the controller chose.

The data position: a resume from a step in the middle of an epoch must go on at that
epoch's next batch, not at the epoch's start. ``batches`` does it from the step alone
(one batch a step), the way Accelerate's documentation resumes: the resumed epoch's
first batches skipped by ``accelerator.skip_first_batches`` (no batch loaded), every
epoch's order set by ``set_epoch``::

    for step, batch in batches(accelerator, loader, start, total):
        ...

That needs an epoch's order to be a function of the seed and the epoch, so prepare the
loader with ``DataLoaderConfiguration(use_seedable_sampler=True)`` when it shuffles
(without it, each epoch's order comes from a generator that a resumed process starts
afresh, and ``batches`` warns).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import accelerate
from accelerate.data_loader import SeedableRandomSampler
from torch.utils.data import RandomSampler

import lazarus.rank.torch as lz_torch
from lazarus.rank import checkpoints, heartbeats, resume


def load_state(accelerator: accelerate.Accelerator) -> int:
    """Restore the checkpoint Lazarus chose (outside Lazarus: the newest committed)
    with ``accelerator.load_state``; returns the step to continue from (0: fresh)."""
    point = resume.resume_point()
    if point is None:
        return 0
    step, directory = point
    accelerator.load_state(str(directory))
    return step


def step_end(
    accelerator: accelerate.Accelerator, step: int, *, every: int | None = None, **metrics: Any
) -> bool:
    """Heartbeat completed step ``step`` and say whether to checkpoint it now (a
    controller request, or the interval: the controller's, else ``every``). A
    collective: every process calls it at the same step."""
    heartbeats.heartbeat(step, **metrics)
    return lz_torch.should_checkpoint(step, every=every)


def save_state(accelerator: accelerate.Accelerator, step: int) -> Path:
    """Save with ``accelerator.save_state`` into the step directory and commit it on
    the main process once every process has saved; returns the directory."""
    directory = checkpoints.checkpoint_path(step)
    accelerator.save_state(str(directory))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        checkpoints.commit_checkpoint(step)
    accelerator.wait_for_everyone()
    return directory


def batches(
    accelerator: accelerate.Accelerator, loader: Any, start: int, stop: int
) -> Iterator[tuple[int, Any]]:
    """``(step, batch)`` for steps ``start`` to ``stop - 1`` of ``loader`` (prepared by
    ``accelerator``), one batch a step: the resumed epoch from its batch ``start %
    len(loader)`` on, then whole epochs, each given its number with ``set_epoch`` so
    that it is drawn in the order of an uninterrupted run."""
    sampler = _sampler(loader)
    if isinstance(sampler, RandomSampler) and not isinstance(sampler, SeedableRandomSampler):
        warnings.warn(
            "lazarus: the loader shuffles without Accelerate's seedable sampler, so a "
            "resumed run draws its epochs in other orders (weights unlike an "
            "uninterrupted run's): Accelerator(dataloader_config=DataLoaderConfiguration("
            "use_seedable_sampler=True))",
            stacklevel=2,
        )
    step = start
    epoch, skip = divmod(start, len(loader))
    while step < stop:
        current = accelerator.skip_first_batches(loader, skip) if skip else loader
        current.set_epoch(epoch)
        for batch in current:
            if step == stop:
                return
            yield step, batch
            step += 1
        epoch, skip = epoch + 1, 0


def _sampler(loader: Any) -> object:
    """The sampler that orders ``loader``'s epochs under Accelerate's wrappers: the
    batch sampler's, inside the ``BatchSamplerShard`` of several processes
    (``accelerate.data_loader.get_sampler`` finds none there)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    return getattr(getattr(batch_sampler, "batch_sampler", batch_sampler), "sampler", None)
