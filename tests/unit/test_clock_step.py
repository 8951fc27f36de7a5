"""A wall clock stepped backwards (NTP, a resumed VM) must never wedge the workflow.

The supervisor measures seconds per step from the ranks' wall clocks; once that gave a
negative rate, ``checkpoints.interval: auto`` divided by it in workflow code and the
``ValueError`` failed the workflow task on every retry (the audit of 2026-12-03, under
"Suspicions not confirmed", issue 26). Pure: no server."""

from __future__ import annotations

import math

import pytest

from activities.supervise_rules import StepRate
from lazarus.domain.contracts import RankStatus, SuperviseOutcome
from lazarus.domain.spec import parse_spec
from workflows.checkpoint_tuning import retune
from workflows.state import JobState, NodePool, Phase

pytestmark = pytest.mark.timeout(10)


def rank(step: int, at: float) -> RankStatus:
    return RankStatus(rank=0, pid=100, alive=True, step=step, last_progress_at=at)


def test_a_backward_clock_step_gives_no_rate_then_a_good_one_again() -> None:
    rate = StepRate()
    assert rate.update([rank(10, 1000.0)]) is None
    assert rate.update([rank(20, 1005.0)]) == 0.5
    # The clock steps back an hour between two marks: no negative rate ...
    assert rate.update([rank(30, 1005.0 - 3600.0)]) is None
    # ... and the window restarts there, so the rate comes back once time moves on.
    assert rate.update([rank(40, 1005.0 - 3600.0 + 5.0)]) == 0.5


def test_marks_with_the_same_time_give_no_rate() -> None:
    rate = StepRate()
    assert rate.update([rank(10, 1000.0)]) is None
    assert rate.update([rank(20, 1000.0)]) is None


@pytest.mark.parametrize("per_step", [-0.5, 0.0, math.inf, math.nan, None])
def test_the_interval_is_not_tuned_on_a_rate_it_cannot_divide_by(per_step: float | None) -> None:
    spec = parse_spec(
        {
            "name": "tuned",
            "command": ["python", "t.py"],
            "workdir": "/w",
            "checkpoints": {"interval": "auto", "mtbf_prior_h": 1.0},
        },
        "<test>",
    )
    state = JobState(
        phase=Phase.RUNNING,
        generation=1,
        generation_live=True,
        started_at=0.0,
        seconds_per_step=per_step,
        pool=NodePool(active=["n0"]),
    )
    outcome = SuperviseOutcome(
        kind="progress", generation=1, observed_at=0.0, checkpoint_save_s=2.0
    )
    assert retune(spec, state, outcome, now=0.0) is None
    assert state.checkpoint_interval is not None
    assert state.checkpoint_interval.seconds_per_step is None
