"""A rank carried into a new generation (``rejoin``) must act for it within
``rejoin.timeout_s``: supervision reports one that never does as hung, naming it, so
the whole generation restarts. A fake controller clock; no processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_hang_clock import STARTUP_S, Job

pytestmark = pytest.mark.timeout(60)

REJOIN_S = STARTUP_S / 2


def test_a_survivor_that_never_rejoins_is_reported_hung_after_the_deadline(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, world_size=2, rejoining=[0], rejoin_timeout_s=REJOIN_S)
    assert job.poll() is None
    job.clock.advance(REJOIN_S - 1)
    assert job.poll() is None, "within the deadline"
    job.clock.advance(2)
    outcome = job.poll()
    assert outcome is not None and outcome.failure is not None
    failure = outcome.failure
    assert failure.kind == "hang" and failure.rank == 0
    assert f"did not rejoin it within {REJOIN_S} s" in failure.evidence[0]


def test_a_survivor_that_rejoined_is_not_blamed(tmp_path: Path) -> None:
    job = Job(tmp_path, world_size=2, rejoining=[0], rejoin_timeout_s=REJOIN_S)
    job.clock.advance(5)
    job.beat(0, 41, 0.0, generation=1)
    job.beat(1, 41, 0.0)
    assert job.poll() is None
    job.clock.advance(REJOIN_S)
    job.beat(0, 70, 0.0, generation=1)
    job.beat(1, 70, 0.0)
    assert job.poll() is None


def test_a_joining_heartbeat_meets_the_deadline_but_is_not_progress(tmp_path: Path) -> None:
    # The survivor read its request (it acts for generation 1 here) while the new rank
    # still imports torch: the deadline is met, and the hang clock has not started.
    job = Job(tmp_path, world_size=2, rejoining=[0], rejoin_timeout_s=REJOIN_S)
    job.beat(0, 40, 0.0, generation=1, rejoin="joining")
    first = job.observe()
    assert first.ranks[0].last_progress_at is None and first.ranks[0].step == 40
    job.clock.advance(REJOIN_S + 1)
    assert job.poll() is None, "it rejoined: not hung, and no progress clock to run out"
    job.clock.advance(STARTUP_S)
    outcome = job.poll()
    assert outcome is not None and outcome.failure is not None
    assert "did not rejoin" not in outcome.failure.evidence[0], "the startup clock, not ours"


def test_with_no_heartbeat_at_all_hang_detection_stays_on_while_ranks_rejoin(
    tmp_path: Path,
) -> None:
    # Without carried ranks, a generation with no heartbeat past startup_timeout_s has
    # "no progress signal" and is never called hung; carried ranks use the rank helper.
    job = Job(tmp_path, world_size=2, rejoining=[1], rejoin_timeout_s=STARTUP_S * 3)
    job.clock.advance(STARTUP_S + 1)
    outcome = job.poll()
    assert outcome is not None and outcome.failure is not None
    assert outcome.failure.kind == "hang"
