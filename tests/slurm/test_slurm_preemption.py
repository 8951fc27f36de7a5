"""Preemption on a real Slurm (issue 13): the holder of the allocation is asked for
``--signal=B:USR1@60`` and traps USR1 into a notice file (:func:`holder_script`);
``scancel --signal=USR1 --batch J`` is what Slurm sends before preempting the job
or at its time limit. Lazarus must save just in time (0 steps lost) and pause. An
allocation that ends without a notice (cancelled, timed out) is a ``preempted``
incident too, and the job pauses with nothing left running.

Each test runs its own cluster: a preempted or cancelled allocation is not the
session's to spend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from activities.nodes.rundir import read_json
from activities.nodes.slurm.preemption import holder_script
from infra import chaos
from infra.slurm import TestSlurm
from lazarus.app.devserver import DevServer
from lazarus.domain.api import SIGNAL_RESUME
from lazarus.domain.failure_classes import FailureClass
from tests.slurm.test_slurm_e2e import (
    all_generations,
    assert_weights,
    harness,
    lazarus_steps,
    reference,
    slurm_job_spec,
)
from workflows.playbook import Action
from workflows.state import Phase

__all__ = ["reference"]  # the module-scoped fixture, shared with test_slurm_e2e

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(600)
async def test_usr1_to_the_holder_checkpoints_just_in_time_and_pauses(
    own_slurm: Callable[[], TestSlurm], dev_server: DevServer, tmp_path: Path, reference: Path
) -> None:
    cluster = own_slurm()
    runs = tmp_path / "runs"
    runs.mkdir()
    job_id = cluster.allocate(3, extra_args=("--signal=B:USR1@60",), holder=holder_script(runs))
    spec = slurm_job_spec(tmp_path, job_id, step_time=0.25)
    assert spec.run_dir == str(runs)
    async with harness(dev_server, tmp_path, cluster) as h:
        job = await h.start(spec)
        await asyncio.to_thread(chaos.wait_for_step, job.run_root, 15, 240.0)
        sent = cluster.command("scancel", "--signal=USR1", "--batch", str(job_id))
        assert sent.returncode == 0, sent.stderr
        status = await job.wait_phase(Phase.PAUSED, timeout_s=180)

        [incident] = status.incidents
        assert (incident.kind, incident.failure_class, incident.action) == (
            "preempted",
            FailureClass.PREEMPTED,
            Action.PAUSE,
        ), incident
        assert any("USR1" in line for line in incident.evidence), incident.evidence
        [stop] = status.planned_stops
        [gen] = all_generations(job)
        trained = max(int((read_json(gen.heartbeat_file(r)) or {})["step"]) for r in (0, 1))
        assert stop.checkpoint_step is not None and stop.checkpoint_step >= 15, stop
        assert stop.checkpoint_step == trained == stop.step_at_stop, (stop, trained)
        assert stop.steps_lost == 0 and incident.steps_lost == 0, (stop, incident)
        assert lazarus_steps(job_id) == [], "a paused job holds no Slurm step"

        # The allocation still runs (the notice came with time left): resume in it.
        # The notice file is still there; it was handled and must not pause again.
        await job.handle.signal(SIGNAL_RESUME)
        final = await job.result(timeout_s=300)
        assert final.phase == Phase.SUCCEEDED, final
        assert final.generation == 2 and len(final.incidents) == 1, final.incidents
        assert final.incidents[0].resumed_from_step == stop.checkpoint_step
        assert final.incidents[0].steps_lost == 0
        assert_weights(job, reference)


@pytest.mark.timeout(600)
async def test_an_allocation_that_ends_without_notice_is_a_preemption(
    own_slurm: Callable[[], TestSlurm], dev_server: DevServer, tmp_path: Path
) -> None:
    cluster = own_slurm()
    job_id = cluster.allocate(3)
    async with harness(dev_server, tmp_path, cluster) as h:
        job = await h.start(slurm_job_spec(tmp_path, job_id, step_time=0.25))
        await asyncio.to_thread(chaos.wait_for_step, job.run_root, 10, 240.0)
        ended = cluster.command("scancel", str(job_id))
        assert ended.returncode == 0, ended.stderr
        status = await job.wait_phase(Phase.PAUSED, timeout_s=180)
        [incident] = status.incidents
        assert (incident.kind, incident.failure_class) == ("preempted", FailureClass.PREEMPTED)
        assert any("allocation ended" in line for line in incident.evidence), incident.evidence
        assert incident.step_at_failure is not None and incident.step_at_failure >= 10
        assert lazarus_steps(job_id) == []
