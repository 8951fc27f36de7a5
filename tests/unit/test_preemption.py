"""Slurm preemption (issue 13) without a cluster: the supervisor's rule, the notice
file and its holder, and what the workflow records. The real-Slurm path is in
tests/slurm/test_slurm_preemption.py."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from activities.nodes.local.agent import LocalAgent
from activities.nodes.slurm import preemption as slurm_preemption
from activities.nodes.slurm.agent import SlurmAgent
from activities.nodes.slurm.preemption import holder_script, preemption_notice
from activities.nodes.slurm.rounds import SlurmRounds
from activities.supervise_rules import Observation, evaluate
from bench.slurm_calls import FakeSlurm
from lazarus.domain.contracts import FailureReport, NodeAccess, RankStatus, SuperviseRequest
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.spec import HealthSpec, JobSpec, NodeSpec, SlurmSpec
from workflows.playbook import Action
from workflows.preemption import (
    handled_preemption_at,
    open_preemption,
    preempt_marker_for,
    record_preemption,
)
from workflows.state import JobState

SLURM = SlurmSpec(job_id=42)


def request() -> SuperviseRequest:
    return SuperviseRequest(
        job_id="j",
        generation=1,
        run_dir="/nonexistent",
        world_size=2,
        health=HealthSpec(hang_timeout_s=10, startup_timeout_s=60),
        access=NodeAccess(slurm=SLURM),
    )


def allocation_is(monkeypatch: pytest.MonkeyPatch, state: str | None) -> None:
    monkeypatch.setattr(slurm_preemption, "job_state", lambda job_id: state)


def test_a_preemption_wins_over_the_crashes_it_caused() -> None:
    ranks = [
        RankStatus(rank=0, pid=1, alive=False, exit_code=-15, signal="SIGTERM", step=30),
        RankStatus(rank=1, pid=2, alive=True, step=31),
    ]
    obs = Observation(now=1000.0, launched_at=900.0, ranks=ranks, preempted=(990.0, "why"))
    outcome = evaluate(request(), obs, started_at=950.0)
    assert outcome is not None and outcome.kind == "preempted", outcome
    notice = outcome.failure
    assert notice is not None and notice.failure_class == FailureClass.PREEMPTED
    assert (notice.kind, notice.fault_at, notice.detected_at) == ("preempted", 990.0, 1000.0)
    assert notice.step_at_failure == 31 and notice.evidence == ["why"]


def test_the_marker_is_a_notice_until_handled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allocation_is(monkeypatch, "RUNNING")
    marker = SLURM.preempt_marker(tmp_path)
    assert marker == tmp_path / ".slurm-preempt-42"
    assert preemption_notice(SLURM, str(marker), None) is None
    marker.write_text("1\n")
    found = preemption_notice(SLURM, str(marker), None)
    assert found is not None and found[0] == marker.stat().st_mtime
    assert "USR1" in found[1] and str(marker) in found[1]
    assert preemption_notice(SLURM, str(marker), found[0]) is None  # handled: once


@pytest.mark.parametrize("state", ["TIMEOUT", "CANCELLED", "COMPLETING", None])
def test_an_allocation_no_longer_running_is_a_preemption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str | None
) -> None:
    allocation_is(monkeypatch, state)
    found = preemption_notice(SLURM, str(SLURM.preempt_marker(tmp_path)), None)
    assert found is not None and "allocation ended" in found[1]
    assert (state or "gone") in found[1]


def test_slurm_unreachable_is_no_preemption(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(job_id: int) -> str:
        raise slurm_preemption.SlurmCommandFailed("no slurmctld")

    monkeypatch.setattr(slurm_preemption, "job_state", unreachable)
    assert preemption_notice(SLURM, None, None) is None


@pytest.mark.timeout(30)
@pytest.mark.slow  # starts the holder and sleeps
def test_the_holder_writes_the_notice_on_usr1_and_keeps_holding(tmp_path: Path) -> None:
    env = {**os.environ, "SLURM_JOB_ID": "42"}
    holder = subprocess.Popen(
        ["sh", "-c", holder_script(tmp_path)], env=env, start_new_session=True
    )
    try:
        time.sleep(0.5)  # the trap is set before the sleep starts
        holder.send_signal(signal.SIGUSR1)
        marker = SLURM.preempt_marker(tmp_path)
        deadline = time.monotonic() + 20
        while not marker.exists():
            assert time.monotonic() < deadline, "no notice 20 s after USR1"
            time.sleep(0.05)
        assert int(marker.read_text()) > 0
        time.sleep(0.3)
        assert holder.poll() is None, "the holder must keep the allocation"
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # the holder and its sleep
        holder.wait()


def notice(step: int | None = 30) -> FailureReport:
    return FailureReport(
        kind="preempted",
        failure_class=FailureClass.PREEMPTED,
        rank=0,
        evidence=["Slurm signalled the holder"],
        fault_at=100.0,
        detected_at=101.0,
        step_at_failure=step,
    )


def test_a_checkpointed_preemption_costs_the_steps_after_the_checkpoint() -> None:
    state = JobState(generation=3)
    assert handled_preemption_at(state) is None
    incident = open_preemption(state, notice())
    assert state.open_incident == incident.id
    assert (incident.kind, incident.failure_class, incident.action) == (
        "preempted",
        FailureClass.PREEMPTED,
        Action.PAUSE,
    )
    record_preemption(incident, 105.0, last_step=34, checkpoint_step=34)
    assert (incident.step_at_failure, incident.resumed_from_step, incident.steps_lost) == (
        34,
        34,
        0,
    )
    assert "just-in-time checkpoint at step 34" in incident.evidence
    assert "paused" in incident.reason and "checkpointed step 34" in incident.reason
    assert handled_preemption_at(state) == 100.0


def test_an_ended_allocation_leaves_the_cost_to_the_resume() -> None:
    state = JobState(generation=3)
    incident = open_preemption(state, notice())
    record_preemption(incident, 105.0, last_step=None, checkpoint_step=None)
    assert incident.steps_lost is None and incident.resumed_from_step is None
    assert "no just-in-time checkpoint" in incident.reason


def test_only_a_job_in_an_allocation_watches_a_notice_file() -> None:
    base = {"name": "j", "command": ["python", "t.py"], "run_dir": "/shared/runs"}
    assert preempt_marker_for(JobSpec.model_validate(base)) is None
    unsubmitted = JobSpec.model_validate({**base, "slurm": {"nodes": 2}})
    assert preempt_marker_for(unsubmitted) is None
    held = unsubmitted.in_allocation(9, ["n1", "n2"])
    assert preempt_marker_for(held) == "/shared/runs/.slurm-preempt-9"


def test_a_slurm_agent_answers_for_its_allocation_and_a_local_one_never() -> None:
    """The supervisor asks its first agent: the Slurm one speaks for the job's
    allocation, one without an allocation or a scheduler has nothing to say."""
    slurm = FakeSlurm()  # the allocation lists no step: its state is asked
    slurm.job_state = "TIMEOUT"
    rounds = SlurmRounds(runner=slurm.run, clock=slurm.clock)
    node = NodeSpec(name="n1", launcher="slurm")
    found = SlurmAgent(node, SLURM, rounds=rounds).preemption_notice(None, None)
    assert found is not None and "TIMEOUT" in found[1]
    assert SlurmAgent(node, None).preemption_notice(None, None) is None
    assert LocalAgent(NodeSpec(name="n1")).preemption_notice(None, None) is None
