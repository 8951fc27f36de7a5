"""The simulator's pure model: training progress with checkpoints, the seeded trace, the
configurations it compares."""

from __future__ import annotations

import asyncio
import time

import pytest

from bench.sim_model import (
    DAY_S,
    TraceConfig,
    llama3_profile,
    make_trace,
    progress_at,
)
from bench.simulate import SimConfig, clock_stopped, variants

pytestmark = pytest.mark.timeout(30)


def test_progress_counts_steps_and_blocks_for_each_checkpoint() -> None:
    # 10 steps of 1 s, then 5 s blocked, then the checkpoint at step 10 is committed
    assert progress_at(0, 9.5, every=10, step_s=1.0, checkpoint_s=5.0).checkpoint_step is None
    p = progress_at(0, 15.0, every=10, step_s=1.0, checkpoint_s=5.0)
    assert (p.step, p.checkpoint_step, p.checkpointing_s) == (10, 10, 5.0)
    p = progress_at(10, 17.0, every=10, step_s=1.0, checkpoint_s=5.0)
    assert (p.step, p.checkpoint_step) == (22, 20)


def test_the_trace_is_seeded_and_matches_the_profile_rate() -> None:
    config = TraceConfig(nodes=2048, horizon_s=54 * DAY_S, profile=llama3_profile(8), seed=3)
    first, again = make_trace(config), make_trace(config)
    assert [(e.at_s, e.node) for e in first.events] == [(e.at_s, e.node) for e in again.events]
    expected = 4.7e-4 * 8 * 2048 * 54  # about 416, as Llama 3's 419
    assert 0.8 * expected < len(first.events) < 1.2 * expected
    assert first.lemons and first.flagged


def test_configurations_compare_fixed_auto_lemons_and_spares() -> None:
    rows = {row.name: row for row in variants(SimConfig())}
    assert {"fixed", "fixed+lemon", "auto", "auto+lemon"} <= set(rows)
    assert rows["auto+lemon"].interval_kind == "auto" and rows["auto+lemon"].lemon_exclusion
    assert {rows[f"auto+lemon spares {pct}%"].spares_pct for pct in (0, 2)} == {0, 2}
    tau = SimConfig().tau_s()
    sweep = sorted(row.interval_s for row in rows.values() if row.interval_kind == "sweep")
    assert sweep[0] < tau < sweep[-1]


def test_quick_runs_only_its_rows_and_names_unknown_ones() -> None:
    assert [row.name for row in variants(SimConfig.quick())] == list(SimConfig.quick().rows)
    with pytest.raises(ValueError, match="nope"):
        variants(SimConfig(rows=("nope",)))


async def test_a_clock_that_stands_still_is_reported_with_where_it_stopped() -> None:
    class StillCluster:
        async def now(self) -> float:
            return 4321.0

    stopped_at = await clock_stopped(StillCluster(), after_s=0.2)  # type: ignore[arg-type]
    assert stopped_at == 4321.0


async def test_a_moving_clock_is_not_reported() -> None:
    class MovingCluster:
        seconds = 0.0

        async def now(self) -> float:
            self.seconds += 100.0  # skipping ahead, as a free test server does
            return self.seconds

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(clock_stopped(MovingCluster(), after_s=0.2), timeout=1.0)  # type: ignore[arg-type]


async def test_a_clock_that_only_creeps_in_real_time_counts_as_stopped() -> None:
    # A locked test-server clock still moves at the pace of real time.
    class CreepingCluster:
        async def now(self) -> float:
            return 1000.0 + time.monotonic()

    stopped_at = await clock_stopped(CreepingCluster(), after_s=0.2)  # type: ignore[arg-type]
    assert stopped_at > 1000.0
