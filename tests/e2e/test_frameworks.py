"""Frameworks under Lazarus, for real: PyTorch Lightning's ``Trainer`` with DDP over
gloo (``examples/train_lightning.py``), a rank SIGKILLed mid-run, and the job resumes
from Lightning's own checkpoint (written through the ledger by
:class:`lazarus.rank.integrations.lightning.LazarusCallback`) with the weights of a
fault-free run under plain torchrun."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from lazarus.app import chaos
from tests.e2e.conftest import REPO, Job, assert_same_weights, ddp_spec
from workflows.state import Phase

pytest.importorskip("lightning")

StartJob = Callable[..., Awaitable[Job]]
LIGHTNING = REPO / "examples" / "train_lightning.py"
EPOCHS, STEPS_PER_EPOCH = 6, 10
"""60 optimizer steps; the callback commits Lightning's checkpoint at each epoch's end."""


def lightning_args(out: Path, step_time: float) -> list[str]:
    return [
        str(LIGHTNING),
        "--epochs",
        str(EPOCHS),
        "--steps-per-epoch",
        str(STEPS_PER_EPOCH),
        "--step-time",
        str(step_time),
        "--out",
        str(out),
    ]


def torchrun_reference(tmp_path: Path) -> Path:
    """The same Trainer run straight through under plain torchrun, no Lazarus."""
    out = tmp_path / "reference" / "model.pt"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    done = subprocess.run(
        [*argv, *lightning_args(out, 0.0)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.mark.timeout(420)
async def test_a_lightning_job_resumes_from_its_own_checkpoint_with_equal_weights(
    start_job: StartJob, tmp_path: Path
) -> None:
    reference = await asyncio.to_thread(torchrun_reference, tmp_path)
    spec = ddp_spec(
        tmp_path,
        command=["python", *lightning_args(tmp_path / "out" / "model.pt", 0.1)],
        warm_start={"preload": ["torch", "lightning.pytorch"]},
    )
    job = await start_job(spec)
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 25)
    chaos.signal_rank(job.run_root, rank=1, sig=signal.SIGKILL)
    status = await job.result(timeout_s=300)
    assert status.phase == Phase.SUCCEEDED, status.incidents
    [incident] = status.incidents
    assert incident.rank == 1 and incident.signal == "SIGKILL"
    # Lightning's epoch-end checkpoint of step 20 or 30, through the ledger.
    assert incident.resumed_from_step in (20, 30)
    assert_same_weights(job.weights, reference)
