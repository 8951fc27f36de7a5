"""A program missing on every node is the spec's fault, not the nodes' (issue 29; the
newcomer review of 2026-12-03, "missing program"). The real workflow on a dev server
with the fake activities of ``fakes``; ``lazarus start``'s own check for local nodes
is in tests/unit/test_cli_spec_errors.py.

- The only node lacks the program: the job ends FAILED asking to fix ``command``,
  nothing is quarantined and nothing launched (before: the node was quarantined and
  the job waited in NEEDS_OPERATOR advising to shrink).
- Every node lacks it, spares too: the same, without using up the spares.
- One node of two lacks it: that node's fault, swapped for the spare as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType

from tests.workflow import fakes
from tests.workflow.conftest import FakeJob, StartFakeJob, fake_spec
from workflows.patches import PATCH_MISSING_PROGRAM_FAILS_JOB
from workflows.state import Phase

pytestmark = pytest.mark.timeout(120)


async def asked_for_the_patch(job: FakeJob) -> bool:
    history = await job.handle.fetch_history()
    return any(
        PATCH_MISSING_PROGRAM_FAILS_JOB.encode()
        in e.marker_recorded_event_attributes.SerializeToString()
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    )


async def test_the_only_node_without_the_program_fails_the_job_not_the_node(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(tmp_path, command=["./no_such_train.sh"])
    fakes.script_for(spec.job_id).program_missing = {"local"}
    job = await start_fake_job(spec)
    status = await job.wait_phase(Phase.FAILED, Phase.NEEDS_OPERATOR)
    assert status.phase == Phase.FAILED
    reason = status.operator_reason or ""
    assert "command: './no_such_train.sh'" in reason and "fix `command`" in reason
    assert status.nodes.quarantined == []
    assert job.script.launches == []
    assert await asked_for_the_patch(job)


async def test_a_program_missing_everywhere_keeps_the_spares(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(
        tmp_path,
        command=["pyhton", "train.py"],
        nodes=[{"name": "a"}, {"name": "b"}],
        spares=[{"name": "s"}],
    )
    fakes.script_for(spec.job_id).program_missing = {"a", "b", "s"}
    job = await start_fake_job(spec)
    status = await job.wait_phase(Phase.FAILED, Phase.NEEDS_OPERATOR)
    assert status.phase == Phase.FAILED
    assert "'pyhton' was not found on any node (a, b)" in (status.operator_reason or "")
    assert status.nodes.quarantined == [] and status.nodes.spares == ["s"]
    assert job.script.preflights == 1


async def test_one_node_without_the_program_is_still_that_nodes_fault(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(tmp_path, nodes=[{"name": "a"}, {"name": "b"}], spares=[{"name": "s"}])
    fakes.script_for(spec.job_id).program_missing = {"b"}
    job = await start_fake_job(spec)
    status = await job.wait_phase(Phase.RUNNING)
    assert [q.node for q in status.nodes.quarantined] == ["b"]
    assert [n.name for n in job.script.launches[-1].nodes or []] == ["a", "s"]
    assert not await asked_for_the_patch(job), "asked only when it applies"
