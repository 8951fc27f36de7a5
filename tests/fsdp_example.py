"""Running ``examples/train_fsdp.py`` (FSDP2, sharded DCP checkpoints) in the tests:
its command line, and a plain ``torchrun`` of it with no Lazarus controller."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.commands import run_ok

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "train_fsdp.py"


def fsdp_command(out: Path, *, steps: int, ckpt_every: int, step_time: float = 0.0) -> list[str]:
    """The example's command line; ``step_time`` leaves a test room to kill a rank."""
    return [
        sys.executable,
        str(SCRIPT),
        "--steps",
        str(steps),
        "--ckpt-every",
        str(ckpt_every),
        "--step-time",
        str(step_time),
        "--out",
        str(out),
    ]


def torchrun_fsdp(
    workdir: Path, checkpoint_dir: Path, *, nproc: int, steps: int, ckpt_every: int
) -> Path:
    """Run the example under ``torchrun --standalone`` (its own free rendezvous port)
    on ``nproc`` ranks, checkpointing into ``checkpoint_dir``, and return its final
    weights. Outside Lazarus the run resumes from the newest committed checkpoint
    there, as a ``torchrun`` restart would."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "model.pt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAZARUS_")}
    env |= {"LAZARUS_CHECKPOINT_DIR": str(checkpoint_dir), "PYTHONPATH": str(REPO)}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    script = fsdp_command(out, steps=steps, ckpt_every=ckpt_every)[1:]
    run_ok([*torchrun, f"--nproc-per-node={nproc}", *script], workdir, env, timeout_s=150)
    return out
