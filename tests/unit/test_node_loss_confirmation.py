"""Defect 19 (issue 10): a loaded controller must not declare live nodes lost.

On a saturated machine a 2 s SSH poll of a perfectly healthy host times out now
and then. While the peers of a really dead node are crashing (``crashed``), the
old rule declared *any* node with one failed poll lost at once, so one slow answer
quarantined a live host, the next one took the last spare, and the job waited in
NEEDS_OPERATOR. A node is lost only after failing polls in a row.
"""

from __future__ import annotations

from pathlib import Path

from activities.nodes.agent import NodeStatus
from activities.supervise_observer import GenerationObserver
from activities.supervise_rules import (
    MIN_FAILED_POLLS,
    NodeObservation,
    Observation,
    evaluate,
)
from lazarus.domain.contracts import RankStatus, SuperviseRequest
from lazarus.domain.spec import HealthSpec, NodeSpec


def request(tmp: str = "/nonexistent") -> SuperviseRequest:
    return SuperviseRequest.model_validate(
        {
            "job_id": "j",
            "generation": 2,
            "run_dir": tmp,
            "world_size": 3,
            "nproc_per_node": 1,
            "health": HealthSpec(hang_timeout_s=10, startup_timeout_s=60),
            "node_timeout_s": 5.0,
        }
    )


def observation(failed_polls: dict[str, int], silent_s: float = 1.0) -> Observation:
    """h2 died (its peer on h1 crashed, losing it); h3 is alive but its last poll(s)
    timed out, as on a loaded controller."""
    now = 1000.0
    ranks = [
        RankStatus(rank=0, node="h1", pid=100, alive=False, exit_code=1, ended_at=999.0, step=9),
        RankStatus(rank=1, node="h2", pid=101, alive=False, step=9),
        RankStatus(rank=2, node="h3", pid=102, alive=True, step=9, last_progress_at=999.5),
    ]
    nodes = {
        "h1": NodeObservation(reachable=True),
        "h2": NodeObservation(
            reachable=False,
            unreachable_since=now - 4.0,
            error="h2: connect timed out",
            failed_polls=failed_polls["h2"],
        ),
        "h3": NodeObservation(
            reachable=False,
            unreachable_since=now - silent_s,
            error="h3: no answer within 2 s",
            failed_polls=failed_polls["h3"],
        ),
    }
    return Observation(now=now, launched_at=900.0, ranks=ranks, nodes=nodes, multi_node=True)


def test_one_slow_poll_of_a_live_node_is_not_a_node_loss() -> None:
    # h3 failed one poll, earlier than h2 went silent: the old rule named h3 lost.
    obs = observation({"h2": MIN_FAILED_POLLS, "h3": 1}, silent_s=6.0)
    outcome = evaluate(request(), obs, started_at=900.0)
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "node_lost"
    assert outcome.failure.node == "h2", outcome.failure


def test_a_node_silent_across_polls_is_lost() -> None:
    obs = observation({"h2": 0, "h3": MIN_FAILED_POLLS}, silent_s=6.0)
    obs.nodes["h2"] = NodeObservation(reachable=True)
    outcome = evaluate(request(), obs, started_at=900.0)
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "node_lost" and outcome.failure.node == "h3"


class FlakyAgent:
    """Answers from a script of reachable/unreachable polls."""

    def __init__(self, name: str, script: list[bool]) -> None:
        self.node = NodeSpec(name=name)
        self.script = script

    def poll(self, gen_dir: str, ranks: list[int]) -> NodeStatus:
        reachable = self.script.pop(0)
        return NodeStatus(
            node=self.node.name,
            reachable=reachable,
            error=None if reachable else "timed out",
            observed_at=0.0,
        )

    def close(self) -> None:
        pass


def test_the_observer_counts_consecutive_failed_polls_only(tmp_path: Path) -> None:
    agent = FlakyAgent("h1", [False, True, False, False])
    observer = GenerationObserver(request(str(tmp_path)), [agent])  # type: ignore[list-item]
    counts = [observer.observe().nodes["h1"].failed_polls for _ in range(4)]
    assert counts == [1, 0, 1, 2]
