"""Rejoin in place, decided by the workflow (issue 16): pure plans, then the real
workflow on fake activities. A crash keeps the survivors' processes (no stop, the
launch carries them), a hang restarts the whole generation, and the incident says
which path was taken. The real processes are in tests/integration/test_rejoin_launch.py
and tests/e2e/test_rejoin_e2e.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lazarus.domain.contracts import FailureReport
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.process_groups import UnkillableGroup
from lazarus.domain.spec import SpecError
from tests.workflow.conftest import StartFakeJob, fake_spec
from workflows.playbook import Action
from workflows.rejoin import plan_rejoin
from workflows.state import NodePool, Phase

pytestmark = pytest.mark.timeout(120)

REJOIN = {"enabled": True, "timeout_s": 30}


def failure(kind: str = "crash", rank: int = 0, node: str = "a") -> FailureReport:
    now = time.time()
    return FailureReport(
        kind=kind,
        failure_class=FailureClass.NODE_LOST if kind == "node_lost" else FailureClass.KILLED,
        rank=rank,
        node=node,
        signal="SIGKILL" if kind == "crash" else None,
        exit_code=-9 if kind == "crash" else None,
        fault_at=now - 0.5,
        detected_at=now,
        evidence=[kind],
    )


def pool(*active: str, spares: tuple[str, ...] = ()) -> NodePool:
    return NodePool(active=list(active), spares=list(spares))


# ------------------------------------------------------------------------- pure plans


def test_a_crashed_rank_is_restarted_and_every_other_rank_rejoins(tmp_path: Path) -> None:
    spec = fake_spec(
        tmp_path, nodes=[{"name": "a"}, {"name": "b"}], nproc_per_node=2, rejoin=REJOIN
    )
    plan = plan_rejoin(spec, pool("a", "b"), failure(rank=2, node="b"), Action.RESTART, True)
    assert plan.ranks == [0, 1, 3] and plan.path == "rejoin"
    assert "ranks 0, 1, 3 keep their process; rank 2 restarts" in plan.why


def test_a_replaced_node_restarts_its_ranks_and_the_others_rejoin(tmp_path: Path) -> None:
    spec = fake_spec(
        tmp_path,
        nodes=[{"name": "a"}, {"name": "b"}, {"name": "c"}],
        spares=[{"name": "s"}],
        nproc_per_node=2,
        rejoin=REJOIN,
    )
    lost = failure("node_lost", rank=2, node="b")
    nodes = pool("a", "b", "c", spares=("s",))
    plan = plan_rejoin(spec, nodes, lost, Action.REPLACE_NODE, True, node_loss_rejoins=True)
    assert plan.ranks == [0, 1, 4, 5]
    # Without rejoin.node_loss the peers of a lost host are blocked until their
    # collective times out: the whole generation restarts (warm) instead.
    plan = plan_rejoin(spec, nodes, lost, Action.REPLACE_NODE, True, node_loss_rejoins=False)
    assert plan.ranks == [] and "rejoin.node_loss is off" in plan.why


@pytest.mark.parametrize(
    ("kind", "action", "spares", "live", "why"),
    [
        ("hang", Action.RESTART, ("s",), True, "hang: survivors may be blocked"),
        ("vanished", Action.RESTART, ("s",), True, "vanished"),
        ("crash", Action.ROLLBACK, ("s",), True, "the playbook chose rollback"),
        ("crash", Action.NEEDS_OPERATOR, ("s",), True, "needs_operator"),
        ("node_lost", Action.REPLACE_NODE, (), True, "no spare"),
        ("crash", Action.RESTART, ("s",), False, "no generation is running"),
    ],
)
def test_everything_else_restarts_the_whole_generation(
    tmp_path: Path,
    kind: str,
    action: Action,
    spares: tuple[str, ...],
    live: bool,
    why: str,
) -> None:
    spec = fake_spec(tmp_path, nodes=[{"name": "a"}, {"name": "b"}], rejoin=REJOIN)
    plan = plan_rejoin(spec, pool("a", "b", spares=spares), failure(kind, 1, "b"), action, live)
    assert plan.ranks == [] and plan.path == "whole_generation"
    assert why in plan.why


def test_rejoin_is_accepted_on_ssh_nodes(tmp_path: Path) -> None:
    spec = fake_spec(
        tmp_path,
        nodes=[
            {"name": "h1", "launcher": "ssh", "host": "10.0.0.1"},
            {"name": "h2", "launcher": "ssh", "host": "10.0.0.2"},
        ],
        rejoin=REJOIN,
    )
    assert spec.rejoins is not None


def test_rejoin_is_refused_on_slurm_nodes_without_warm_start_naming_it(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"rejoin: on Slurm nodes .* needs warm_start"):
        fake_spec(
            tmp_path,
            nodes=[{"name": "n1", "launcher": "slurm"}],
            rejoin=REJOIN,
        )


# ------------------------------------------------------------------- the real workflow


async def test_a_crash_carries_the_survivors_without_stopping_them(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(tmp_path, nodes=[{"name": "a"}, {"name": "b"}], rejoin=REJOIN)
    job = await start_fake_job(spec)
    job.script.failures[1] = failure(rank=1, node="b")
    status = await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 2, "generation 2"
    )
    assert job.script.launches[-1].rejoin_ranks == [0]
    assert job.script.stops == [], "nothing is stopped: the launch fences all but rank 0"
    incident = status.incidents[-1]
    assert incident.restart_path == "rejoin"
    assert any(
        "rejoin: rank 0 keeps its process; rank 1 restarts" in e for e in incident.evidence
    ), incident.evidence
    assert any("carried rank 0 over in place" in e for e in incident.evidence), incident.evidence
    await job.wait_for(lambda s: len(job.script.supervisions) >= 2, "supervision of gen 2")
    watching = job.script.supervisions[-1]
    assert watching.generation == 2
    assert watching.rejoining == [0] and watching.rejoin_timeout_s == 30


async def test_ranks_the_carry_could_not_kill_block_the_launch_as_stuck_ranks(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    """Issue 37, N7: without rejoin, the stop before a relaunch finds ranks that would
    not die (state D) and the job asks a person instead of launching beside them. A
    rejoin skips that stop, and its carry's fencing only logged them: a fresh rank
    started beside a process that may still hold the GPU or finish a write. Now the
    launch refuses, and the job stops the generation and escalates as without rejoin."""
    spec = fake_spec(tmp_path, nodes=[{"name": "a"}, {"name": "b"}], rejoin=REJOIN)
    job = await start_fake_job(spec)
    stuck = UnkillableGroup(node="b", pgid=4242, pids=[4242], reason="state D after SIGKILL")
    job.script.unkillable_at_carry[2] = [stuck]
    job.script.unkillable = [stuck]  # still stuck when the job's own stop meets it
    job.script.failures[1] = failure(rank=1, node="b")
    status = await job.wait_phase(Phase.NEEDS_OPERATOR, Phase.FAILED)
    assert status.phase == Phase.NEEDS_OPERATOR, status.operator_reason
    assert status.operator_reason is not None and "4242" in status.operator_reason
    assert [launch.rejoin_ranks for launch in job.script.launches] == [[], [0]]
    quarantined = {q.node: q for q in status.nodes.quarantined}
    assert "b" in quarantined and not quarantined["b"].fenced
    stops = [s for s in job.script.stops if "would not die" in s.reason]
    assert len(stops) == 1 and stops[0].kill_at_once


async def test_a_carry_whose_stuck_ranks_died_since_relaunches_the_whole_generation(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(tmp_path, nodes=[{"name": "a"}, {"name": "b"}], rejoin=REJOIN)
    job = await start_fake_job(spec)
    stuck = UnkillableGroup(node="b", pgid=4242, pids=[4242], reason="state D after SIGKILL")
    job.script.unkillable_at_carry[2] = [stuck]
    job.script.failures[1] = failure(rank=1, node="b")
    status = await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 3, "generation 3"
    )
    assert [launch.rejoin_ranks for launch in job.script.launches] == [[], [0], []]
    assert status.nodes.quarantined == []


async def test_a_hang_restarts_the_whole_generation_and_says_so(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(tmp_path, nodes=[{"name": "a"}, {"name": "b"}], rejoin=REJOIN)
    job = await start_fake_job(spec)
    job.script.failures[1] = failure("hang", rank=1, node="b")
    status = await job.wait_for(lambda s: s.generation == 2, "generation 2")
    assert job.script.launches[-1].rejoin_ranks == []
    stops = [s for s in job.script.stops if "incident" in s.reason]
    assert len(stops) == 1 and stops[0].kill_at_once
    assert status.incidents[-1].restart_path == "whole_generation"


async def test_a_failure_during_the_rejoin_restarts_the_whole_generation(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    """Issue 26 (found by the chaos matrix's ``survivor_sigkill@rejoin``): generation 2
    carried rank 0 and fails before its first step. Rank 0 is blocked in generation
    2's rendezvous and cannot rejoin again: carrying it cost a startup timeout."""
    spec = fake_spec(tmp_path, nodes=[{"name": "a"}, {"name": "b"}], rejoin=REJOIN)
    job = await start_fake_job(spec)
    job.script.failures[1] = failure(rank=1, node="b")
    job.script.failures[2] = failure(rank=1, node="b")
    status = await job.wait_for(
        lambda s: s.generation == 3 and s.phase == Phase.RUNNING, "generation 3"
    )
    assert job.script.launches[1].rejoin_ranks == [0]
    assert job.script.launches[2].rejoin_ranks == [], "no rejoin out of a rejoin"
    incident = status.incidents[-1]
    assert incident.restart_path == "whole_generation"
    assert any("a failure during a rejoin" in e for e in incident.evidence), incident.evidence


async def test_survivors_the_launch_could_not_keep_make_it_a_whole_restart(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(tmp_path, nodes=[{"name": "a"}, {"name": "b"}], rejoin=REJOIN)
    job = await start_fake_job(spec)
    job.script.rejoin_refused = True
    job.script.failures[1] = failure(rank=1, node="b")
    status = await job.wait_for(
        lambda s: s.generation == 2 and s.phase == Phase.RUNNING, "generation 2"
    )
    incident = status.incidents[-1]
    assert incident.restart_path == "whole_generation"
    assert any("started afresh: rank 0: its process has exited" in e for e in incident.evidence)


async def test_a_node_loss_restarts_the_whole_generation_unless_node_loss_rejoins(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(
        tmp_path, nodes=[{"name": "a"}, {"name": "b"}], spares=[{"name": "c"}], rejoin=REJOIN
    )
    job = await start_fake_job(spec)
    job.script.failures[1] = failure("node_lost", rank=1, node="b")
    status = await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 2, "generation 2 on the spare"
    )
    assert status.nodes.active == ["a", "c"]
    assert job.script.launches[-1].rejoin_ranks == []
    incident = status.incidents[-1]
    assert incident.restart_path == "whole_generation"
    assert any("rejoin.node_loss is off" in e for e in incident.evidence), incident.evidence


async def test_a_node_loss_with_a_spare_keeps_the_other_nodes_ranks(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    spec = fake_spec(
        tmp_path,
        nodes=[{"name": "a"}, {"name": "b"}],
        spares=[{"name": "c"}],
        rejoin={**REJOIN, "node_loss": True},
    )
    job = await start_fake_job(spec)
    job.script.failures[1] = failure("node_lost", rank=1, node="b")
    status = await job.wait_for(
        lambda s: s.phase == Phase.RUNNING and s.generation == 2, "generation 2 on the spare"
    )
    assert status.nodes.active == ["a", "c"]
    assert job.script.launches[-1].rejoin_ranks == [0]
    assert all("b" not in [n.name for n in s.access.nodes] for s in job.script.stops)


async def test_a_job_without_rejoin_records_no_path(
    start_fake_job: StartFakeJob, tmp_path: Path
) -> None:
    job = await start_fake_job(fake_spec(tmp_path, nodes=[{"name": "a"}, {"name": "b"}]))
    job.script.failures[1] = failure(rank=1, node="b")
    status = await job.wait_for(lambda s: s.generation == 2, "generation 2")
    assert status.incidents[-1].restart_path is None
    assert job.script.launches[-1].rejoin_ranks == []
