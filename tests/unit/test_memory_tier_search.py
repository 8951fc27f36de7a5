"""The memory checkpoint tier, controller side: the cross-node choice in the
checkpoint search, the launcher's variables and control file, and the spec fields.

Snapshots are written by the real rank helper (:mod:`lazarus.rank.memory`), so the
search reads exactly what ranks commit. "Nodes" are fake agents that answer with a
directory each: two logical nodes of one machine would share one tmpfs directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest

from activities.checkpoints import find as find_module
from activities.checkpoints import memory_tier
from activities.checkpoints.just_in_time import request_checkpoint
from activities.launcher import initial_control_document, rank_environment
from activities.nodes.agent import MemorySnapshot, NodeAgent, NodeUnreachable
from activities.nodes.local.agent import LocalAgent, local_memory_snapshots
from activities.nodes.rundir import GenerationDir, job_root, read_json
from activities.nodes.shim_agent import LocalShimAgent
from lazarus.domain import checkpoint_layout, environment
from lazarus.domain.contracts import CheckpointNowRequest, FindVerifiedCheckpointRequest, NodeAccess
from lazarus.domain.memory_tier import MEMORY_ROOT, memory_checkpoint_dir, node_memory_dir
from lazarus.domain.spec import CheckpointsSpec, JobSpec, NodeSpec, SpecError, parse_spec
from lazarus.rank import memory, reset
from tests.checkpoint_helpers import write_checkpoint

JOB = "memjob"
NODES = [NodeSpec(name="a"), NodeSpec(name="b")]


# --------------------------------------------------------------------------- helpers


def write_snapshot(root: Path, step: int, *, job_id: str | None = JOB, size: int = 4096) -> Path:
    """A snapshot committed by the rank helper's memory tier, as a node's local rank 0
    commits it (world of 2)."""
    env = {
        environment.MEMORY_CHECKPOINT_DIR: str(root),
        environment.MEMORY_KEEP: "100",
        environment.WORLD_SIZE: "2",
        environment.RANK: "0",
        environment.LOCAL_RANK: "0",
        environment.JOB_ID: job_id or "",
    }
    with mock.patch.dict(os.environ, env):
        reset._reset_state()
        (memory.write_dir(step) / "state.pt").write_bytes(bytes(step % 251 for _ in range(size)))
        path = memory.commit(step)
    reset._reset_state()
    return path


def tear(snapshot: Path) -> None:
    """Truncate the state file of a committed snapshot: torn, marker and all."""
    with open(snapshot / "state.pt", "r+b") as handle:
        handle.truncate(10)


class DirAgent(LocalAgent):
    """A node whose memory tier is a directory of its own (``where``), standing in
    for ``memory_dir`` on that node; None: the node does not answer."""

    def __init__(self, node: NodeSpec, where: Path | None) -> None:
        super().__init__(node)
        self.where = where

    def memory_snapshots(self, root: str) -> list[MemorySnapshot]:
        if self.where is None:
            raise NodeUnreachable(f"node {self.node.name}: connection refused")
        return [
            snapshot.model_copy(update={"path": f"{root}/{Path(snapshot.path).name}"})
            for snapshot in local_memory_snapshots(self.where)
        ]


@pytest.fixture
def node_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path | None]:
    """Each node's tmpfs, as a directory of its own; set a value to None to make that
    node unreachable."""
    dirs: dict[str, Path | None] = {n.name: tmp_path / f"shm-{n.name}" for n in NODES}

    @contextmanager
    def fake_agents(access: NodeAccess) -> Iterator[list[NodeAgent]]:
        yield [DirAgent(node, dirs.get(node.name)) for node in access.nodes]

    monkeypatch.setattr(memory_tier, "agents", fake_agents)
    return dirs


def on_every_node(dirs: dict[str, Path | None], step: int, **kwargs: object) -> None:
    for where in dirs.values():
        assert where is not None
        write_snapshot(where, step, **kwargs)  # type: ignore[arg-type]


def request(tmp_path: Path, **overrides: object) -> FindVerifiedCheckpointRequest:
    values: dict[str, object] = {
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "checkpoints": CheckpointsSpec(verify_hashes=True),
        "job_id": JOB,
        "memory_dir": "/dev/shm/lazarus/memjob/run-1",
        "access": NodeAccess(nodes=NODES),
    }
    values.update(overrides)
    return FindVerifiedCheckpointRequest.model_validate(values)


def disk_checkpoint(tmp_path: Path, step: int) -> Path:
    with mock.patch.dict(os.environ, {environment.JOB_ID: JOB}):
        return write_checkpoint(tmp_path / "ckpt", step)


# --------------------------------------------------------------------------- the choice


def test_the_newest_step_committed_on_every_node_is_chosen(
    tmp_path: Path, node_dirs: dict[str, Path | None]
) -> None:
    on_every_node(node_dirs, 24)
    on_every_node(node_dirs, 25)
    a = node_dirs["a"]
    assert a is not None
    write_snapshot(a, 26)  # node b has not committed step 26 (yet): no resume point, no fault
    disk_checkpoint(tmp_path, 20)

    search = find_module.search_verified(request(tmp_path))

    assert search.location == "memory"
    assert search.chosen is not None
    assert (search.chosen.step, search.chosen.path) == (
        25,
        "/dev/shm/lazarus/memjob/run-1/step-00000025",
    )
    assert search.skipped == []


def test_a_torn_snapshot_on_one_node_is_skipped_for_the_previous_step(
    tmp_path: Path, node_dirs: dict[str, Path | None]
) -> None:
    on_every_node(node_dirs, 24)
    on_every_node(node_dirs, 25)
    b = node_dirs["b"]
    assert b is not None
    tear(b / checkpoint_layout.step_dir_name(25))

    search = find_module.search_verified(request(tmp_path))

    assert (search.location, search.chosen and search.chosen.step) == ("memory", 24)
    [skipped] = search.skipped
    assert (skipped.step, skipped.location) == (25, "memory")
    assert skipped.problems == ["node b: torn: state.pt: 10 bytes, the manifest says 4096"]


def test_another_jobs_snapshot_is_skipped(
    tmp_path: Path, node_dirs: dict[str, Path | None]
) -> None:
    on_every_node(node_dirs, 24)
    on_every_node(node_dirs, 25, job_id="someone-else")

    search = find_module.search_verified(request(tmp_path))

    assert search.chosen is not None and search.chosen.step == 24
    assert [(s.step, s.problems) for s in search.skipped] == [
        (25, ["node a: written by job someone-else", "node b: written by job someone-else"])
    ]


def test_a_node_without_snapshots_leaves_the_resume_to_disk(
    tmp_path: Path, node_dirs: dict[str, Path | None]
) -> None:
    """After a node loss the replacement node's tmpfs is empty: disk serves."""
    a = node_dirs["a"]
    assert a is not None
    write_snapshot(a, 24)
    write_snapshot(a, 25)
    disk = disk_checkpoint(tmp_path, 20)

    search = find_module.search_verified(request(tmp_path))

    assert search.location == "local"
    assert search.chosen is not None and (search.chosen.step, search.chosen.path) == (20, str(disk))
    assert search.skipped == [] and search.memory_unavailable is None


