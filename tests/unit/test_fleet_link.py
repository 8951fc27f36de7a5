"""Which lost nodes a fleet job short of nodes asks its fleet to replace: a pure
function of the spec and the pool, no server."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from lazarus.domain.spec import FleetLeaseSpec, JobSpec
from lazarus.workflows.fleet_link import nodes_to_replace
from lazarus.workflows.state import JobState, NodePool, Phase, QuarantinedNode


def spec(nodes: int, min_nodes: int | None = None) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "j",
            "command": ["python", "t.py"],
            "workdir": "/w",
            "nodes": [{"name": f"n{i}"} for i in range(nodes)],
            "min_nodes": min_nodes,
        }
    )


def waiting(active: list[str], spares: list[str], lost: list[str]) -> JobState:
    quarantined = [
        QuarantinedNode(node=n, reason="node_lost", at=float(i)) for i, n in enumerate(lost)
    ]
    return JobState(
        phase=Phase.NEEDS_OPERATOR,
        pool=NodePool(active=active, spares=spares, quarantined=quarantined),
    )


def test_one_lost_node_per_missing_slot_newest_first() -> None:
    state = waiting(["n0"], [], ["n1", "n2", "n3"])
    assert nodes_to_replace(spec(4), state) == ["n3", "n2", "n1"]
    assert nodes_to_replace(spec(3), state) == ["n3", "n2"]


def test_spares_and_min_nodes_count_as_enough() -> None:
    assert nodes_to_replace(spec(3), waiting(["n0", "n1"], ["s0"], ["n2"])) == []
    assert nodes_to_replace(spec(3, min_nodes=2), waiting(["n0", "n1"], [], ["n2"])) == []


def test_the_retry_interval_has_a_floor() -> None:
    with pytest.raises(ValidationError, match="retry_s"):
        FleetLeaseSpec(name="f", retry_s=1)
