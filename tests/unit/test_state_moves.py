"""JobState.open_incident_now and NodePool.swap_out are pure: no server."""

from __future__ import annotations

from lazarus.domain.failure_classes import FailureClass
from workflows.playbook import Action
from workflows.state import JobState, NodePool, PlannedMove


def test_an_incident_found_now_has_no_detection_delay_and_its_action() -> None:
    state = JobState(generation=5, step=31)
    evidence = ["force_recover: forced"]
    first = state.open_incident_now(
        "operator", PlannedMove.OPERATOR, 50.0, action=Action.RESTART, reason="r", evidence=evidence
    )
    assert (first.id, first.generation, first.step_at_failure) == (1, 5, 31)
    assert (first.fault_at, first.detected_at, first.detection_s) == (50.0, 50.0, 0.0)
    assert (first.action, first.reason, first.strategy) == (Action.RESTART, "r", "")
    assert first.evidence == evidence


def test_a_second_incident_found_now_supersedes_the_open_one() -> None:
    state = JobState()
    for strategy in ("a", "b"):
        state.open_incident_now(
            "checkpoint",
            FailureClass.STORAGE,
            1.0,
            action=Action.FALLBACK,
            reason="r",
            strategy=strategy,
        )
    first, second = state.incidents
    assert state.open_incident == second.id == 2 and second.strategy == "b"
    assert first.reason == "r (superseded: failed again before the first step)"


def test_swap_out_replaces_shrinks_or_says_an_operator_is_needed() -> None:
    spare = NodePool(active=["a", "b"], spares=["s"])
    assert spare.swap_out("b", "slow", 1.0, min_nodes=None)
    assert spare.active == ["a", "s"]
    shrink = NodePool(active=["a", "b"])
    assert shrink.swap_out("a", "dead", 1.0, min_nodes=1) and shrink.active == ["b"]
    stuck = NodePool(active=["a", "b"])
    assert not stuck.swap_out("a", "dead", 1.0, min_nodes=None)
    assert stuck.active == ["b"] and stuck.unfenced() == ["a"]


def test_swap_out_of_a_node_not_running_only_quarantines_it() -> None:
    pool = NodePool(active=["a"], spares=["s", "t"])
    assert pool.swap_out("s", "typo", 1.0, min_nodes=None)
    assert pool.active == ["a"] and pool.spares == ["t"] and pool.unfenced() == ["s"]