def test_a_node_that_does_not_answer_leaves_the_resume_to_disk(
    tmp_path: Path, node_dirs: dict[str, Path | None]
) -> None:
    on_every_node(node_dirs, 25)
    node_dirs["b"] = None
    disk_checkpoint(tmp_path, 20)

    search = find_module.search_verified(request(tmp_path))

    assert search.location == "local" and search.chosen is not None
    assert search.chosen.step == 20
    assert search.memory_unavailable is not None and "node b" in search.memory_unavailable


def test_a_newer_disk_checkpoint_wins_and_older_snapshots_are_not_listed(
    tmp_path: Path, node_dirs: dict[str, Path | None]
) -> None:
    on_every_node(node_dirs, 19)
    disk_checkpoint(tmp_path, 20)

    search = find_module.search_verified(request(tmp_path))

    assert search.location == "local" and search.chosen is not None
    assert search.chosen.step == 20


def test_disk_checkpoints_older_than_the_memory_choice_are_not_verified(
    tmp_path: Path, node_dirs: dict[str, Path | None]
) -> None:
    """The memory choice bounds the disk search: a corrupt older disk checkpoint is
    neither hashed, nor reported, nor moved aside."""
    on_every_node(node_dirs, 25)
    broken = disk_checkpoint(tmp_path, 20)
    (broken / "state.pt").write_bytes(b"garbage")

    search = find_module.search_verified(request(tmp_path))

    assert search.location == "memory" and search.skipped == []
    assert broken.is_dir()


