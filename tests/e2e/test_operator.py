"""What an operator does to a job, through the CLI and through signals."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import yaml

from activities.stop import stop_generations
from infra import chaos
from lazarus.app.local_stack import LocalStack
from lazarus.domain.api import SIGNAL_FORCE_RECOVER, SIGNAL_PAUSE, SIGNAL_RESUME
from lazarus.domain.contracts import StopRequest
from tests.e2e.conftest import STEPS, Job, assert_same_weights, ddp_spec
from workflows.state import ForceRecover, Phase

StartJob = Callable[..., Awaitable[Job]]


def lazarus_cli(stack: LocalStack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lazarus.app.cli", *args],
        env=stack.worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.timeout(180)
async def test_pause_then_resume_completes(
    start_job: StartJob, tmp_path: Path, fault_free_weights: Path
) -> None:
    job = await start_job(ddp_spec(tmp_path, steps=STEPS, step_time=0.1))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 15)
    await job.handle.signal(SIGNAL_PAUSE)
    await job.wait_phase(Phase.PAUSED, timeout_s=60)
    assert chaos.live_rank_processes(job.run_root) == [], "a paused job holds no ranks"
    await job.handle.signal(SIGNAL_RESUME)
    status = await job.result()
    assert status.phase == Phase.SUCCEEDED
    assert status.generation == 2 and status.incidents == []
    [paused] = status.planned_stops
    assert paused.checkpoint_step is not None and paused.checkpoint_step > 15
    assert paused.steps_lost == 0, paused
    assert_same_weights(job.weights, fault_free_weights)


@pytest.mark.timeout(180)
async def test_force_recover_restarts_from_checkpoint(
    start_job: StartJob, tmp_path: Path, fault_free_weights: Path
) -> None:
    job = await start_job(ddp_spec(tmp_path, steps=STEPS, step_time=0.1))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 15)
    await job.handle.signal(SIGNAL_FORCE_RECOVER, ForceRecover(reason="suspect NIC"))
    status = await job.result()
    assert status.phase == Phase.SUCCEEDED
    assert status.generation == 2
    [incident] = status.incidents
    assert incident.kind == "operator" and "suspect NIC" in incident.reason
    assert incident.recovery_s is not None and incident.steps_lost is not None
    assert status.restarts == 0, "an operator's recovery does not spend the restart budget"
    assert_same_weights(job.weights, fault_free_weights)


@pytest.mark.timeout(180)
async def test_restart_budget_exhausted_needs_operator_then_cancel(
    start_job: StartJob, tmp_path: Path
) -> None:
    spec = ddp_spec(
        tmp_path,
        command=[sys.executable, "-c", "import sys; sys.exit(7)"],
        recovery={
            "max_restarts": 2,
            "backoff_initial_s": 0.1,
            "backoff_max_s": 0.2,
            "crash_loop_after": 10,
        },
    )
    job = await start_job(spec)
    status = await job.wait_phase(Phase.NEEDS_OPERATOR, timeout_s=90)
    assert status.restarts == 2 and len(status.incidents) == 3
    assert status.operator_reason and "restart budget spent" in status.operator_reason
    assert status.suggested_actions and "resume" in status.suggested_actions[0]
    assert all(i.failure_class == "unknown" for i in status.incidents)
    await job.handle.cancel()
    with pytest.raises(Exception):  # noqa: B017 - the workflow ends as cancelled
        await job.handle.result()
    assert chaos.live_rank_processes(job.run_root) == []


@pytest.mark.timeout(120)
async def test_cli_refuses_duplicate_start_and_reports_json(
    stack: LocalStack, tmp_path: Path
) -> None:
    spec = ddp_spec(tmp_path, steps=400, step_time=0.1)  # still RUNNING when queried, under load
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    first = lazarus_cli(stack, "start", str(spec_file))
    try:
        assert first.returncode == 0, first.stderr
        second = lazarus_cli(stack, "start", str(spec_file))
        assert second.returncode == 1
        assert "already running" in second.stderr + second.stdout
        renamed = lazarus_cli(
            stack, "start", str(spec_file), "--name", spec.name + "-b", "--dry-run"
        )
        assert renamed.returncode == 0, renamed.stderr
        await asyncio.to_thread(chaos.wait_for_step, Path(spec.run_dir) / spec.name, 5)
        shown = lazarus_cli(stack, "status", spec.name, "--json")
        assert shown.returncode == 0, shown.stderr
        data = json.loads(shown.stdout)
        assert {"phase", "generation", "step", "ettr", "incidents"} <= data.keys()
        assert data["phase"] == "RUNNING"
    finally:
        lazarus_cli(stack, "cancel", spec.name)
        await stop_generations(
            StopRequest(
                job_id=spec.name,
                run_root=str(Path(spec.run_dir) / spec.name),
                grace_s=0,
                end_of_run=True,
            )
        )
    cancelled = lazarus_cli(stack, "cancel", spec.name)
    assert cancelled.returncode == 0, "cancel is idempotent"


@pytest.mark.timeout(180)
async def test_continue_as_new_adopts_live_ranks(
    start_job: StartJob, tmp_path: Path, fault_free_weights: Path
) -> None:
    spec = ddp_spec(tmp_path, steps=STEPS, step_time=0.1, health={"report_interval_s": 1.0})
    job = await start_job(spec, continue_as_new_after_events=25)
    status = await job.result()
    assert status.phase == Phase.SUCCEEDED
    assert status.runs > 1, "the workflow should have continued as new"
    assert status.generation == 1, "continue-as-new must adopt the ranks, not relaunch them"
    assert_same_weights(job.weights, fault_free_weights)


@pytest.mark.timeout(120)
async def test_import_error_escalates_without_a_blind_restart(
    start_job: StartJob, tmp_path: Path
) -> None:
    spec = ddp_spec(tmp_path, command=[sys.executable, "-c", "import no_such_module_xyz"])
    job = await start_job(spec)
    status = await job.wait_phase(Phase.NEEDS_OPERATOR, timeout_s=60)
    [incident] = status.incidents
    assert incident.failure_class == "user_code" and status.restarts == 0
    assert any("no_such_module_xyz" in line for line in incident.evidence)
    assert status.operator_reason and "before the first step" in status.operator_reason


@pytest.mark.timeout(120)
async def test_crash_loop_escalates_before_the_budget(start_job: StartJob, tmp_path: Path) -> None:
    spec = ddp_spec(
        tmp_path,
        command=[sys.executable, "-c", "import sys; sys.exit(7)"],
        recovery={
            "max_restarts": 50,
            "backoff_initial_s": 0.1,
            "backoff_max_s": 0.2,
            "crash_loop_after": 2,
        },
    )
    job = await start_job(spec)
    status = await job.wait_phase(Phase.NEEDS_OPERATOR, timeout_s=60)
    assert len(status.incidents) == 3 and status.restarts == 2
    assert status.operator_reason and "crash loop" in status.operator_reason


@pytest.mark.timeout(240)
async def test_cancel_then_start_again_trains_on_from_the_newest_checkpoint(
    start_job: StartJob, tmp_path: Path, fault_free_weights: Path
) -> None:
    """Issue 10, defect 1: a new start used to adopt the old start's launch.json and
    exit files (SUCCEEDED without training) or trip on its fences. Each start now has
    its own run directory; the checkpoints, which are the job's, carry over."""
    spec = ddp_spec(tmp_path, steps=STEPS, step_time=0.1)
    first = await start_job(spec)
    await asyncio.to_thread(chaos.wait_for_step, first.run_root, 25)
    await first.handle.cancel()
    cancelled = await first.wait_phase(Phase.CANCELLED, timeout_s=90)
    assert chaos.live_rank_processes(first.run_root) == []

    second = await start_job(spec)
    status = await second.result()
    assert status.phase == Phase.SUCCEEDED
    assert status.run_dir != cancelled.run_dir
    assert status.resume_step is not None and status.resume_step >= 20, status.resume_step
    assert_same_weights(second.weights, fault_free_weights)


