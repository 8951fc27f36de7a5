"""Node-pool moves are pure: checked here without a server."""

from __future__ import annotations

import pytest

from workflows.state import JobState, NodePool


def pool(active: list[str], spares: list[str] | None = None) -> NodePool:
    return NodePool(active=list(active), spares=list(spares or []))


def test_replace_puts_the_first_spare_into_the_same_rank_slot() -> None:
    nodes = pool(["a", "b", "c"], ["s1", "s2"])
    assert nodes.replace("b", "dead", at=5.0) == "s1"
    assert nodes.active == ["a", "s1", "c"] and nodes.spares == ["s2"]
    [out] = nodes.quarantined
    assert (out.node, out.reason, out.at, out.fenced) == ("b", "dead", 5.0, False)


def test_replace_without_a_spare_leaves_the_pool_one_node_short() -> None:
    nodes = pool(["a", "b"])
    assert nodes.replace("a", "drained", at=1.0) is None
    assert nodes.active == ["b"] and nodes.unfenced() == ["a"]


def test_replace_refuses_a_node_that_is_not_active() -> None:
    with pytest.raises(ValueError):
        pool(["a"], ["s"]).replace("s", "typo", at=1.0)


@pytest.mark.parametrize(
    ("active", "min_nodes", "allowed"),
    [
        (["a", "b", "c"], 2, True),
        (["a", "b", "c"], 3, False),
        (["a", "b"], None, False),
        (["a"], 0, False),  # never down to no node at all
    ],
)
def test_shrink_quarantines_and_says_whether_the_job_may_go_on(
    active: list[str], min_nodes: int | None, allowed: bool
) -> None:
    nodes = pool(active)
    assert nodes.shrink(active[0], "dead", at=1.0, min_nodes=min_nodes) is allowed
    assert active[0] not in nodes.active and nodes.unfenced() == [active[0]]


def test_refill_moves_spares_into_lost_slots_up_to_the_size() -> None:
    nodes = pool(["a"], ["r1", "r2", "r3"])
    assert nodes.refill(3) == ["r1", "r2"]
    assert nodes.active == ["a", "r1", "r2"] and nodes.spares == ["r3"]
    assert nodes.refill(3) == []


def test_release_returns_a_quarantined_node_to_the_spares_once() -> None:
    nodes = pool(["a", "b"])
    nodes.quarantine("b", "dead", at=1.0)
    nodes.release("b")
    nodes.release("b")
    assert nodes.quarantined == [] and nodes.spares == ["b"]


def test_a_handed_back_node_leaves_the_job_and_a_fenced_one_is_not_stopped_again() -> None:
    nodes = pool(["a", "b"], ["s"])
    nodes.quarantine("b", "gpu", at=1.0)
    nodes.quarantine("s", "gpu", at=1.0)
    nodes.mark_fenced("b")
    assert nodes.unfenced() == ["s"] and nodes.held() == {"a", "b", "s"}
    nodes.forget(["b"])
    assert [q.node for q in nodes.quarantined] == ["s"] and nodes.held() == {"a", "s"}


def test_moves_keep_the_serialized_shape() -> None:
    # JobState crosses continue-as-new as JSON: methods must never add fields.
    state = JobState(pool=pool(["a", "b"], ["s"]))
    state.pool.replace("a", "dead", at=1.0)
    dumped = state.model_dump(mode="json")["pool"]
    assert set(dumped) == {"active", "spares", "quarantined"}
    assert dumped["active"] == ["s", "b"]
    assert JobState.model_validate_json(state.model_dump_json()) == state
