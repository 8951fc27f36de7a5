"""The simulator's memory tier (issue 28, item 7): what a snapshot costs, which
interval Young-Daly gives it, which step a relaunch resumes from, and when a lost
node's snapshot comes from its buddy's replica or from disk. Pure functions and the
spec the simulator feeds the real workflow; no server."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from lazarus.domain.contracts import NodeAccess, StopRequest
from lazarus.domain.spec import NodeSpec
from workers.simulate.cli import add_command, config_from
from workers.simulate.cluster import Generation, stops_generation
from workers.simulate.model import (
    LLAMA3_STATE_BYTES_PER_GPU,
    MEMORY_CALIBRATION,
    REPLICA_PUSH_COST_FILE,
    REPLICA_PUSH_S_PER_GB,
    SNAPSHOT_COST_FILE,
    SNAPSHOT_S_PER_GB,
    CostModel,
    buddy_of,
    effective_step_s,
    memory_interval_steps,
    memory_snapshot_s,
    newest_snapshot,
    progress_at,
    snapshot_reachable,
)
from workers.simulate.runner import SimConfig, sim_spec, variants

pytestmark = pytest.mark.timeout(30)

REPO = Path(__file__).resolve().parents[2]


def test_a_snapshot_costs_the_measured_copy_of_a_gpus_share_and_the_nodes_push() -> None:
    # 0.133 s per GB measured, times 5.7 TB / 16,384 GPUs (0.35 GB): 46 ms; with
    # replicas, 0.064 s per GB pushed times the node's 8 shares (2.8 GB): 0.18 s more.
    share_gb = 405e9 * 14 / 16_384 / 1e9
    assert memory_snapshot_s(replicas=False) == pytest.approx(0.1328 * share_gb)
    assert memory_snapshot_s(replicas=True) == pytest.approx(
        0.1328 * share_gb + 0.0644 * 8 * share_gb
    )
    assert memory_snapshot_s(replicas=False, state_bytes_per_gpu=1e9) == 0.1328
    assert memory_snapshot_s(
        replicas=True, state_bytes_per_gpu=1e9, gpus_per_node=4
    ) == pytest.approx(0.1328 + 4 * 0.0644)


def test_the_snapshot_cost_per_gb_is_the_measured_files_largest_size() -> None:
    """The constant is the file's figure, not a number typed in beside it."""
    measured = json.loads((REPO / SNAPSHOT_COST_FILE).read_text())
    largest = max(measured["rows"], key=lambda row: row["size_mb"])
    assert largest["size_mb"] >= 1024 and len(largest["blocking_s"]) >= 5
    assert largest["blocking_s_per_gb"] == pytest.approx(SNAPSHOT_S_PER_GB, abs=5e-5)
    assert MEMORY_CALIBRATION["snapshot_s_per_gb"].value == SNAPSHOT_S_PER_GB


def test_the_replica_push_cost_per_gb_is_the_measured_files_separate_cores_figure() -> None:
    """Separate cores (a GPU node has cores to spare beside its ranks), the largest size."""
    measured = json.loads((REPO / REPLICA_PUSH_COST_FILE).read_text())
    separate = [row for row in measured["rows"] if row["placement"] == "separate"]
    largest = max(separate, key=lambda row: row["size_mb"])
    assert largest["size_mb"] >= 1024 and len(largest["pushes"]) >= 5
    assert largest["extra_s_per_gb"] == pytest.approx(REPLICA_PUSH_S_PER_GB, abs=5e-5)
    assert MEMORY_CALIBRATION["replica_push_s_per_gb"].value == REPLICA_PUSH_S_PER_GB


def test_each_measured_figure_names_the_results_page_it_comes_from() -> None:
    for name, figure in MEMORY_CALIBRATION.items():
        page = figure.source.split(":")[0]
        assert (REPO / page).is_file(), (name, page)
        assert figure.feeds, name


def test_the_memory_interval_is_young_daly_at_the_snapshot_cost() -> None:
    # Llama 3 at 2,048 nodes: M = 3.1 h, a 0.22 s snapshot of a 10 s step: 7 steps.
    config = SimConfig()
    snapshot = memory_snapshot_s(replicas=True)
    every = memory_interval_steps(snapshot, config.mtbf_s(), config.step_s)
    assert every == config.memory_interval() == 7
    assert memory_interval_steps(0.0, config.mtbf_s(), config.step_s) == 1
    assert SimConfig(memory_every_steps=3).memory_interval() == 3


def test_snapshots_slow_each_step_by_their_cost_over_the_interval() -> None:
    assert effective_step_s(10.0, 0, 0.5) == 10.0
    assert effective_step_s(10.0, 10, 0.5) == pytest.approx(10.05)
    # The generation's progress runs at that step time, disk checkpoints on top.
    assert progress_at(0, 10 * 10.05, every=0, step_s=10.05, checkpoint_s=2.8).step == 10