@pytest.mark.timeout(180)
async def test_cli_refuses_a_typo_in_exclude_node_and_a_resume_of_a_running_job(
    start_job: StartJob, stack: LocalStack, tmp_path: Path
) -> None:
    """Issue 10, defects 5 and 6: ``recover --exclude-node no-such-node`` exited 0 and
    left a 2-rank local job in NEEDS_OPERATOR; a stray ``resume`` was remembered."""
    job = await start_job(ddp_spec(tmp_path, steps=400, step_time=0.1))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 5)
    typo = lazarus_cli(stack, "recover", job.spec.name, "--exclude-node", "no-such-node")
    assert typo.returncode != 0
    assert "no-such-node" in typo.stderr and "not running this job" in typo.stderr
    stray = lazarus_cli(stack, "resume", job.spec.name)
    assert stray.returncode != 0 and "nothing sent" in stray.stderr
    await asyncio.sleep(3)
    status = await job.status()
    assert status.phase == Phase.RUNNING and status.generation == 1
    assert status.nodes.quarantined == [] and status.world_size == 2


@pytest.mark.timeout(180)
async def test_logs_watch_and_wait_follow_a_real_job(
    start_job: StartJob, stack: LocalStack, tmp_path: Path
) -> None:
    """A script's view of a job (issue 29): ``logs`` prints the ranks' own output,
    ``status --watch`` into a pipe prints a line per change as it happens, and
    ``wait`` blocks until the end and exits 0 with the outcome."""
    job = await start_job(ddp_spec(tmp_path, steps=120, step_time=0.1))  # a margin to pause
    name = job.spec.name
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 5)
    # Paused while the CLI's interpreters start (on a loaded machine one may take longer
    # than the job's remaining steps): the ranks' logs stay, and the watch's first line
    # is then known, PAUSED.
    await job.handle.signal(SIGNAL_PAUSE)
    await job.wait_phase(Phase.PAUSED, timeout_s=60)
    logs = await asyncio.to_thread(lazarus_cli, stack, "logs", name, "--tail", "3")
    assert logs.returncode == 0, logs.stderr
    assert {line.split("]")[0] for line in logs.stdout.splitlines()} == {"[rank 0", "[rank 1"}
    watch = subprocess.Popen(
        [sys.executable, "-m", "lazarus.app.cli", "status", name, "--watch"],
        env=stack.worker_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert watch.stdout is not None
        first = await asyncio.to_thread(watch.stdout.readline)
        assert "phase=PAUSED" in first, first
        await job.handle.signal(SIGNAL_RESUME)
        waited = await asyncio.to_thread(lazarus_cli, stack, "wait", name, "--json")
        assert waited.returncode == 0, waited.stderr
        assert json.loads(waited.stdout)["outcome"] == "SUCCEEDED"
        later = (await asyncio.to_thread(watch.communicate, timeout=60))[0].splitlines()
    finally:
        watch.kill()
        watch.wait()
    assert any("phase=RUNNING" in line for line in later), later
    assert "phase=SUCCEEDED" in later[-1], later
