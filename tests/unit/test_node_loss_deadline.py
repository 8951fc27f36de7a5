"""A silent node's ``node_timeout_s`` counts from its last answer, and the poll loop
wakes at that deadline (issue 28, node loss).

Before, the silence counted from the first poll that failed, which comes up to a
poll interval after the last answer, and the loss was seen at the first round after
the deadline: up to two poll intervals later than ``node_timeout_s`` of silence.
torchrun's rendezvous counts from a node's last keep-alive; so does this now, with
the same timeout. The guard against a live node on a loaded controller (two failed
polls in a row, :data:`MIN_FAILED_POLLS`) is unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.nodes.agent import NodeStatus
from activities.supervise_observer import (
    MIN_ROUND_WAIT_S,
    GenerationObserver,
    node_loss_due_in,
    silent_since,
)
from activities.supervise_rules import MIN_FAILED_POLLS, evaluate
from lazarus.domain.contracts import SuperviseRequest
from lazarus.domain.spec import HealthSpec, NodeSpec


def test_silence_counts_from_the_last_answer() -> None:
    assert silent_since(answered_at=100.2, asked_at=100.7) == 100.2


def test_without_an_answer_silence_counts_from_the_failed_poll() -> None:
    # A retried supervision, or a node silent from the start: no answer to count from.
    assert silent_since(answered_at=None, asked_at=100.7) == 100.7


def test_an_answer_after_the_ask_never_moves_the_silence_later() -> None:
    # Clocks out of step must not make a node look silent for less than it was asked.
    assert silent_since(answered_at=101.0, asked_at=100.7) == 100.7


def test_the_deadline_is_the_first_silent_nodes() -> None:
    silent = {"h2": 100.0, "h3": 101.0}
    assert node_loss_due_in(silent, 5.0, now=103.0) == pytest.approx(2.0)
    assert node_loss_due_in(silent, 5.0, now=106.0) == 0.0
    assert node_loss_due_in({}, 5.0, now=106.0) is None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def wall(self) -> float:
        return self.now

    def mono(self) -> float:
        return self.now


class ScriptedAgent:
    """One node whose polls answer from a script (True: an answer), each taking
    ``poll_s`` of the test's clock."""

    def __init__(self, clock: Clock, script: list[bool], poll_s: float) -> None:
        self.node = NodeSpec(name="h2")
        self.clock, self.script, self.poll_s = clock, script, poll_s

    def poll(self, gen_dir: str, ranks: list[int]) -> NodeStatus:
        self.clock.now += self.poll_s
        reachable = self.script.pop(0)
        return NodeStatus(
            node=self.node.name,
            reachable=reachable,
            error=None if reachable else "no answer within 2 s",
            observed_at=self.clock.now,
        )

    def close(self) -> None:
        pass


def _request(tmp_path: Path) -> SuperviseRequest:
    return SuperviseRequest(
        job_id="j",
        generation=1,
        run_dir=str(tmp_path),
        world_size=1,
        nproc_per_node=1,
        health=HealthSpec(poll_interval_s=0.5),
        node_timeout_s=5.0,
    )


def test_the_observer_dates_a_silence_from_the_last_answer(tmp_path: Path) -> None:
    clock = Clock()
    agent = ScriptedAgent(clock, [True, False, False], poll_s=0.05)
    request = _request(tmp_path)
    observer = GenerationObserver(request, [agent], clock=clock)  # type: ignore[list-item]
    observer.observe()
    answered = clock.now  # the answer came back here
    clock.now += 0.45  # the next round asks half an interval later, and fails
    assert observer.observe().nodes["h2"].unreachable_since == pytest.approx(answered)
    assert observer.due_in() is None, "one failed poll proves nothing yet"
    clock.now += 0.45
    obs = observer.observe()
    assert obs.nodes["h2"].failed_polls == MIN_FAILED_POLLS
    # Due node_timeout_s after the answer, whatever the rounds: the loop wakes then.
    assert observer.due_in() == pytest.approx(answered + 5.0 - clock.now)
    assert observer.round_wait_s() == pytest.approx(0.5)
    clock.now = answered + 4.8
    assert observer.round_wait_s() == pytest.approx(0.2)
    assert evaluate(request, obs, started_at=900.0) is None
    clock.now = answered + 5.0
    assert observer.round_wait_s() == MIN_ROUND_WAIT_S


def test_a_node_answering_again_is_not_silent(tmp_path: Path) -> None:
    clock = Clock()
    agent = ScriptedAgent(clock, [True, False, True, False], poll_s=0.05)
    observer = GenerationObserver(_request(tmp_path), [agent], clock=clock)  # type: ignore[list-item]
    observer.observe()
    observer.observe()
    clock.now += 1.0
    assert observer.observe().nodes["h2"].reachable
    answered = clock.now
    clock.now += 0.5
    assert observer.observe().nodes["h2"].unreachable_since == pytest.approx(answered)