@pytest.mark.parametrize(
    ("exclude", "below", "expected"),
    [
        ([30], None, 39),  # a retirement long ago: the snapshots after it serve
        ([40], None, None),  # 38 and 39 may be the abandoned timeline below retired 40
        ([39], None, None),
        ([], 40, None),  # a rollback's search goes back in time: never the memory tier
    ],
)
def test_retired_steps_bound_the_memory_tier(
    tmp_path: Path,
    node_dirs: dict[str, Path | None],
    exclude: list[int],
    below: int | None,
    expected: int | None,
) -> None:
    on_every_node(node_dirs, 38)
    on_every_node(node_dirs, 39)

    search = find_module.search_verified(request(tmp_path, exclude_steps=exclude, below_step=below))

    assert (search.chosen.step if search.chosen else None) == expected
    assert search.location == ("memory" if expected is not None else None)


def test_a_snapshot_of_another_world_size_is_skipped(
    tmp_path: Path, node_dirs: dict[str, Path | None]
) -> None:
    on_every_node(node_dirs, 25)

    search = find_module.search_verified(request(tmp_path, expected_world_size=4))

    assert search.chosen is None
    assert "written by a world of 2 ranks, expected 4" in search.skipped[0].problems[0]


def test_without_memory_nodes_this_machine_is_asked(tmp_path: Path) -> None:
    """The default: a local relaunch needs no node list (the real local agent)."""
    root = tmp_path / "shm"
    write_snapshot(root / "node-local", 7)  # this machine's node, as the launcher names it

    search = find_module.search_verified(
        request(tmp_path, memory_dir=str(root), access=NodeAccess())
    )

    assert search.location == "memory" and search.chosen is not None
    assert search.chosen.path == str(root / "step-00000007")


def test_without_a_memory_dir_the_tier_is_not_searched(tmp_path: Path) -> None:
    disk_checkpoint(tmp_path, 20)
    search = find_module.search_verified(request(tmp_path, memory_dir=None))
    assert (search.location, search.chosen and search.chosen.step) == ("local", 20)


# --------------------------------------------------------------------------- node listings


@pytest.mark.slow  # runs the node shim
def test_the_shim_reports_the_same_facts_as_the_local_agent(tmp_path: Path) -> None:
    root = tmp_path / "shm"
    write_snapshot(root, 3)
    torn = write_snapshot(root, 4)
    tear(torn)
    (root / "step-00000005").mkdir()  # uncommitted: not listed
    (torn / "odd name *.bin").write_bytes(b"xy")  # not in the manifest: reported, ignored

    local = LocalAgent(NodeSpec(name="n")).memory_snapshots(str(root))
    shim = LocalShimAgent(NodeSpec(name="n")).memory_snapshots(str(root))

    assert [s.step for s in shim] == [3, 4]
    assert shim == local
    judged = [memory_tier.snapshot_problem(s, request(tmp_path)) for s in shim]
    assert judged == [None, "torn: state.pt: 10 bytes, the manifest says 4096"]
    assert LocalShimAgent(NodeSpec(name="n")).memory_snapshots(str(tmp_path / "none")) == []


@pytest.mark.slow  # runs the node shim
def test_the_shim_lists_several_roots_in_one_call(tmp_path: Path) -> None:
    own, held, empty = tmp_path / "own", tmp_path / "own" / "replica-1", tmp_path / "none"
    write_snapshot(own, 3)
    write_snapshot(held, 2)
    write_snapshot(held, 5)
    agent = LocalShimAgent(NodeSpec(name="n"))

    with mock.patch.object(agent, "_run", wraps=agent._run) as calls:
        listed = agent.memory_snapshots_in([str(own), str(held), str(empty)])

    assert calls.call_count == 1
    assert [[s.step for s in snapshots] for snapshots in listed] == [[3], [2, 5], []]
    assert listed[1] == LocalAgent(NodeSpec(name="n")).memory_snapshots(str(held))


# --------------------------------------------------------------------------- launcher


def spec_with(tmp_path: Path, **checkpoints: object) -> JobSpec:
    data = {
        "name": JOB,
        "command": ["python", "train.py"],
        "nproc_per_node": 2,
        "checkpoints": checkpoints,
    }
    return parse_spec(data, "<test>").resolved(tmp_path)


