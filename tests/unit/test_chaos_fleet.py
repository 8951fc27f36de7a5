"""The fleet row's checks (``tests/chaos/fleet.py``): pure logic on the fleet's and the
job's status, as the ``job_terminated@same_name_restart`` cell reads them."""

from __future__ import annotations

from lazarus.domain.fleet_messages import FleetStatus, NodeView
from lazarus.domain.fleet_state import NodeState
from tests.chaos.fleet import (
    held_by,
    lease_problems,
    leftover_problems,
    orphan_problems,
    refusal_problems,
    released_problems,
)
from workflows.state import JobStatus, NodePool, Phase

JOB = "bench-job-1"
FLEET = "chaos-f1"
REFUSAL = (
    f"fleet {FLEET}: no lease: job {JOB} already holds n0, n1 in fleet {FLEET}, leased by "
    f"an earlier start (run-1; 2 node(s) + 0 spare(s)); once that start has ended, free "
    f"them with 'lazarus fleet release {JOB} --fleet {FLEET}', then start again"
)


def fleet(**states: tuple[NodeState, str | None]) -> FleetStatus:
    nodes = [NodeView(name=n, state=s, job=j, since=0.0) for n, (s, j) in states.items()]
    return FleetStatus(
        name=FLEET,
        counts={},
        nodes=nodes,
        log=[],
        runs=1,
        lemons=[],
        spare_target=0,
        probation_passes=None,
    )


def job_status(
    phase: Phase, reason: str | None = None, active: list[str] | None = None
) -> JobStatus:
    return JobStatus(
        job_id=JOB,
        phase=phase,
        generation=0,
        step=None,
        world_size=2,
        ranks=[],
        restarts=0,
        max_restarts=3,
        incidents=[],
        ettr=None,
        elapsed_s=0.0,
        operator_reason=reason,
        nodes=NodePool(active=active or []),
    )


ORPHANED = fleet(
    n0=(NodeState.LEASED, JOB), n1=(NodeState.LEASED, JOB), n2=(NodeState.HEALTHY, None)
)


def test_the_orphaned_lease_is_held_as_leased() -> None:
    assert held_by(ORPHANED, JOB) == ["n0", "n1"]
    assert orphan_problems(ORPHANED, JOB, ["n1", "n0"]) == []


def test_a_lease_freed_or_grown_by_the_refused_start_is_a_problem() -> None:
    freed = fleet(n0=(NodeState.HEALTHY, None), n1=(NodeState.LEASED, JOB))
    assert orphan_problems(freed, JOB, ["n0", "n1"])
    grown = fleet(
        n0=(NodeState.LEASED, JOB), n1=(NodeState.LEASED, JOB), n2=(NodeState.LEASED, JOB)
    )
    assert orphan_problems(grown, JOB, ["n0", "n1"])


def test_a_refusal_naming_the_release_command_holds() -> None:
    assert refusal_problems(job_status(Phase.FAILED, REFUSAL), 0, JOB, FLEET) == []
    # Never leased, its pool is the spec's default local node: not a fleet node.
    refused = job_status(Phase.FAILED, REFUSAL, ["local"])
    assert refusal_problems(refused, 0, JOB, FLEET) == []


def test_a_start_handed_the_stale_lease_fails_every_way() -> None:
    problems = refusal_problems(job_status(Phase.SUCCEEDED, None, ["n0", "n1"]), 1, JOB, FLEET)
    assert len(problems) == 5


def test_a_refusal_for_a_shortage_does_not_name_the_way_out() -> None:
    shortage = f"fleet {FLEET}: no lease: fleet {FLEET} has 0 healthy node(s) free"
    [problem] = refusal_problems(job_status(Phase.FAILED, shortage), 0, JOB, FLEET)
    assert "lazarus fleet release" in problem


def test_after_the_release_the_old_nodes_are_healthy() -> None:
    freed = fleet(n0=(NodeState.HEALTHY, None), n1=(NodeState.HEALTHY, None))
    assert released_problems(freed, JOB, ["n0", "n1"]) == []
    quarantined = fleet(n0=(NodeState.QUARANTINED, JOB), n1=(NodeState.HEALTHY, None))
    assert released_problems(quarantined, JOB, ["n0", "n1"]) == [
        "released nodes not healthy: {'n0': <NodeState.QUARANTINED: 'quarantined'>}"
    ]


def test_the_fresh_lease_has_the_right_size_from_the_fleet() -> None:
    assert lease_problems(job_status(Phase.RUNNING, active=["n2", "n0"])) == []
    assert lease_problems(job_status(Phase.RUNNING, active=["n0"]))
    assert lease_problems(job_status(Phase.RUNNING, active=["a", "b"]))


def test_nothing_held_once_the_last_start_ended() -> None:
    done = fleet(n0=(NodeState.HEALTHY, None), n1=(NodeState.HEALTHY, None))
    assert leftover_problems(done, JOB) == []
    assert len(leftover_problems(ORPHANED, JOB)) == 2
