"""The cross-node rows of the chaos matrix (issue 28) are cells of it: listed with what
each tests, run on SSH test hosts, and every other pair of their faults and phases has
its reason. What they do end to end is ``tests/netns/test_chaos_multinode.py`` and
``python -m tests.chaos``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.harness import RunRecord
from lazarus.domain.checkpoint_layout import step_dir_name
from tests.chaos import matrix as chaos
from tests.chaos import multinode as chaos_multinode
from tests.chaos.invariants import GenerationCensus, Launch, memory_left
from tests.chaos.points import ChaosPoints

CROSS_NODE = (
    "rank_sigkill@ssh_rejoin",
    "worker_sigkill@ssh_rejoin",
    "node_and_buddy_lost@replicated",
    "replica_torn@replicated",
)


def test_the_cross_node_cells_are_in_the_matrix() -> None:
    for key in CROSS_NODE:
        cell = chaos.CELLS_BY_KEY[key]
        assert cell.ssh is not None, key
        assert cell.why and cell.fault in chaos.FAULTS and cell.phase in chaos.PHASES, key
        assert key not in chaos.SMOKE, "a cross-node cell is no smoke cell: it needs netns"
    replicated = [chaos.CELLS_BY_KEY[k] for k in CROSS_NODE if k.endswith("@replicated")]
    assert all(c.memory and c.ssh and c.ssh.replicas and c.check for c in replicated)
    assert all(c.ssh and c.ssh.world_size == 3 == c.world_size for c in replicated)
    rejoins = [chaos.CELLS_BY_KEY[k] for k in CROSS_NODE if k.endswith("@ssh_rejoin")]
    assert all(c.rejoin and c.ssh and not c.ssh.points_in_ranks for c in rejoins)


def test_every_cross_node_pair_is_a_cell_or_has_a_reason() -> None:
    faults = [*chaos_multinode.FAULTS, "rank_sigkill", "survivor_sigkill"]
    for fault in faults:
        for phase in chaos.PHASES:
            if f"{fault}@{phase}" not in chaos.CELLS_BY_KEY:
                assert chaos.absent_reason(fault, phase), (fault, phase)
    for phase in chaos_multinode.PHASES:
        for fault in chaos.FAULTS:
            if f"{fault}@{phase}" not in chaos.CELLS_BY_KEY:
                assert "ssh" in chaos.absent_reason(fault, phase), (fault, phase)


def test_the_list_shows_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert chaos.run(argparse.Namespace(list=True)) == 0
    listed = capsys.readouterr().out
    for key in CROSS_NODE:
        assert key in listed


def test_cells_are_selectable_by_key() -> None:
    assert chaos._cell_keys(",".join(CROSS_NODE)) == list(CROSS_NODE)


def test_leftovers_include_the_replicas_a_node_holds(tmp_path: Path) -> None:
    job = tmp_path / "job"
    (job / "run" / "step-3").mkdir(parents=True)
    (job / "run" / "replicas" / "slot-1" / "step-2").mkdir(parents=True)
    assert [Path(p).relative_to(job).as_posix() for p in memory_left(job)] == [
        "run/replicas/slot-1/step-2",
        "run/step-3",
    ]


def test_the_census_reads_every_memory_it_is_given(tmp_path: Path) -> None:
    """A census over several tmpfs (one per host) sees each committed snapshot's writer."""

    class TwoHosts(GenerationCensus):
        def memory_job_dirs(self) -> list[Path]:
            return [tmp_path / "h1" / "job", tmp_path / "h2" / "job"]

    for host, step, generation in (("h1", 4, 1), ("h2", 6, 2)):
        snapshot = tmp_path / host / "job" / "run" / step_dir_name(step)
        snapshot.mkdir(parents=True)
        (snapshot / "manifest.json").write_text(json.dumps({"generation": generation}))
        (snapshot / "COMMITTED").write_text("{}")
    census = TwoHosts(tmp_path / "runs")
    census.sample()
    writers = {k.rsplit("/", 1)[-1]: [w.generation for w in v] for k, v in census.writers.items()}
    assert writers == {step_dir_name(4): [1], step_dir_name(6): [2]}


def test_the_replica_checks_read_the_first_launch_after_the_loss() -> None:
    launches = [
        Launch(1, 0, None, at=1.0),
        Launch(2, 15, "/ckpt/step-15", at=10.0),
        Launch(3, 18, "/dev/shm/lazarus/job/run/step-18", at=20.0),
    ]
    first = chaos_multinode._first_launch_after(launches, 5.0)
    assert first is not None and first.generation == 2
    assert chaos_multinode._first_launch_after(launches, 30.0) is None


def test_without_test_hosts_the_cross_node_cells_are_skipped_with_the_reason(
    tmp_path: Path,
) -> None:
    cells = [chaos.CELLS_BY_KEY[key] for key in CROSS_NODE]
    [scenario, *_] = chaos.scenarios_for(cells, ChaosPoints(tmp_path))
    assert scenario.unavailable is not None  # the netns check
    why = "SSH test hosts (network namespaces) unavailable: not root"
    records = [
        RunRecord(key, 1, started_at=0.0, wall_clock_s=0.0, metrics={}, details={}, skipped=why)
        for key in CROSS_NODE
    ]
    states = {f"{r.fault}@{r.phase}": r for r in chaos.results(cells, records)}
    assert all(states[key].state == "skipped" and states[key].reason == why for key in CROSS_NODE)
    assert "4 skipped" in chaos.summary_line(list(states.values()))
    assert "skipped" in chaos.render_table(list(states.values()))