def test_the_launcher_sets_the_tier_variables_from_the_spec(tmp_path: Path) -> None:
    spec = spec_with(tmp_path, memory_every_steps=1, memory_keep=3, every_steps=20)
    gen = GenerationDir.of(job_root(spec.run_dir, spec.job_id) / "run-abc", 2)

    env = rank_environment(spec, spec.nodes, 0, gen, 1, 29500, None, worker_env={})

    node = spec.nodes[0].name
    assert env[environment.MEMORY_CHECKPOINT_DIR] == f"{MEMORY_ROOT}/{JOB}/run-abc/node-{node}"
    assert env[environment.MEMORY_CHECKPOINT_DIR] == node_memory_dir(
        memory_checkpoint_dir(JOB, str(gen.path.parent)), node
    )
    assert env[environment.MEMORY_EVERY_STEPS] == "1"
    assert env[environment.MEMORY_KEEP] == "3"
    assert env[environment.CHECKPOINT_EVERY_STEPS] == "20"
    assert initial_control_document(spec) == {
        "checkpoint_request": 0,
        "checkpoint_every_steps": 20,
        "memory_every_steps": 1,
    }


def test_without_the_tier_no_variable_leaks_from_the_worker(tmp_path: Path) -> None:
    spec = spec_with(tmp_path)
    gen = GenerationDir.of(job_root(spec.run_dir, spec.job_id), 1)  # the legacy layout
    worker = {
        environment.MEMORY_CHECKPOINT_DIR: "/dev/shm/elsewhere",
        environment.CHECKPOINT_EVERY_STEPS: "5",
    }

    env = rank_environment(spec, spec.nodes, 0, gen, 0, 29500, None, worker_env=worker)

    for name in (
        environment.MEMORY_CHECKPOINT_DIR,
        environment.MEMORY_EVERY_STEPS,
        environment.MEMORY_KEEP,
        environment.CHECKPOINT_EVERY_STEPS,
    ):
        assert name not in env
    assert initial_control_document(spec) == {"checkpoint_request": 0}
    legacy = spec_with(tmp_path, memory_every_steps=2)
    env = rank_environment(legacy, legacy.nodes, 0, gen, 0, 29500, None, worker_env={})
    node = legacy.nodes[0].name
    assert env[environment.MEMORY_CHECKPOINT_DIR] == f"{MEMORY_ROOT}/{JOB}/_/node-{node}"


def test_a_just_in_time_request_keeps_the_intervals(tmp_path: Path) -> None:
    gen = GenerationDir(tmp_path / "gen-00001")
    request_checkpoint(
        CheckpointNowRequest(
            run_dir=str(gen.path),
            request_id=4,
            checkpoint_dir=str(tmp_path / "ckpt"),
            checkpoint_every_steps=20,
            memory_every_steps=1,
        )
    )
    assert read_json(gen.control_file) == {
        "checkpoint_request": 4,
        "then": "hold",
        "checkpoint_every_steps": 20,
        "memory_every_steps": 1,
    }


def test_the_memory_dir_is_one_path_component_per_part() -> None:
    assert memory_checkpoint_dir("j", "/runs/j/run-1") == f"{MEMORY_ROOT}/j/run-1"
    assert memory_checkpoint_dir("j", None) == f"{MEMORY_ROOT}/j/_"
    with pytest.raises(ValueError, match="run key"):
        memory_checkpoint_dir("j", "/runs/j/..")


# --------------------------------------------------------------------------- spec


@pytest.mark.parametrize(
    ("checkpoints", "field"),
    [
        ({"memory_every_steps": 0}, "checkpoints.memory_every_steps"),
        ({"memory_keep": 0}, "checkpoints.memory_keep"),
        ({"every_steps": -1}, "checkpoints.every_steps"),
        ({"memory_every_steps": "often"}, "checkpoints.memory_every_steps"),
    ],
)
def test_bad_intervals_are_refused_naming_the_field(
    tmp_path: Path, checkpoints: dict[str, object], field: str
) -> None:
    with pytest.raises(SpecError) as caught:
        spec_with(tmp_path, **checkpoints)
    assert field in str(caught.value)


def test_the_tier_is_off_by_default() -> None:
    defaults = CheckpointsSpec()
    assert (defaults.memory_every_steps, defaults.every_steps, defaults.memory_keep) == (
        None,
        None,
        2,
    )
    assert json.loads(defaults.model_dump_json())["memory_keep"] == 2
