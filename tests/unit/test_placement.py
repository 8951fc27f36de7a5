"""Run directories and node lookups are pure functions of spec and state: no server."""

from __future__ import annotations

import pytest

from lazarus.domain.spec import JobSpec
from workflows.placement import (
    active_nodes,
    find_node,
    generation_dir,
    node_spec,
    prewarm_nodes,
    run_root,
    world_size,
)
from workflows.state import JobState, NodePool

SPEC = JobSpec.model_validate(
    {
        "name": "j",
        "command": ["python", "t.py"],
        "workdir": "/w",
        "run_dir": "/runs",
        "nproc_per_node": 4,
        "nodes": [{"name": "a"}, {"name": "b"}],
        "spares": [{"name": "s"}],
    }
)


def test_each_start_has_its_own_run_directory_and_legacy_jobs_keep_theirs() -> None:
    state = JobState(run_key="run-abc", generation=7)
    assert run_root(SPEC, state) == "/runs/j/run-abc"
    assert generation_dir(SPEC, state) == "/runs/j/run-abc/gen-00007"
    assert run_root(SPEC, JobState()) == "/runs/j"


def test_nodes_are_looked_up_among_nodes_and_spares_in_rank_order() -> None:
    pool = NodePool(active=["s", "a"])
    assert [n.name for n in active_nodes(SPEC, pool)] == ["s", "a"]
    assert world_size(SPEC, pool) == 8
    assert find_node(SPEC, "b") is not None and find_node(SPEC, "zz") is None
    with pytest.raises(KeyError, match="zz"):
        node_spec(SPEC, "zz")


WARM = JobSpec.model_validate(
    {
        **SPEC.model_dump(),
        "spares": [{"name": "s"}, {"name": "t"}],
        "warm_start": {"preload": ["json"]},
    }
)
"""Nodes a and b, spares s and t, warm starts on."""


def test_with_warm_starts_every_spare_that_runs_no_rank_is_prewarmed() -> None:
    """The launch prewarms the pool's spares, in pool order; a spare that took a lost
    node's slot runs ranks (the launch's own warm start starts its zygote), and a
    quarantined node is no spare."""
    pool = NodePool(active=["a", "b"], spares=["s", "t"])
    assert [n.name for n in prewarm_nodes(WARM, pool)] == ["s", "t"]
    pool.replace("b", "node_lost", 1.0)
    assert pool.active == ["a", "s"]
    assert [n.name for n in prewarm_nodes(WARM, pool)] == ["t"]
    pool.quarantine("t", "gpu_hardware", 2.0)
    assert prewarm_nodes(WARM, pool) == []
    pool.release("b")  # lazarus return: b waits as a spare again
    assert [n.name for n in prewarm_nodes(WARM, pool)] == ["b"]


def test_no_spare_is_prewarmed_without_warm_starts_or_when_it_already_runs_ranks() -> None:
    assert prewarm_nodes(SPEC, NodePool(active=["a", "b"], spares=["s"])) == []
    both = NodePool(active=["a", "s"], spares=["s", "ghost"])  # never both; never unknown
    assert prewarm_nodes(WARM, both) == []
