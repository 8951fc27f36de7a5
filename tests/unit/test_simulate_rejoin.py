"""The simulator's rejoin in place (issue 28, item 7): which ranks a simulated launch
carries over, how many nodes then start ranks, what that saves, and the row that
turns it on through the spec. Pure functions and the spec; no server."""

from __future__ import annotations

import pytest

from lazarus.domain.contracts import LaunchRequest, NodeAccess, StopRequest
from lazarus.domain.spec import JobSpec, NodeSpec, parse_spec
from workers.simulate.cluster import Generation, carried_ranks, starting_nodes, stop_reach
from workers.simulate.model import MEASURED_PHASES_S, MEMORY_CALIBRATION, CostModel, fan_out
from workers.simulate.runner import REJOIN_TIMEOUT_S, SimConfig, sim_spec, variants

pytestmark = pytest.mark.timeout(30)


def spec_on(nodes: list[str], per_node: int = 2) -> JobSpec:
    return parse_spec(
        {
            "name": "sim-rejoin",
            "command": ["python", "train.py"],
            "workdir": "/sim",
            "checkpoint_dir": "/sim/checkpoints",
            "run_dir": "/sim/runs",
            "nodes": [{"name": n} for n in nodes],
            "nproc_per_node": per_node,
            "rejoin": {"enabled": True},
        },
        "<test>",
    )


def generation(number: int, order: list[str]) -> Generation:
    return Generation(
        number=number,
        nodes=frozenset(order),
        resume_step=0,
        every=0,
        launched_at=0.0,
        first_step_at=0.0,
        order=tuple(order),
    )


def launch(nodes: list[str], generation_number: int, ranks: list[int]) -> LaunchRequest:
    spec = spec_on(nodes)
    return LaunchRequest.model_construct(
        spec=spec, generation=generation_number, rejoin_ranks=ranks, nodes=None
    )


def test_a_crash_carries_every_rank_but_the_failed_one() -> None:
    # a, b, c with 2 ranks each; rank 3 (on b) crashed: the workflow asks to keep the rest.
    before = generation(1, ["a", "b", "c"])
    kept = [0, 1, 2, 4, 5]
    assert carried_ranks(launch(["a", "b", "c"], 2, kept), before, ["a", "b", "c"]) == kept
    assert starting_nodes(3, 2, kept) == 1


def test_a_replaced_node_starts_its_slots_ranks_and_the_others_are_carried() -> None:
    # b replaced by the spare s: b's slot (ranks 2, 3) starts on s.
    before = generation(1, ["a", "b", "c"])
    kept = [0, 1, 4, 5]
    assert carried_ranks(launch(["a", "s", "c"], 2, kept), before, ["a", "s", "c"]) == kept
    assert starting_nodes(3, 2, kept) == 1


def test_a_rank_is_never_carried_into_a_slot_that_names_another_node() -> None:
    # The plan kept rank 2 (on b), but b's slot now names s: rank 2 starts afresh.
    before = generation(1, ["a", "b", "c"])
    request = launch(["a", "s", "c"], 2, [0, 1, 2, 4, 5])
    assert carried_ranks(request, before, ["a", "s", "c"]) == [0, 1, 4, 5]
    # A shrunk world carries nothing; nor does a first launch, or no plan at all.
    assert carried_ranks(launch(["a", "c"], 2, [0, 1]), before, ["a", "c"]) == []
    assert carried_ranks(launch(["a", "b", "c"], 1, [0]), None, ["a", "b", "c"]) == []
    assert carried_ranks(launch(["a", "b", "c"], 2, []), before, ["a", "b", "c"]) == []
    assert starting_nodes(3, 2, []) == 3


def test_rejoin_saves_the_survivors_imports_not_the_rendezvous() -> None:
    costs = CostModel(nodes=2048, step_s=10.0, checkpoint_s=2.8, warm_start=True)
    warm = MEMORY_CALIBRATION["warm_import_s"].value
    # Only one node imports: its warm hand-off, with no fan-out.
    assert costs.startup_s - costs.startup_of_s(1) == pytest.approx(warm * (costs.fan_out - 1))
    # Every rank still joins the new store and communicator: 61 s at 16,384 GPUs.
    assert costs.startup_of_s(1) > costs.rendezvous_s > 61.0
    assert fan_out(1) == fan_out(0) == 1.0 and fan_out(2048) == pytest.approx(costs.fan_out)


def test_a_stop_costs_the_fan_out_of_the_nodes_it_reaches() -> None:
    costs = CostModel(nodes=2048, step_s=10.0, checkpoint_s=2.8)
    assert costs.stop_of_s(1) == MEASURED_PHASES_S["stop"]
    assert costs.stop_of_s(2048) == costs.stop_s
    gen = generation(1, ["a", "b", "c"])

    def stop(nodes: list[str]) -> StopRequest:
        access = NodeAccess(nodes=[NodeSpec(name=n) for n in nodes])
        return StopRequest(job_id="j", run_root="/r", access=access)

    only_b, everyone = stop(["b"]), stop([])
    assert stop_reach(only_b, gen) == 1
    assert stop_reach(everyone, gen) == 3


def test_the_rejoin_row_drives_the_workflows_spec() -> None:
    """The memory row plus the spec's ``rejoin``, with a timeout past the rendezvous."""
    config = SimConfig()
    rows = {v.name: v for v in variants(config)}
    row = rows["rejoin+memory+lemon"]
    assert row.rejoin and row.memory and row.lemon_exclusion
    spec = sim_spec(config, row, None, None)
    assert spec.rejoins is not None and not spec.rejoins.node_loss
    assert spec.rejoins.timeout_s == REJOIN_TIMEOUT_S > config.costs().rendezvous_s
    assert sim_spec(config, rows["memory+lemon"], None, None).rejoins is None
