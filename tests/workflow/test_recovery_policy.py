"""Recovery decisions on paths that used to end badly (fake activities, real server).

Issue 10, defects 8, 9 and 18: an unreachable node met during a relaunch ended the
job FAILED; a stop that could not kill was retried forever; evidence grew without
bound and a hook that always failed blocked continue-as-new for good.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lazarus.domain.api import SIGNAL_PAUSE, SIGNAL_RESUME
from lazarus.domain.contracts import FailureReport
from lazarus.domain.evidence import MAX_EVIDENCE_CHARS, MAX_EVIDENCE_LINES, cap_evidence
from lazarus.domain.process_groups import UnkillableGroup
from tests.workflow.conftest import StartFakeJob, fake_spec
from workflows.state import Phase

pytestmark = pytest.mark.timeout(120)


def crash(rank: int = 0, node: str = "a", evidence: list[str] | None = None) -> FailureReport:
    now = time.time()
    return FailureReport(
        kind="crash",
        failure_class="unknown",
        rank=rank,
        node=node,
        exit_code=1,
        fault_at=now,
        detected_at=now,
        evidence=evidence or ["exit 1"],
    )


async def test_an_unreachable_node_at_relaunch_moves_to_a_spare(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(tmp_path, nodes=[{"name": "a"}, {"name": "b"}], spares=[{"name": "c"}])
    job = await start_fake_job(spec)
    job.script.failures[1] = crash()
    job.script.unreachable_at_launch[2] = "b"
    status = await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 3, "generation 3 on the spare"
    )
    assert status.nodes.active == ["a", "c"]
    assert [q.node for q in status.nodes.quarantined] == ["b"]
    lost = status.incidents[-1]
    assert lost.failure_class == "node_lost" and lost.node == "b"
    assert any("unreachable" in line for line in lost.evidence)


async def test_an_unreachable_node_without_a_spare_asks_an_operator_not_failed(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    hook = ["sh", "-c", "cat > /dev/null"]
    spec = fake_spec(tmp_path, nodes=[{"name": "a"}, {"name": "b"}], on_escalation=hook)
    job = await start_fake_job(spec)
    job.script.failures[1] = crash()
    job.script.unreachable_at_launch[2] = "b"
    status = await job.wait_phase(Phase.NEEDS_OPERATOR, Phase.FAILED)
    assert status.phase == Phase.NEEDS_OPERATOR
    assert status.operator_reason is not None and "b" in status.operator_reason
    await job.wait_for(lambda s: s.incidents[-1].escalation_hook == "ran", "the hook to run")


async def test_ranks_that_survive_sigkill_quarantine_the_node_and_escalate(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(tmp_path, nodes=[{"name": "a"}, {"name": "b"}], spares=[{"name": "c"}])
    job = await start_fake_job(spec)
    job.script.unkillable = [
        UnkillableGroup(node="b", pgid=4242, pids=[4242, 4243], reason="state D after SIGKILL")
    ]
    job.script.failures[1] = crash(rank=1, node="b")
    status = await job.wait_phase(Phase.NEEDS_OPERATOR, timeout_s=60)
    assert status.operator_reason is not None
    assert "4242" in status.operator_reason and "4243" in status.operator_reason
    quarantined = {q.node: q for q in status.nodes.quarantined}
    assert "b" in quarantined and not quarantined["b"].fenced
    assert status.generation == 1  # nothing launched beside the stuck ranks


async def test_huge_evidence_is_capped_in_the_incident(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    job = await start_fake_job(fake_spec(tmp_path))
    job.script.failures[1] = crash(evidence=["x" * 65536, *[f"line {i}" for i in range(200)]])
    status = await job.wait_for(lambda s: s.generation >= 2, "the relaunch")
    evidence = status.incidents[0].evidence
    assert len(evidence) <= MAX_EVIDENCE_LINES + 1
    assert all(len(line) <= MAX_EVIDENCE_CHARS for line in evidence)
    assert "more lines left out" in evidence[-1]


def test_cap_evidence_keeps_the_root_cause_first() -> None:
    capped = cap_evidence(["root cause", *["collateral"] * 100])
    assert capped[0] == "root cause"
    assert len(capped) == MAX_EVIDENCE_LINES + 1


async def test_a_failing_hook_does_not_block_continue_as_new(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(
        tmp_path,
        on_escalation=["false"],
        playbook={"unknown": {"ladder": ["escalate"]}},
    )
    job = await start_fake_job(spec, continue_as_new_after_events=60)
    job.script.hook_fails = True
    job.script.failures[1] = crash()
    await job.wait_phase(Phase.NEEDS_OPERATOR)
    await job.handle.signal(SIGNAL_RESUME)
    # Each relaunch crashes again until generation 6; history passes 60 events while
    # the hook is still failing: the job must hop anyway and carry the hook along.
    for generation in range(2, 6):
        job.script.failures[generation] = crash()
    status = await job.wait_for(lambda s: s.runs >= 2, "a continue-as-new", timeout_s=90)
    assert status.runs >= 2
    hooks_before = len(job.script.hooks)
    await job.wait_for(lambda s: len(job.script.hooks) > hooks_before, "the hook retried")


async def test_a_hook_in_flight_at_continue_as_new_is_delivered_by_the_next_run(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    """Found by ``python -m bench simulate``: the run's own continue-as-new cancelled a
    hook delivery in flight, the cancellation counted as a failed delivery and dropped
    it from ``pending_hooks``, and the job waited in NEEDS_OPERATOR with nobody paged."""
    spec = fake_spec(
        tmp_path,
        on_escalation=["true"],
        playbook={"unknown": {"ladder": ["escalate"]}},
    )
    job = await start_fake_job(spec, continue_as_new_after_events=30)
    job.script.hook_blocks = 1
    job.script.failures[1] = crash()
    status = await job.wait_for(
        lambda s: s.phase == Phase.NEEDS_OPERATOR and len(job.script.hooks) == 1,
        "the escalation, its first delivery hanging",
    )
    # History is past 30 events: the next workflow task (a pause, which means nothing
    # while waiting for an operator) hops to a new run with the delivery in flight.
    await job.handle.signal(SIGNAL_PAUSE)
    status = await job.wait_for(
        lambda s: s.runs > status.runs and len(job.script.hooks) >= 2,
        "the next run delivers the hook again",
        timeout_s=90,
    )
    assert status.phase == Phase.NEEDS_OPERATOR
    first, second = job.script.hooks[:2]
    assert first.marker == second.marker, "the same page, not a new escalation"
    status = await job.wait_for(
        lambda s: s.incidents[-1].escalation_hook == "ran", "the hook ran", timeout_s=60
    )


async def test_a_retired_step_stays_retired_and_later_checkpoints_are_tiered(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    """Issue 10, defect 4: after a rollback, a later relaunch (here a crash) restored
    the diverged step from its durable copy; and the checkpoint watch, still waiting
    for steps above the retired one, never tiered what the job wrote after it."""
    job = await start_fake_job(fake_spec(tmp_path))
    job.script.checkpoint_steps = [20, 40]
    job.script.watch_reports = [40]  # step 40 is housekept (tiered) before it diverges
    job.script.retire_on_rollback = [40]
    await job.wait_for(
        lambda s: bool(job.script.watches) and len(job.script.watches) >= 2, "40 housekept"
    )
    diverged = crash()
    job.script.failures[1] = diverged.model_copy(update={"failure_class": "numerical"})
    job.script.failures[2] = crash()  # a later, ordinary relaunch
    status = await job.wait_for(lambda s: s.generation == 3, "the relaunch after the crash")
    assert status.retired_steps == [40]
    relaunch_searches = job.script.searches[1:]
    assert len(relaunch_searches) >= 2
    assert all(40 in search.exclude_steps for search in relaunch_searches)
    assert status.resume_step == 20, "the diverged step's durable copy never comes back"
    assert any(w.newer_than_step == 20 for w in job.script.watches), (
        "the watch restarts below the retired step, so new checkpoints are tiered"
    )
