"""An FSDP2 job with sharded (DCP) checkpoints under the controller, for real (issue 29):
``examples/train_fsdp.py`` on CPU (gloo), every rank writing its shards through
``lazarus.rank.dcp``.

Two faults, one reference. A SIGKILLed rank: the job restarts on the same two ranks
from the last committed DCP directory. A lost node with no spare and ``min_nodes: 1``:
the job shrinks to one rank, and DCP reshards the two-rank checkpoint into the world
of one. Both end with weights equal, bit for bit, to a fault-free two-rank run under
plain ``torchrun``: the example's math does not depend on the world size (every rank
sees the whole batch, and FSDP's averaged gradient of equal gradients is exact).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from infra import chaos
from lazarus.domain.spec import JobSpec
from tests.e2e.conftest import REPO, Job, assert_same_weights, ddp_spec
from tests.fsdp_example import fsdp_command, torchrun_fsdp
from tests.reference_weights import shared_once
from workflows.state import Incident, JobStatus, Phase

StartJob = Callable[..., Awaitable[Job]]
STEPS = 20
CKPT_EVERY = 5
KILL_AT = CKPT_EVERY + 2
"""Past the first committed checkpoint: ``save_sharded`` commits before the next step."""


def run_fault_free(workdir: Path) -> Path:
    """The example straight through on two ranks under torchrun, no Lazarus, no sleep."""
    return torchrun_fsdp(
        workdir, workdir / "checkpoints", nproc=2, steps=STEPS, ckpt_every=CKPT_EVERY
    )


@pytest.fixture(scope="session")
def fsdp_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_once(tmp_path_factory, f"fsdp-reference-2x{STEPS}", run_fault_free)


def fsdp_spec(tmp_path: Path, **overrides: Any) -> JobSpec:
    return ddp_spec(
        tmp_path,
        command=fsdp_command(
            tmp_path / "out" / "model.pt", steps=STEPS, ckpt_every=CKPT_EVERY, step_time=0.2
        ),
        env={"PYTHONPATH": str(REPO)},
        **overrides,
    )


def resumed_from_a_checkpoint(status: JobStatus) -> Incident:
    assert status.phase == Phase.SUCCEEDED, status
    assert len(status.incidents) == 1, [(i.kind, i.action) for i in status.incidents]
    [incident] = status.incidents
    step = incident.resumed_from_step
    assert step is not None and step >= CKPT_EVERY and step % CKPT_EVERY == 0, incident
    return incident


@pytest.mark.timeout(240)
async def test_fsdp_rank_killed_resumes_from_its_sharded_checkpoint(
    start_job: StartJob, tmp_path: Path, fsdp_reference: Path
) -> None:
    job = await start_job(fsdp_spec(tmp_path))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, KILL_AT)
    chaos.signal_rank(job.run_root, rank=1, sig=signal.SIGKILL)
    status = await job.result(timeout_s=180)
    incident = resumed_from_a_checkpoint(status)
    assert incident.kind == "crash" and status.generation == 2
    assert status.world_size == 2
    assert_same_weights(job.weights, fsdp_reference)


@pytest.mark.timeout(240)
async def test_fsdp_shrinks_with_min_nodes_and_reshards_its_checkpoint(
    start_job: StartJob, tmp_path: Path, fsdp_reference: Path
) -> None:
    spec = fsdp_spec(
        tmp_path, nproc_per_node=1, nodes=[{"name": "a"}, {"name": "b"}], spares=[], min_nodes=1
    )
    job = await start_job(spec)
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, KILL_AT)
    assert chaos.kill_node(job.run_root, "b") == [1]
    status = await job.result(timeout_s=180)
    incident = resumed_from_a_checkpoint(status)
    assert incident.kind == "node_lost" and incident.action == "shrink"
    assert status.nodes.active == ["a"] and status.world_size == 1
    assert_same_weights(job.weights, fsdp_reference)
