"""Operator messages are checked by pure functions of state and request: no server."""

from __future__ import annotations

import pytest

from lazarus.domain.spec import JobSpec
from workflows.operator_requests import (
    drain_recovery,
    drain_refusal,
    drain_reply,
    pause_refusal,
    queued_refusal,
    recover_refusal,
    recover_reply,
    reopen_pool,
    resume_refusal,
    return_refusal,
)
from workflows.state import ForceRecover, JobState, NodePool, NodeRequest, Phase

QUEUED = ForceRecover(reason="first")


def running(active: list[str], spares: list[str] | None = None) -> JobState:
    return JobState(phase=Phase.RUNNING, pool=NodePool(active=active, spares=spares or []))


def spec(nodes: int, spares: int = 0, min_nodes: int | None = None) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "j",
            "command": ["python", "t.py"],
            "workdir": "/w",
            "nodes": [{"name": f"n{i}"} for i in range(nodes)],
            "spares": [{"name": f"s{i}"} for i in range(spares)],
            "min_nodes": min_nodes,
        }
    )


@pytest.mark.parametrize(
    ("phase", "in_progress", "refusal"),
    [
        (Phase.RUNNING, False, None),
        (Phase.PENDING, False, None),
        (Phase.RECOVERING, False, None),
        (Phase.RUNNING, True, "a pause is already in progress"),
        (Phase.PAUSED, False, "the job is PAUSED"),
        (Phase.SUCCEEDED, False, "the job is SUCCEEDED"),
        (Phase.NEEDS_OPERATOR, False, "it waits for an operator already: resume or cancel it"),
    ],
)
def test_pause_is_refused_twice_and_where_nothing_runs(
    phase: Phase, in_progress: bool, refusal: str | None
) -> None:
    assert pause_refusal(phase, in_progress) == refusal


def test_resume_is_taken_only_while_waiting_for_an_operator() -> None:
    assert resume_refusal(Phase.PAUSED) is None
    assert resume_refusal(Phase.NEEDS_OPERATOR) is None
    assert resume_refusal(Phase.RUNNING) == (
        "the job is RUNNING, not paused or waiting for an operator"
    )


def test_one_recovery_is_queued_at_a_time() -> None:
    assert queued_refusal(None, "recover: x") is None
    assert queued_refusal(QUEUED, "drain b") == (
        "another recovery is already queued (first); send 'drain b' after it has happened"
    )


def test_recover_names_why_an_excluded_node_is_refused() -> None:
    state = running(["a", "b"], ["s"])
    state.pool.quarantine("q", "dead", at=1.0)
    assert recover_refusal(state, None, ForceRecover()) is None
    assert recover_refusal(state, None, ForceRecover(exclude_node="b")) is None
    assert recover_refusal(state, None, ForceRecover(exclude_node="s")) == (
        "node 's' is a spare, not running this job"
    )
    assert recover_refusal(state, None, ForceRecover(exclude_node="q")) == (
        "node 'q' is already quarantined"
    )
    assert recover_refusal(state, None, ForceRecover(exclude_node="typo")) == (
        "node 'typo' is not running this job; active nodes: a, b"
    )


def test_recover_refuses_a_finished_job_before_a_queued_one() -> None:
    state = running(["a"])
    state.phase = Phase.FAILED
    assert recover_refusal(state, QUEUED, ForceRecover()) == "the job is FAILED"
    state.phase = Phase.RUNNING
    refusal = recover_refusal(state, QUEUED, ForceRecover(reason="again"))
    assert refusal is not None and "send 'recover: again'" in refusal


def test_drain_checks_the_queue_first_then_the_phase_then_the_node() -> None:
    state = running([])
    state.phase = Phase.SUCCEEDED
    queued = drain_refusal(state, QUEUED, NodeRequest(node="a"))
    assert queued is not None and queued.startswith("another recovery is already queued")
    assert drain_refusal(state, None, NodeRequest(node="a")) == "the job is SUCCEEDED"
    state.phase = Phase.RUNNING
    assert drain_refusal(state, None, NodeRequest(node="a")) == (
        "node 'a' is not running this job; active nodes: none"
    )
    assert drain_refusal(running(["a"]), None, NodeRequest(node="a")) is None


def test_return_takes_only_a_quarantined_node() -> None:
    state = running(["a"])
    assert return_refusal(state, NodeRequest(node="a")) == (
        "node 'a' is not quarantined; quarantined nodes: none"
    )
    state.pool.quarantine("a", "dead", at=1.0)
    assert return_refusal(state, NodeRequest(node="a")) is None


def test_a_node_handed_back_to_the_fleet_returns_through_the_fleet() -> None:
    state = running(["a"])
    state.handed_back = ["b"]
    assert return_refusal(state, NodeRequest(node="b"), fleet="gpu-a") == (
        "node 'b' was handed back to fleet gpu-a: "
        "'lazarus fleet return b --fleet gpu-a' puts it in service"
    )


def test_a_drain_is_a_checkpointed_recovery_without_its_node() -> None:
    request = NodeRequest(node="b")
    assert drain_recovery(request) == ForceRecover(
        reason="drain b: drained by operator", exclude_node="b", checkpoint_first=True
    )
    assert drain_recovery(NodeRequest(node="b", reason="bad fan")).reason == "drain b: bad fan"
    assert drain_reply(request) == "draining b: its ranks move to a spare at the next turn"
    assert recover_reply(ForceRecover(reason="r", exclude_node="b")) == (
        "recovering without b at the next turn: r"
    )
    assert recover_reply(ForceRecover(reason="r")) == "recovering at the next turn: r"


def test_reopening_excludes_the_node_and_refills_from_returned_spares() -> None:
    state = JobState(phase=Phase.PAUSED, pool=NodePool(active=["n0", "n1"], spares=["s0"]))
    assert reopen_pool(spec(2, 1), state, ForceRecover(reason="r", exclude_node="n1"), 9.0) is None
    assert state.pool.active == ["n0", "s0"]
    [out] = state.pool.quarantined
    assert (out.node, out.reason, out.at) == ("n1", "excluded by operator: r", 9.0)


def test_reopening_with_too_few_nodes_says_what_to_do() -> None:
    state = JobState(phase=Phase.NEEDS_OPERATOR, pool=NodePool(active=["n0"]))
    assert reopen_pool(spec(2), state, None, 1.0) == (
        "cannot resume: 1 usable nodes, the job needs 2; "
        "'lazarus return' a quarantined node or add spares"
    )
    assert reopen_pool(spec(2, min_nodes=1), state, None, 1.0) is None
    state.pool.spares = ["s0"]
    assert reopen_pool(spec(2), state, None, 1.0) is None
    assert state.pool.active == ["n0", "s0"]
