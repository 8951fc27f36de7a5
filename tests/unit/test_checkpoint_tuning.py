"""``checkpoints.interval: auto`` as the workflow decides it (pure, no server): when an
interval is sent, with what steps, and what ``status`` shows; and the spec's fields."""

from __future__ import annotations

from typing import Any

import pytest

from lazarus.domain.checkpoint_interval import LLAMA3_NODE_MTBF_H, daly_interval_s
from lazarus.domain.contracts import SuperviseOutcome
from lazarus.domain.spec import JobSpec, SpecError, parse_spec
from workflows.checkpoint_tuning import (
    interruptions,
    interval_in_force,
    interval_request,
    record_sent,
    retune,
    status_view,
)
from workflows.state import Incident, JobState, NodePool, Phase
from workflows.status import job_status

pytestmark = pytest.mark.timeout(10)


def spec(**checkpoints: Any) -> JobSpec:
    return parse_spec(
        {
            "name": "tuned",
            "command": ["python", "t.py"],
            "workdir": "/w",
            "checkpoints": {"interval": "auto", "mtbf_prior_h": 1.0, **checkpoints},
        },
        "<test>",
    )


def running(generation: int = 1, nodes: int = 1, per_step: float | None = 0.5) -> JobState:
    return JobState(
        phase=Phase.RUNNING,
        generation=generation,
        generation_live=True,
        started_at=0.0,
        seconds_per_step=per_step,
        pool=NodePool(active=[f"n{i}" for i in range(nodes)]),
    )


def report(save_s: float | None, generation: int = 1) -> SuperviseOutcome:
    return SuperviseOutcome(
        kind="progress", generation=generation, observed_at=0.0, checkpoint_save_s=save_s
    )


def test_the_first_measurement_sends_dalys_interval_in_steps() -> None:
    job, state = spec(), running()
    state.pool.active = [node.name for node in job.nodes]
    change = retune(job, state, report(2.0), now=0.0)
    tau = daly_interval_s(2.0, 3600.0)  # prior 1 h, one node, no history yet
    assert change is not None and change.every_steps == round(tau / 0.5)
    view = state.checkpoint_interval
    assert view is not None and view.optimum_s == pytest.approx(tau)
    assert view.job_mtbf_s == pytest.approx(3600.0)
    request = interval_request(job, state, change)
    assert request.checkpoint_every_steps == change.every_steps and request.checkpoint_request == 0
    sent = record_sent(state, change, now=5.0)
    assert (sent.every_steps, sent.sent_generation, sent.changes) == (change.every_steps, 1, 1)
    assert sent.expected_loss is not None and 0 < sent.expected_loss < 0.1


def test_a_similar_report_sends_nothing_and_a_big_change_sends_again() -> None:
    job, state = spec(), running()
    first = retune(job, state, report(2.0), now=0.0)
    assert first is not None
    record_sent(state, first, now=0.0)
    assert retune(job, state, report(2.2), now=10.0) is None  # τ ~ √δ: +5%
    assert retune(job, state, report(None), now=20.0) is None  # δ kept from before
    bigger = retune(job, state, report(4.0), now=30.0)  # τ ~ √δ: +41%
    assert bigger is not None and bigger.every_steps > first.every_steps * 1.2
    assert "more than 20%" in bigger.reason


def test_nothing_is_sent_before_a_save_was_measured_or_a_step_rate_known() -> None:
    job = spec()
    assert retune(job, running(), report(None), now=0.0) is None
    assert retune(job, running(), report(0.0), now=0.0) is None
    assert retune(job, running(per_step=None), report(2.0), now=0.0) is None


def test_each_new_generation_is_sent_the_interval_once() -> None:
    job, state = spec(), running()
    change = retune(job, state, report(2.0), now=0.0)
    assert change is not None
    record_sent(state, change, now=0.0)
    assert interval_in_force(job, state) == change.every_steps
    state.generation = 2  # a relaunch wrote the spec's interval into its control file
    assert interval_in_force(job, state) is None
    again = retune(job, state, report(None, generation=2), now=60.0)
    assert again is not None and "generation 2" in again.reason


