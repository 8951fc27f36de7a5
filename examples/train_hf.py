"""A tiny, deterministic Hugging Face ``Trainer`` job (DDP over gloo, CPU) that Lazarus
can kill and resume from HF's own checkpoint.

The model is built from a config (``GPT2Config``, one layer, 32 wide): nothing is
downloaded (``HF_HUB_OFFLINE=1``). The data is seeded random token ids. The one-line
integration is ``callbacks=[LazarusTrainerCallback(every=...)]`` plus
``resume_from_checkpoint=resume_checkpoint()``; ``--no-lazarus`` leaves both out and
uses HF's own ``save_steps`` and its newest ``checkpoint-N`` in ``--output-dir``.
HF skips the batches a resumed run already trained on, so the final weights (rank 0
saves them to ``--out``) equal an uninterrupted run's.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch
import transformers
from torch.utils.data import Dataset

from lazarus.rank.integrations.transformers import LazarusTrainerCallback, resume_checkpoint

VOCAB = 64
SEQUENCE = 16
BATCH_SIZE = 4


class RandomTokens(Dataset[dict[str, torch.Tensor]]):
    """``size`` sequences of seeded random token ids, labels equal to inputs."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (size, SEQUENCE), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


class SlowSteps(transformers.TrainerCallback):
    """Sleeps ``seconds`` per step and prints ``step N``, so a test can follow it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(self.seconds)
        print(f"step {state.global_step}", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epoch-batches", type=int, default=4, help="batches per rank an epoch")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--output-dir", type=Path, default=Path(".hf-out"))
    parser.add_argument("--no-lazarus", action="store_true", help="HF Trainer alone")
    args = parser.parse_args(argv)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    transformers.set_seed(args.seed)
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQUENCE,
        n_embd=32,
        n_layer=1,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config)
    training = transformers.TrainingArguments(
        output_dir=str(args.output_dir),
        max_steps=args.steps,
        per_device_train_batch_size=BATCH_SIZE,
        learning_rate=1e-3,
        seed=args.seed,
        use_cpu=True,
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,
        save_strategy="steps" if args.no_lazarus else "no",
        save_steps=args.ckpt_every,
        logging_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    callbacks: list[transformers.TrainerCallback] = [SlowSteps(args.step_time)]
    if args.no_lazarus:
        resume: str | bool | None = (
            any(args.output_dir.glob("checkpoint-*")) if args.output_dir.is_dir() else None
        ) or None
    else:
        callbacks.append(LazarusTrainerCallback(every=args.ckpt_every))
        resume = resume_checkpoint()
    trainer = transformers.Trainer(
        model=model,
        args=training,
        train_dataset=RandomTokens(BATCH_SIZE * world * args.epoch_batches, args.seed),
        callbacks=callbacks,
    )
    if resume:
        print(f"resumed from {resume}", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    if trainer.is_world_process_zero() and args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
