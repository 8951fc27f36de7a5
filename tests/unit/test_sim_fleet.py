"""The simulation's fleet: its nodes and the memory it starts with, built from the
seeded trace (pure; the quick simulation runs it against the real fleet workflow)."""

from __future__ import annotations

import pytest

from lazarus.domain.fleet import LeaseRequest, is_lemon, lease
from workers.simulate.fleet import LEMON_INCIDENTS, PAST_JOB, fleet_plan
from workers.simulate.model import DAY_S, ClusterTrace, TraceConfig, llama3_profile, make_trace

pytestmark = pytest.mark.timeout(30)

START = 1_000_000_000.0


def trace_of(nodes: int = 600, seed: int = 3) -> ClusterTrace:
    config = TraceConfig(nodes=nodes, horizon_s=10 * DAY_S, profile=llama3_profile(8), seed=seed)
    return make_trace(config)


def test_the_fleet_remembers_each_nodes_look_back_incidents_within_its_window() -> None:
    trace = trace_of()
    plan = fleet_plan(trace, wanted=500, lookback_days=30.0, start=START, seed=3)
    records = {r.name: r for r in plan.fleet.state.nodes} if plan.fleet.state else {}
    assert records
    for name, record in records.items():
        assert len(record.incidents) == trace.lookback[name]
        assert all(
            START - 30 * DAY_S <= i.at <= START and i.job == PAST_JOB for i in record.incidents
        )
    assert plan.fleet.config.lemon.incidents == LEMON_INCIDENTS
    assert plan.fleet.config.lemon.window_h == 30 * 24


def test_the_fleet_holds_just_enough_nodes_that_are_not_lemons() -> None:
    trace = trace_of()
    plan = fleet_plan(trace, wanted=500, lookback_days=30.0, start=START, seed=3)
    state, config = plan.fleet.state, plan.fleet.config
    assert state is not None
    assert [r.name for r in state.nodes] == trace.nodes[: len(state.nodes)]
    lemons = [r.name for r in state.nodes if is_lemon(r, config.lemon, START)]
    assert lemons == plan.lemons_at_start and lemons  # seed 3 has some
    assert len(state.nodes) - len(lemons) == 500
    # The fleet's own lease excludes them and takes every other node.
    granted = lease(
        state.model_copy(deep=True), config, LeaseRequest(job="j", nodes=495, spares=5), START
    )
    taken = {n.name for n in (*granted.nodes, *granted.spares)}
    assert not taken & set(lemons) and len(taken) == 500
    assert sorted(granted.excluded_lemons) == sorted(lemons)


def test_too_few_healthy_nodes_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="not lemons"):
        fleet_plan(trace_of(nodes=40), wanted=45, lookback_days=30.0, start=START, seed=3)
