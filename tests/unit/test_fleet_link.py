"""Which lost nodes a fleet job short of nodes asks its fleet to replace, and how a
failed fleet call is worded: pure functions, no server."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from temporalio.exceptions import ActivityError, ApplicationError, RetryState

from lazarus.domain.fleet import FLEET_REFUSED, FLEET_UNREACHABLE
from lazarus.domain.spec import FleetLeaseSpec, JobSpec
from workflows.fleet_link import nodes_to_replace, trouble
from workflows.state import JobState, NodePool, Phase, QuarantinedNode


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


def failed_call(error_type: str) -> ActivityError:
    err = ActivityError(
        "activity error",
        scheduled_event_id=1,
        started_event_id=2,
        identity="w",
        activity_type="fleet_report",
        activity_id="1",
        retry_state=RetryState.NON_RETRYABLE_FAILURE,
    )
    err.__cause__ = ApplicationError("fleet f refused report_quarantine: no", type=error_type)
    return err


def test_a_fleet_refusal_is_noted_as_a_refusal_not_as_unreachable() -> None:
    refusal = trouble(failed_call(FLEET_REFUSED))
    assert refusal.startswith("refused: ") and "fleet f refused" in refusal
    assert trouble(failed_call(FLEET_UNREACHABLE)).startswith("unreachable: ")
