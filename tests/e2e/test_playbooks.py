"""The playbook against real ranks: each failure class gets its own reaction.

Every test runs the example DDP job on the dev server and injects one kind of
trouble: a collective that times out, a slow node, a job that always dies at the
same step, a diverged loss, and an escalation with a hook.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from infra import chaos
from tests.e2e.conftest import STEPS, Job, assert_same_weights, ddp_spec
from workflows.state import Phase

StartJob = Callable[..., Awaitable[Job]]


def with_args(spec_command: list[str], *extra: str) -> list[str]:
    return [*spec_command, *extra]


@pytest.mark.timeout(180)
async def test_gloo_collective_timeout_is_classified_and_recovered(
    start_job: StartJob, tmp_path: Path, fault_free_weights: Path
) -> None:
    """A rank stalls; its peer's collective times out after 3 s (the short timeout the
    spec can set), crashes with gloo's timeout error, and the generation restarts."""
    base = ddp_spec(tmp_path, steps=STEPS, step_time=0.1)
    spec = ddp_spec(
        tmp_path,
        name=base.name,
        steps=STEPS,
        step_time=0.1,
        command=with_args(base.command, "--pg-timeout-s", "3"),
        # The collective timeout must fire first: no hang clock runs out before it.
        health={"hang_timeout_s": 60, "hang_budget": {"mode": "off"}},
    )
    job = await start_job(spec)
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 15)
    chaos.signal_rank(job.run_root, 1, signal.SIGSTOP)
    status = await job.result()
    assert status.phase == Phase.SUCCEEDED
    [incident] = status.incidents
    assert incident.failure_class == "nccl_timeout", incident
    assert any("Timed out" in line or "timeout" in line.lower() for line in incident.evidence)
    assert incident.action == "restart" and incident.strategy == "restart_in_place"
    assert_same_weights(job.weights, fault_free_weights)


@pytest.mark.timeout(180)
async def test_straggler_is_detected_then_swapped_onto_a_spare(
    start_job: StartJob, tmp_path: Path, fault_free_weights: Path
) -> None:
    base = ddp_spec(tmp_path, steps=STEPS, step_time=0.1)
    spec = ddp_spec(
        tmp_path,
        name=base.name,
        steps=STEPS,
        step_time=0.1,
        command=with_args(base.command, "--slow-node", "b", "--slow-factor", "3"),
        nproc_per_node=1,
        nodes=[{"name": "a"}, {"name": "b"}],
        spares=[{"name": "s0"}],
        total_steps=STEPS,
        straggler={"window_s": 3, "min_samples": 4, "default_restart_cost_s": 2},
    )
    job = await start_job(spec)
    status = await job.result()
    assert status.phase == Phase.SUCCEEDED
    [straggler] = status.stragglers
    assert (straggler.node, straggler.rank, straggler.action) == ("b", 1, "replace_node")
    assert straggler.slowdown > 2
    [incident] = status.incidents
    assert incident.kind == "straggler" and incident.steps_lost == 0, incident
    assert status.nodes.active == ["a", "s0"]
    assert [q.node for q in status.nodes.quarantined] == ["b"]
    assert_same_weights(job.weights, fault_free_weights)


@pytest.mark.timeout(180)
async def test_failing_at_the_same_step_escalates_after_the_loop_guard(
    start_job: StartJob, tmp_path: Path
) -> None:
    base = ddp_spec(tmp_path)
    spec = ddp_spec(
        tmp_path,
        name=base.name,
        command=with_args(base.command, "--die-at-step", "15"),
        recovery={"max_restarts": 50, "crash_loop_after": 2},
    )
    job = await start_job(spec)
    status = await job.wait_phase(Phase.NEEDS_OPERATOR, timeout_s=120)
    assert status.restarts == 2 and len(status.incidents) == 3
    assert status.operator_reason and "step 15 3 times" in status.operator_reason
    assert status.incidents[-1].strategy == "crash_loop"
    assert status.suggested_actions and "cancel" in status.suggested_actions
    assert chaos.live_rank_processes(job.run_root) == []


@pytest.mark.timeout(180)
async def test_diverged_loss_rolls_back_one_checkpoint(
    start_job: StartJob, tmp_path: Path, fault_free_weights: Path
) -> None:
    base = ddp_spec(tmp_path, steps=STEPS)
    spec = ddp_spec(
        tmp_path,
        name=base.name,
        steps=STEPS,
        command=with_args(base.command, "--nan-at-step", "25"),
    )
    job = await start_job(spec)
    status = await job.result()
    assert status.phase == Phase.SUCCEEDED
    [incident] = status.incidents
    assert incident.failure_class == "numerical" and incident.action == "rollback"
    assert incident.resumed_from_step == 10, "step 20 was retired: resume from the one before"
    assert any("rolled back past checkpoint step 20" in e for e in incident.evidence)
    assert (Path(spec.checkpoint_dir) / ".rolled-back" / "step-00000020.0").is_dir()
    assert_same_weights(job.weights, fault_free_weights)


@pytest.mark.timeout(120)
async def test_escalation_hook_runs_once_with_the_incident(
    start_job: StartJob, tmp_path: Path
) -> None:
    inbox = tmp_path / "pager.jsonl"
    hook = f"import sys; open({str(inbox)!r}, 'a').write(sys.stdin.read().strip() + '\\n')"
    spec = ddp_spec(
        tmp_path,
        command=[sys.executable, "-c", "import no_such_module_xyz"],
        on_escalation=[sys.executable, "-c", hook],
    )
    job = await start_job(spec)
    await job.wait_phase(Phase.NEEDS_OPERATOR, timeout_s=60)
    for _ in range(100):
        status = await job.status()
        if status.incidents and status.incidents[-1].escalation_hook == "ran":
            break
        await asyncio.sleep(0.2)
    assert status.incidents[-1].escalation_hook == "ran"
    await asyncio.sleep(2)  # would a second delivery happen?
    [line] = inbox.read_text().splitlines()
    page = json.loads(line)
    assert page["job_id"] == spec.job_id and page["incident"]["class"] == "user_code"
    assert "before the first step" in page["reason"]
    assert page["suggested_actions"] == ["resume", "recover --exclude-node NODE", "cancel"]
