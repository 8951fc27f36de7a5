"""The unchanged-script example under the controller, for real: ``examples/train_unchanged.py``
imports nothing of Lazarus, and ``examples/jobs/unchanged_quick.yaml`` follows it with
``health.progress_regex`` alone.

The spec is the example file's own (its ``progress_regex``, health and recovery); only
the paths move into the test's folder. A SIGKILLed rank after the script's first
checkpoint: the job restarts the generation, the script resumes from its own file, and
the job ends SUCCEEDED at the last step, which the controller learnt from the log lines.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import chaos
from lazarus.domain.spec import JobSpec, parse_spec
from tests.e2e.conftest import REPO, Job
from workflows.state import Phase

StartJob = Callable[..., Awaitable[Job]]
SPEC = REPO / "examples" / "jobs" / "unchanged_quick.yaml"
STEPS = 40
CKPT_EVERY = 10
KILL_AFTER = CKPT_EVERY + 3


def example_spec(tmp_path: Path) -> JobSpec:
    """The example spec, its files moved under ``tmp_path``."""
    data: dict[str, Any] = yaml.safe_load(SPEC.read_text())
    data["name"] = f"unchanged-{uuid.uuid4().hex[:8]}"
    data["workdir"] = str(REPO)  # the command names examples/train_unchanged.py
    data["command"] = [
        "python",
        "examples/train_unchanged.py",
        "--steps",
        str(STEPS),
        "--step-time",
        "0.1",
        "--ckpt-every",
        str(CKPT_EVERY),
        "--ckpt",
        str(tmp_path / "ckpt" / "state.pt"),
        "--out",
        str(tmp_path / "out" / "model.pt"),
    ]
    data["run_dir"] = str(tmp_path / "runs")
    data["checkpoint_dir"] = str(tmp_path / "checkpoints")
    data["health"] = {**data["health"], "hang_timeout_s": 20}  # a loaded 2-core machine
    return parse_spec(data, str(SPEC)).resolved(tmp_path)


def logged_step(job: Job, rank: int) -> int:
    """The newest ``step <n>`` line in the rank's log of the newest generation."""
    generation = chaos.newest_generation(job.run_root)
    if generation is None:
        return 0
    try:
        text = generation.log_file(rank).read_text(errors="replace")
    except FileNotFoundError:
        return 0
    steps = [int(line.split()[1]) for line in text.splitlines() if line.startswith("step ")]
    return max(steps, default=0)


def wait_for_logged_step(job: Job, step: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while logged_step(job, 1) < step:
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 1 never printed step {step}")
        time.sleep(0.1)


@pytest.mark.timeout(300)
async def test_the_unchanged_script_restarts_and_succeeds(
    start_job: StartJob, tmp_path: Path
) -> None:
    spec = example_spec(tmp_path)
    assert spec.health.progress_regex is not None and spec.warm_start is None
    job = await start_job(spec)
    await asyncio.to_thread(wait_for_logged_step, job, KILL_AFTER)
    chaos.signal_rank(job.run_root, rank=1, sig=signal.SIGKILL)
    status = await job.result(timeout_s=240)
    assert status.phase == Phase.SUCCEEDED, status
    assert status.generation == 2, [(i.kind, i.action) for i in status.incidents]
    [incident] = status.incidents
    assert incident.kind == "crash" and incident.rank == 1, incident
    assert status.step == STEPS, status  # from the log lines, through progress_regex
    resumed = chaos.newest_generation(job.run_root)
    assert resumed is not None
    said = [
        int(line.split()[-1])
        for line in resumed.log_file(0).read_text().splitlines()
        if line.startswith("resumed from step ")
    ]
    assert said and said[0] >= CKPT_EVERY, said  # the script's own checkpoint
    assert (tmp_path / "out" / "model.pt").is_file()
