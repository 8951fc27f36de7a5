"""Run directories and node lookups are pure functions of spec and state: no server."""

from __future__ import annotations

import pytest

from lazarus.domain.spec import JobSpec
from workflows.placement import (
    active_nodes,
    find_node,
    generation_dir,
    node_spec,
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
