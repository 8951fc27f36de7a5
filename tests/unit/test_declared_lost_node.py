"""Issue 13: a node the scheduler itself declares gone (Slurm: DOWN, DRAIN, FAIL,
NOT_RESPONDING) is lost at its first poll. The confirmation rule for silent nodes
(failed polls in a row and ``node_timeout_s``) exists because a slow ssh answer
proves nothing; Slurm's word about its own node is final, so waiting only delays
the replacement."""

from __future__ import annotations

from activities.nodes.agent import DrainResult
from activities.supervise_rules import NodeObservation, Observation, evaluate
from lazarus.domain.contracts import RankStatus, SuperviseRequest
from lazarus.domain.spec import HealthSpec


def request() -> SuperviseRequest:
    return SuperviseRequest.model_validate(
        {
            "job_id": "j",
            "generation": 1,
            "run_dir": "/nonexistent",
            "world_size": 2,
            "health": HealthSpec(hang_timeout_s=10, startup_timeout_s=60),
            "node_timeout_s": 60.0,
        }
    )


def observation(declared_lost: bool) -> Observation:
    """n2 polled once, Slurm said DOWN; its peer on n1 still runs (no crash yet)."""
    now = 1000.0
    ranks = [
        RankStatus(rank=0, node="n1", pid=100, alive=True, step=9, last_progress_at=999.9),
        RankStatus(rank=1, node="n2", pid=101, alive=True, step=9, last_progress_at=999.9),
    ]
    nodes = {
        "n1": NodeObservation(reachable=True),
        "n2": NodeObservation(
            reachable=False,
            unreachable_since=now - 0.2,
            error="Slurm reports node n2 DOWN+NOT_RESPONDING",
            failed_polls=1,
            declared_lost=declared_lost,
        ),
    }
    return Observation(now=now, launched_at=900.0, ranks=ranks, nodes=nodes, multi_node=True)


def test_a_node_slurm_declares_down_is_lost_at_the_first_poll() -> None:
    outcome = evaluate(request(), observation(declared_lost=True), 900.0, None)
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "node_lost" and outcome.failure.node == "n2"
    assert "DOWN" in outcome.failure.evidence[0]


def test_a_silent_node_still_waits_for_confirmation() -> None:
    assert evaluate(request(), observation(declared_lost=False), 900.0, None) is None


def test_drain_evidence_names_the_node_and_a_refusal() -> None:
    done = DrainResult(node="n2", drained=True, reason="lazarus: node_lost in j")
    assert done.evidence() == "drained node n2 in Slurm: reason='lazarus: node_lost in j'"
    refused = DrainResult(node="n2", drained=False, reason="r", error="Access denied")
    assert "could not drain node n2" in refused.evidence() and "Access denied" in refused.evidence()
