"""The controller's half of the memory tier with real ranks, without the workflow.

The real launcher starts the 2-rank DDP example with ``memory_every_steps: 1`` and a
disk interval of 20; rank 1 is SIGKILLed past step 25; after the stop, the real
checkpoint search must choose the memory tier (not disk step 20) and lose at most
two steps, and a relaunch from it must end with the weights of a fault-free run.
The workflow does the same steps (stop, find, launch); this pins the activities'
side whatever the workflow wiring.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.checkpoints.find import search_verified
from activities.launcher import launch_generation, run_memory_dir
from activities.nodes.rundir import GenerationDir, read_json
from activities.stop import stop_generations
from infra import chaos
from infra.reference_run import run_reference, weights_match
from lazarus.domain.checkpoint_layout import committed_steps
from lazarus.domain.contracts import FindVerifiedCheckpointRequest, LaunchRequest, StopRequest
from lazarus.domain.memory_tier import MEMORY_ROOT, node_memory_dir, on_node
from lazarus.domain.spec import JobSpec, parse_spec
from tests import tiers

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_ddp.py"
STEPS = 60
STEP_LINE = re.compile(rb"^step (\d+) loss", re.MULTILINE)


def memory_spec(tmp_path: Path, name: str) -> JobSpec:
    return parse_spec(
        {
            "name": name,
            "command": [
                sys.executable,
                str(EXAMPLE),
                "--steps",
                str(STEPS),
                "--step-time",
                "0.05",
                "--ckpt-every",
                "10",  # the controller's interval (20) must win over the script's own
                "--out",
                str(tmp_path / "out" / "model.pt"),
            ],
            "workdir": str(tmp_path),
            "nproc_per_node": 2,
            "checkpoint_dir": str(tmp_path / "checkpoints"),
            "run_dir": str(tmp_path / "runs"),
            "checkpoints": {"memory_every_steps": 1, "every_steps": 20},
        },
        "<test>",
    ).resolved(tmp_path)


@pytest.fixture
def spec(tmp_path: Path) -> Iterator[JobSpec]:
    spec = memory_spec(tmp_path, f"mem-{uuid.uuid4().hex[:8]}")
    yield spec
    asyncio.run(
        stop_generations(
            StopRequest(
                job_id=spec.job_id, run_root=str(Path(spec.run_dir) / spec.job_id), grace_s=0
            )
        )
    )
    shutil.rmtree(Path(on_node(MEMORY_ROOT, os.getuid())) / spec.job_id, ignore_errors=True)


def last_step_logged(gen: GenerationDir) -> int:
    """The newest step any rank finished, from the logs (heartbeats are throttled)."""
    steps = [int(m) for rank in (0, 1) for m in STEP_LINE.findall(gen.log_file(rank).read_bytes())]
    return max(steps, default=0)


def wait_for_exit(gen: GenerationDir, timeout_s: float = 120.0) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = [read_json(gen.exit_file(rank)) for rank in (0, 1)]
        if all(records):
            return [r for r in records if r is not None]
        time.sleep(0.1)
    raise TimeoutError(f"{gen.path}: ranks still running after {timeout_s:.0f} s")


@tiers.twin_of(
    "tests/e2e/test_memory_tier.py::test_a_crash_resumes_from_the_memory_tier_losing_at_most_two_steps",
    "without the workflow (the same stop, search and launch activities, called by the test)",
)
@pytest.mark.timeout(300)
def test_a_crash_resumes_from_the_memory_tier_with_fault_free_weights(
    tmp_path: Path, spec: JobSpec
) -> None:
    reference = run_reference(tmp_path / "reference", steps=STEPS)
    run_root = Path(spec.run_dir) / spec.job_id / "run-1"
    first = launch_generation(LaunchRequest(spec=spec, generation=1, run_root=str(run_root)))
    gen1 = GenerationDir(Path(first.run_dir))
    memory_dir = run_memory_dir(spec, gen1)
    assert memory_dir == f"{MEMORY_ROOT}/{spec.job_id}/run-1"

    chaos.wait_for_step(run_root, 25)
    chaos.signal_rank(run_root, rank=1, sig=signal.SIGKILL)
    asyncio.run(
        stop_generations(StopRequest(job_id=spec.job_id, run_root=str(run_root), grace_s=0))
    )
    crashed_at = last_step_logged(gen1)

    search = search_verified(
        FindVerifiedCheckpointRequest(
            checkpoint_dir=spec.checkpoint_dir,
            checkpoints=spec.checkpoints,
            expected_world_size=spec.world_size,
            job_id=spec.job_id,
            memory_dir=memory_dir,
        )
    )

    assert search.location == "memory", search
    assert search.chosen is not None
    assert search.chosen.path.startswith(memory_dir + "/")
    assert crashed_at - search.chosen.step <= 2, (crashed_at, search.chosen.step)
    disk = sorted(p.name for p in Path(spec.checkpoint_dir).iterdir() if p.name.startswith("step-"))
    assert disk == ["step-00000020"], "the controller's disk interval (20) wins over --ckpt-every"

    second = launch_generation(
        LaunchRequest(spec=spec, generation=2, run_root=str(run_root), resume=search.chosen)
    )
    gen2 = GenerationDir(Path(second.run_dir))
    exits = wait_for_exit(gen2)
    assert [r.get("exit_code") for r in exits] == [0, 0], gen2.log_file(0).read_text()[-2000:]
    log = gen2.log_file(0).read_text()
    assert f"resumed from step {search.chosen.step}" in log
    assert weights_match(Path(spec.workdir) / "out" / "model.pt", reference)
    mine = node_memory_dir(memory_dir, spec.nodes[0].name)  # the node's own directory
    kept = committed_steps(Path(on_node(mine, os.getuid())))
    assert kept and kept[-1][0] > search.chosen.step, "the relaunch keeps snapshotting"
