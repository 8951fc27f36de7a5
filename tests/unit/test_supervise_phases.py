"""Issue 12 §1 and §3, supervisor side: the ranks' phase marks reach the
``first_step`` outcome, and a node already silent is never waited on for evidence.

A scripted agent stands in for the nodes; the clock is moved by hand. No processes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from activities.nodes.agent import NodeStatus, RankRecord
from activities.nodes.shim_agent import LocalShimAgent
from activities.supervise import attach_evidence
from activities.supervise_observer import GenerationObserver, phase_marks
from activities.supervise_rules import MIN_FAILED_POLLS, evaluate
from lazarus.domain import phases
from lazarus.domain.contracts import SuperviseOutcome, SuperviseRequest
from lazarus.domain.spec import HealthSpec, NodeSpec
from tests.fake_nodes import FakeAgent as _ScriptedAgent
from tests.fake_nodes import FakeClock

DASH = "/bin/dash" if os.access("/bin/dash", os.X_OK) else "/bin/sh"


class FakeAgent(_ScriptedAgent):
    """The scripted agent, complete whatever the agent interface grows meanwhile."""

    def end_run(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError


def request(tmp_path: Path, nodes: int = 1, per_node: int = 2, **extra: object) -> SuperviseRequest:
    return SuperviseRequest.model_validate(
        {
            "job_id": "j",
            "generation": 2,
            "run_dir": str(tmp_path / "gen-00002"),
            "world_size": nodes * per_node,
            "nproc_per_node": per_node,
            "health": HealthSpec(hang_timeout_s=30, startup_timeout_s=60),
            "report_after_s": 1e9,
            "node_timeout_s": 5.0,
            **extra,
        }
    )


def beat(step: int, marks: object) -> dict[str, object]:
    return {"step": step, "time": 1.0, phases.HEARTBEAT_FIELD: marks}


def reply(agent: FakeAgent, clock: FakeClock, records: list[RankRecord]) -> None:
    agent.reply = NodeStatus(
        node=agent.node.name, reachable=True, observed_at=clock.wall(), ranks=records
    )


def test_first_step_outcome_carries_the_latest_rank_per_phase(tmp_path: Path) -> None:
    req = request(tmp_path, report_first_step=True, resume_step=10)
    clock = FakeClock()
    agent = FakeAgent(NodeSpec())
    observer = GenerationObserver(req, [agent], clock=clock)
    started = clock.wall()
    rank0 = {
        phases.PROCESS_STARTED: 100.0,
        phases.FRAMEWORK_IMPORTED: 102.0,
        phases.PROCESS_GROUP_READY: 103.5,
        phases.CHECKPOINT_LOADED: 104.0,
        phases.FIRST_STEP: 105.0,
    }
    rank1 = {
        phases.PROCESS_STARTED: 100.2,
        phases.FRAMEWORK_IMPORTED: 102.7,  # the slower import gates the collective
        phases.PROCESS_GROUP_READY: 103.4,
        phases.CHECKPOINT_LOADED: 104.1,
    }
    # Before any step beyond the resume point: no outcome yet.
    reply(
        agent,
        clock,
        [
            RankRecord(rank=0, pid=10, alive=True, heartbeat=beat(10, rank0)),
            RankRecord(rank=1, pid=11, alive=True, heartbeat=beat(10, rank1)),
        ],
    )
    assert evaluate(req, observer.observe(), started) is None
    clock.advance(0.5)
    reply(
        agent,
        clock,
        [
            RankRecord(rank=0, pid=10, alive=True, heartbeat=beat(11, rank0)),
            RankRecord(rank=1, pid=11, alive=True, heartbeat=beat(10, rank1)),
        ],
    )
    outcome = evaluate(req, observer.observe(), started)
    assert outcome is not None and outcome.kind == "first_step"
    assert outcome.rank_phases == {
        phases.PROCESS_STARTED: 100.2,
        phases.FRAMEWORK_IMPORTED: 102.7,
        phases.PROCESS_GROUP_READY: 103.5,
        phases.CHECKPOINT_LOADED: 104.1,
        phases.FIRST_STEP: 105.0,
    }
    # The payload the workflow decodes keeps them.
    again = SuperviseOutcome.model_validate(outcome.model_dump(mode="json"))
    assert again.rank_phases == outcome.rank_phases


def test_a_script_without_the_helper_gives_no_rank_phases(tmp_path: Path) -> None:
    req = request(tmp_path, report_first_step=True, resume_step=0)
    clock = FakeClock()
    agent = FakeAgent(NodeSpec())
    observer = GenerationObserver(req, [agent], clock=clock)
    reply(
        agent,
        clock,
        [
            RankRecord(rank=0, pid=10, alive=True, heartbeat={"step": 1, "time": 1.0}),
            RankRecord(rank=1, pid=11, alive=True, heartbeat={"step": 1, "time": 1.0}),
        ],
    )
    outcome = evaluate(req, observer.observe(), clock.wall())
    assert outcome is not None and outcome.kind == "first_step"
    assert outcome.rank_phases == {}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("not a mapping", {}),
        ([1, 2], {}),
        ({"first_step": "soon", "process_started": True, "x": float("nan")}, {}),
        ({"first_step": 7, "custom": 8.5}, {"first_step": 7.0, "custom": 8.5}),
    ],
)
def test_malformed_marks_cost_the_mark_not_the_supervision(
    raw: object, expected: dict[str, float]
) -> None:
    assert phase_marks(beat(1, raw)) == expected


def test_no_evidence_is_fetched_from_a_node_that_stopped_answering(tmp_path: Path) -> None:
    """The dead host's log fetch used to cost the connect timeout on every node loss."""
    req = request(tmp_path, nodes=2, per_node=1)
    clock = FakeClock()
    alive_node = FakeAgent(NodeSpec(name="h1"))
    dead_node = FakeAgent(NodeSpec(name="h2"))

    fetched: list[int] = []

    def connect_timeout(gen_dir: str, rank: int, max_bytes: int = 65536) -> str:
        fetched.append(rank)  # a real ssh agent would wait out its connect timeout here
        raise TimeoutError("h2: connect timed out")

    dead_node.log_tail = connect_timeout  # type: ignore[method-assign]
    observer = GenerationObserver(req, [alive_node, dead_node], clock=clock)
    started = clock.wall()
    outcome = None
    for _ in range(20):
        reply(alive_node, clock, [RankRecord(rank=0, pid=10, alive=True, heartbeat=beat(5, {}))])
        dead_node.reply = NodeStatus(
            node="h2", reachable=False, error="h2: connect timed out", observed_at=clock.wall()
        )
        outcome = evaluate(req, observer.observe(), started)
        if outcome is not None:
            break
        clock.advance(1.0)
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "node_lost" and outcome.failure.node == "h2"
    assert MIN_FAILED_POLLS >= 2  # the loss took several silent polls: none fetched logs
    failure = attach_evidence(observer, outcome)
    assert fetched == [], "the dead node was contacted for its log"
    assert any("unreachable" in line for line in failure.evidence), failure.evidence


@pytest.mark.timeout(60)
@pytest.mark.slow  # runs the node shim
def test_phases_travel_through_the_node_shim(tmp_path: Path) -> None:
    """SSH nodes: the shim embeds the heartbeat file as it is, nested marks included,
    so the same path carries them (run here through the local shim)."""
    req = request(tmp_path, per_node=1, report_first_step=True, resume_step=3)
    gen = Path(req.run_dir)
    gen.mkdir(parents=True)
    marks = {phases.PROCESS_STARTED: 50.25, phases.FIRST_STEP: 58.5}
    (gen / "rank-0.heartbeat.json").write_text(json.dumps(beat(4, marks)))
    agent = LocalShimAgent(NodeSpec(name="n1"), shell=DASH)
    try:
        observer = GenerationObserver(req, [agent])
        outcome = evaluate(req, observer.observe(), 0.0)
    finally:
        agent.close()
    assert outcome is not None and outcome.kind == "first_step"
    assert outcome.rank_phases == marks
