"""What the playbook weighs about a failure, and an unreachable node at launch: pure."""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError, RetryState

from lazarus.domain.contracts import FailureReport
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.spec import JobSpec
from workflows.failures import (
    NODE_UNREACHABLE,
    failure_context,
    unreachable_failure,
    unreachable_node,
)
from workflows.playbook import Action
from workflows.state import JobState, NodePool, PlannedMove

SPEC = JobSpec.model_validate(
    {
        "name": "j",
        "command": ["python", "t.py"],
        "workdir": "/w",
        "nproc_per_node": 4,
        "nodes": [{"name": "a"}, {"name": "b"}],
        "min_nodes": 1,
    }
)


def test_the_context_weighs_past_failures_only_and_keys_jitter_by_the_next_incident() -> None:
    state = JobState(
        restart_times=[5.0], consecutive_failures=2, pool=NodePool(active=["a", "b"], spares=["s"])
    )
    state.open_incident_now("operator", PlannedMove.OPERATOR, 1.0, action=Action.RESTART, reason="")
    failure = unreachable_failure(SPEC, state, "b", "timed out", now=7.0)
    context = failure_context(SPEC, state, failure, now=8.0)
    assert context.previous == []  # a forced recovery is no failure
    assert context.jitter_key == "j:2"
    assert (context.failure_class, context.rank, context.node) == (FailureClass.NODE_LOST, 4, "b")
    assert (context.now, context.restart_times, context.consecutive_failures) == (8.0, [5.0], 2)
    assert (context.spares_left, context.active_nodes, context.min_nodes) == (1, 2, 1)


def test_an_unreachable_node_is_a_node_loss_on_its_first_rank() -> None:
    state = JobState(generation=3, step=99, pool=NodePool(active=["a", "b"]))
    failure = unreachable_failure(SPEC, state, "b", "ssh: timed out", now=7.0)
    assert failure == FailureReport(
        kind="node_lost",
        failure_class=FailureClass.NODE_LOST,
        rank=4,
        node="b",
        fault_at=7.0,
        detected_at=7.0,
        step_at_failure=99,
        evidence=["launch of generation 3: ssh: timed out"],
    )
    assert unreachable_failure(SPEC, state, "gone", "x", now=1.0).rank == 0


def test_the_unreachable_node_is_read_from_the_launch_error_chain() -> None:
    err = ActivityError(
        "activity failed",
        scheduled_event_id=1,
        started_event_id=2,
        identity="w",
        activity_type="launch",
        activity_id="1",
        retry_state=RetryState.NON_RETRYABLE_FAILURE,
    )
    err.__cause__ = ApplicationError("b: no answer", "b", type=NODE_UNREACHABLE)
    assert unreachable_node(err) == "b"
    err.__cause__ = ApplicationError("no node", type=NODE_UNREACHABLE)
    assert unreachable_node(err) is None
    err.__cause__ = ApplicationError("refused", "b", type="LaunchRefused")
    assert unreachable_node(err) is None