def test_the_job_mtbf_shrinks_with_nodes_and_with_its_own_interruptions() -> None:
    job = spec()
    one, four = running(nodes=1), running(nodes=4)
    retune(job, one, report(2.0), now=0.0)
    retune(job, four, report(2.0), now=0.0)
    assert one.checkpoint_interval and four.checkpoint_interval
    assert four.checkpoint_interval.job_mtbf_s == pytest.approx(
        one.checkpoint_interval.job_mtbf_s / 4
    )
    crashed = running()
    crashed.incidents = [
        Incident.opened(
            id=i, generation=1, kind="crash", failure_class="unknown", fault_at=1.0, detected_at=1.0
        )
        for i in (1, 2)
    ]
    crashed.dropped_by_class = {"hang": 3, "straggler": 4}
    assert interruptions(crashed) == 5
    retune(job, crashed, report(2.0), now=3600.0)
    assert crashed.checkpoint_interval is not None
    # prior 1 h worth 5 failures, plus 5 failures in 1 node-hour: (5 + 1) / (5 + 5) h
    assert crashed.checkpoint_interval.node_mtbf_h == pytest.approx(0.6)
    assert "5 interruptions" in crashed.checkpoint_interval.mtbf_source


def test_status_shows_the_tuning_only_for_auto() -> None:
    fixed = parse_spec({"name": "f", "command": ["python", "t.py"]}, "<test>")
    assert status_view(fixed, running(), 0.0) is None
    assert job_status(fixed, running(), 0.0, "/r").checkpoint_interval is None
    before = job_status(spec(mtbf_prior_h=None), running(), 0.0, "/r").checkpoint_interval
    assert before is not None and before.node_mtbf_h == pytest.approx(LLAMA3_NODE_MTBF_H)
    assert before.optimum_s is None and before.every_steps is None


def test_a_just_in_time_request_carries_the_spec_interval_without_tuning() -> None:
    job = parse_spec(
        {"name": "f", "command": ["python", "t.py"], "checkpoints": {"every_steps": 40}}, "<t>"
    )
    assert interval_in_force(job, running()) == 40


@pytest.mark.parametrize(
    ("checkpoints", "message"),
    [
        ({"interval": 100}, "checkpoints.interval: 100: a fixed interval is every_steps: 100"),
        ({"interval": "often"}, "checkpoints.interval: 'often' is not 'auto'"),
        ({"mtbf_prior_h": 10.0}, "checkpoints: mtbf_prior_h is only used with interval: auto"),
        ({"interval": "auto", "every_steps": 0}, "every_steps: 0 (save only when asked)"),
        ({"interval": "auto", "mtbf_prior_h": 0}, "checkpoints.mtbf_prior_h: must be more than 0"),
    ],
)
def test_the_spec_names_the_field_that_is_wrong(checkpoints: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(
            {"name": "f", "command": ["python", "t.py"], "checkpoints": checkpoints}, "j.yaml"
        )
    assert message in str(caught.value)


def test_the_spec_accepts_auto_with_a_starting_interval_and_a_whole_number_prior() -> None:
    job = spec(every_steps=50, mtbf_prior_h=2000)
    assert job.checkpoints.interval == "auto" and job.checkpoints.every_steps == 50
    assert job.checkpoints.mtbf_prior_h == 2000.0


def test_status_shows_delta_m_tau_the_interval_and_the_loss_for_people_and_scripts() -> None:
    from rich.console import Console

    from lazarus.app import cli_render

    job, state = spec(), running()
    state.pool.active = [node.name for node in job.nodes]
    change = retune(job, state, report(2.0), now=0.0)
    assert change is not None
    record_sent(state, change, now=1.0)
    status = job_status(job, state, 10.0, "/r")
    view = cli_render.StatusView("lazarus-tuned", "RUNNING", status)
    document = cli_render.status_json(view)["checkpoint_interval"]
    assert document["checkpoint_save_s"] == 2.0 and document["every_steps"] == change.every_steps
    for key in ("job_mtbf_s", "optimum_s", "expected_loss", "node_mtbf_h", "mtbf_source"):
        assert document[key] is not None
    console = Console(width=200, record=True, color_system=None)
    console.print(cli_render.render_status(view))
    text = console.export_text()
    assert "Checkpoint interval (auto, Young-Daly)" in text
    assert f"{change.every_steps} steps" in text and "2.00s" in text
    silent = cli_render.status_json(cli_render.StatusView("lazarus-tuned", "RUNNING", None))
    assert "checkpoint_interval" in silent and silent["checkpoint_interval"] is None