def test_a_relaunch_resumes_from_the_newest_snapshot_or_the_step_it_resumed_from() -> None:
    assert newest_snapshot(frozen_step=57, resume_step=0, memory_every=10) == 50
    assert newest_snapshot(frozen_step=57, resume_step=0, memory_every=1) == 57
    # Resumed from 53 (a snapshot of the interval before): the tier still holds it.
    assert newest_snapshot(frozen_step=58, resume_step=53, memory_every=10) == 53


def test_a_spare_takes_the_snapshot_from_its_buddys_replica() -> None:
    before = ["a", "b", "c"]
    assert buddy_of(before, 1) == "c" and buddy_of(before, 2) == "a"
    # Same nodes (a crash, a hang): every node holds its own snapshot.
    assert snapshot_reachable(before, ["a", "b", "c"], replicas=False) == (True, 0)
    # b lost, s in its slot: c holds b's replica.
    assert snapshot_reachable(before, ["a", "s", "c"], replicas=True) == (True, 1)
    # Without replicas a spare holds nothing: disk serves.
    assert snapshot_reachable(before, ["a", "s", "c"], replicas=False) == (False, 0)


def test_a_buddy_lost_with_the_node_it_protects_leaves_disk() -> None:
    before = ["a", "b", "c"]
    # b and its buddy c both replaced: b's snapshot is nowhere.
    assert snapshot_reachable(before, ["a", "s", "t"], replicas=True) == (False, 0)
    # a and b replaced: a's replica is on b (gone), so disk too.
    assert snapshot_reachable(before, ["s", "t", "c"], replicas=True) == (False, 0)
    # A shrunk world: slots moved, no memory resume.
    assert snapshot_reachable(before, ["a", "c"], replicas=True) == (False, 0)


def test_warm_starts_replace_the_cold_imports_leg() -> None:
    cold = CostModel(nodes=2048, step_s=10.0, checkpoint_s=2.8)
    warm = CostModel(nodes=2048, step_s=10.0, checkpoint_s=2.8, warm_start=True)
    saved = (1.862 - MEMORY_CALIBRATION["warm_import_s"].value) * cold.fan_out
    assert cold.startup_s - warm.startup_s == pytest.approx(saved)
    # A node's 2.8 GB share at the restore rate measured at 1 GiB, plus its start.
    node_gb = LLAMA3_STATE_BYTES_PER_GPU * warm.gpus_per_node / 1e9
    restore = (
        MEMORY_CALIBRATION["replica_restore_start_s"].value
        + node_gb * MEMORY_CALIBRATION["replica_restore_s_per_gb"].value
    )
    assert warm.as_dict()["replica_restore_s"] == pytest.approx(restore)
    assert 3.0 < restore < 6.0


def test_the_memory_row_drives_the_workflows_spec() -> None:
    """The row turns on the product's own sections; the disk interval is the fixed hour."""
    config = SimConfig()
    row = {v.name: v for v in variants(config)}["memory+lemon"]
    assert row.memory and row.lemon_exclusion and row.interval_kind == "fixed"
    spec = sim_spec(config, row, None, None)
    assert spec.checkpoints.memory_every_steps == config.memory_interval()
    assert spec.checkpoints.memory_replicas and spec.warm is not None
    assert spec.checkpoints.every_steps == 360 and spec.checkpoints.interval is None
    plain = sim_spec(config, {v.name: v for v in variants(config)}["auto+lemon"], None, None)
    assert plain.checkpoints.memory_every_steps is None and plain.warm is None


def test_the_memory_interval_can_be_given_on_the_command_line() -> None:
    parser = argparse.ArgumentParser()
    add_command(parser.add_subparsers())
    args = parser.parse_args(["simulate", "--rows", "memory+lemon", "--memory-every", "1"])
    assert config_from(args).memory_interval() == 1


def test_a_stop_beside_the_running_generation_leaves_it_training() -> None:
    """With warm_start the job stops nodes outside the generation (a quarantined node's
    zygote before its hand-back): only a stop that reaches the generation freezes it."""
    gen = Generation(
        number=7,
        nodes=frozenset({"a", "b"}),
        resume_step=0,
        every=10,
        launched_at=0.0,
        first_step_at=1.0,
    )

    def stop(nodes: list[str], **extra: object) -> StopRequest:
        access = NodeAccess(nodes=[NodeSpec(name=n) for n in nodes])
        return StopRequest(job_id="j", run_root="/r", access=access, **extra)

    assert not stops_generation(stop(["q"]), gen)
    assert not stops_generation(stop(["a", "b"], keep_generation=7), gen)
    assert not stops_generation(stop(["a"], skip_nodes=["a"]), gen)
    assert stops_generation(stop(["a", "q"]), gen)
    assert stops_generation(stop([]), gen)


def test_dalys_expectation_for_a_memory_row_charges_the_memory_interval() -> None:
    """Failures lose the memory interval's work, disk checkpoints cost only δ: the
    memory row's JSON compares with this, not with the disk interval's Daly."""
    config = SimConfig()
    memory = config.memory_daly_ettr(3600.0, restart_s=120.0, mtbf_s=12_000.0)
    assert memory > config.daly_ettr(3600.0, restart_s=120.0, mtbf_s=12_000.0) + 0.1
    assert 0.97 < memory < 0.99
