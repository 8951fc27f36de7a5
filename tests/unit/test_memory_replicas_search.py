"""Memory-tier replicas, controller side: the search counts a live buddy's replica for
a node that lacks the step (a spare), refuses a torn, foreign or other-timeline
replica, and copies the chosen replica onto the spare before the launch.

The choice is pure (``choose`` on reported facts); the restore runs through the real
local agent and the real shim (``LocalShimAgent``: the ssh agent's code path).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from unittest import mock

import pytest

import lazarus.rank as lz
from activities.checkpoints import find as find_module
from activities.checkpoints import memory_tier
from activities.checkpoints.memory_tier import HeldReplicas, ReplicaRestore, choose
from activities.launcher import rank_environment
from activities.nodes.agent import MemorySnapshot, NodeAgent, RestoreEnd
from activities.nodes.local.agent import LocalAgent, local_memory_snapshots
from activities.nodes.rundir import GenerationDir, job_root
from activities.nodes.shim_agent import LocalShimAgent
from lazarus.domain import checkpoint_layout, environment
from lazarus.domain.contracts import FindVerifiedCheckpointRequest, NodeAccess
from lazarus.domain.memory_tier import (
    node_memory_dir,
    replica_dir,
    replica_environment,
    restore_key,
)
from lazarus.domain.ports import free_port
from lazarus.domain.spec import CheckpointsSpec, NodeSpec, SpecError, parse_spec
from lazarus.domain.timeline import with_cut
from lazarus.rank import memory, replica, reset, transfer

JOB = "memjob"
SECRET = "c3" * 32
ROOT = "/dev/shm/lazarus/memjob/run-1"
NAMES = ["a", "spare", "c"]  # the spare took the lost node's slot 1; c (slot 2) buddies it


def facts(step: int, *, generation: int = 1, job: str = JOB, torn: bool = False) -> MemorySnapshot:
    manifest = {
        "step": step,
        "job_id": job,
        "generation": generation,
        "world_size": 3,
        "files": {"state.pt": {"size": 100, "sha256": None}},
    }
    return MemorySnapshot(
        step=step,
        path=f"{ROOT}/step-{step:08d}",
        manifest=manifest,
        sizes={"state.pt": 10 if torn else 100, "manifest.json": 200},
    )


def search_request(**overrides: object) -> FindVerifiedCheckpointRequest:
    values: dict[str, object] = {
        "checkpoint_dir": "/nonexistent/ckpt",
        "checkpoints": CheckpointsSpec(memory_every_steps=1, memory_replicas=True),
        "job_id": JOB,
        "memory_dir": ROOT,
        "expected_world_size": 3,
        "access": NodeAccess(nodes=[NodeSpec(name=n) for n in NAMES]),
    }
    values.update(overrides)
    return FindVerifiedCheckpointRequest.model_validate(values)


def own(*steps: int, **kwargs: object) -> dict[int, MemorySnapshot]:
    return {step: facts(step, **kwargs) for step in steps}  # type: ignore[arg-type]


# ------------------------------------------------------------------ the choice (pure)


def test_a_live_buddys_replica_makes_the_step_available_to_the_spare() -> None:
    per_node = {"a": own(24, 25), "spare": {}, "c": own(24, 25)}
    held = {"spare": HeldReplicas("c", own(24, 25))}

    choice = choose(search_request(), ROOT, NAMES, per_node, held)

    assert choice.chosen is not None and choice.chosen.step == 25
    assert choice.chosen.path == f"{ROOT}/step-00000025"
    assert choice.restores == [
        ReplicaRestore(
            node="spare",
            holder="c",
            source=f"{replica_dir(ROOT, 1)}/step-00000025",
            target=f"{ROOT}/step-00000025",
            step=25,
            bytes=300,  # the replica's files, as listed: its copy's deadline scales with it
        )
    ]
    assert choice.skipped == []


def test_without_a_replica_the_spare_leaves_the_tier_empty() -> None:
    per_node = {"a": own(24, 25), "spare": {}, "c": own(24, 25)}
    assert choose(search_request(), ROOT, NAMES, per_node, {}).chosen is None


def test_a_torn_replica_is_refused_and_the_previous_step_serves() -> None:
    per_node = {"a": own(24, 25), "spare": {}, "c": own(24, 25)}
    held = {"spare": HeldReplicas("c", {24: facts(24), 25: facts(25, torn=True)})}

    choice = choose(search_request(), ROOT, NAMES, per_node, held)

    assert choice.chosen is not None and choice.chosen.step == 24
    (skipped,) = choice.skipped
    assert skipped.step == 25 and skipped.location == "memory"
    assert skipped.problems == [
        "node c (replica of node spare): torn: state.pt: 10 bytes, the manifest says 100"
    ]


def test_a_replica_of_another_generation_never_mixes_two_timelines() -> None:
    per_node = {"a": own(25, generation=2), "spare": {}, "c": own(25, generation=2)}
    held = {"spare": HeldReplicas("c", own(25, generation=1))}

    choice = choose(search_request(), ROOT, NAMES, per_node, held)

    assert choice.chosen is None
    assert "two timelines" in choice.skipped[0].problems[-1]


def test_a_replica_on_a_timeline_the_job_left_is_refused() -> None:
    cuts = with_cut(with_cut([], 1, 0), 2, 20)  # generation 2 resumed from 20
    per_node = {"a": own(25, generation=1), "spare": {}, "c": own(25, generation=1)}
    held = {"spare": HeldReplicas("c", own(25, generation=1))}

    choice = choose(search_request(timeline=cuts), ROOT, NAMES, per_node, held)

    assert choice.chosen is None
    assert any(
        "(replica of node spare): written by generation 1, on a timeline the job left" in p
        for p in choice.skipped[0].problems
    )


def test_another_jobs_replica_is_refused() -> None:
    per_node = {"a": own(25), "spare": {}, "c": own(25)}
    held = {"spare": HeldReplicas("c", own(25, job="other"))}

    choice = choose(search_request(), ROOT, NAMES, per_node, held)

    assert choice.chosen is None
    assert choice.skipped[0].problems == ["node c (replica of node spare): written by job other"]


def test_a_nodes_own_copy_comes_before_a_replica() -> None:
    per_node = {"a": own(25), "spare": own(25), "c": own(25)}
    held = {"spare": HeldReplicas("c", own(25))}
    choice = choose(search_request(), ROOT, NAMES, per_node, held)
    assert choice.chosen is not None and choice.restores == []


# ------------------------------------------------------------- the launcher and spec


def test_the_ring_gives_each_node_its_buddy_and_its_predecessor() -> None:
    hosts = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    env = [replica_environment(SECRET, 4, hosts, slot) for slot in range(3)]
    for slot in range(3):
        buddy = (slot + 1) % 3
        assert (
            env[slot][environment.MEMORY_REPLICA_TO]
            == env[buddy][environment.MEMORY_REPLICA_LISTEN]
        )
        assert env[buddy][environment.MEMORY_REPLICA_FROM] == hosts[slot]
        assert env[slot][environment.MEMORY_REPLICA_LISTEN].startswith(f"{hosts[slot]}:")
    assert replica_environment(SECRET, 4, hosts[:1], 0) == {}  # one node: nothing to protect
    assert env != [replica_environment(SECRET, 5, hosts, slot) for slot in range(3)]  # per gen
    other_run = [replica_environment("ab" * 32, 4, hosts, slot) for slot in range(3)]
    listen = environment.MEMORY_REPLICA_LISTEN
    assert [e[listen] for e in env] != [e[listen] for e in other_run]  # ports need the key


def test_replicas_need_the_memory_tier_and_are_off_by_default() -> None:
    assert CheckpointsSpec().memory_replicas is False
    data = {"name": "j", "command": ["python", "x.py"], "checkpoints": {"memory_replicas": True}}
    with pytest.raises(SpecError, match="memory_replicas: true needs the memory tier"):
        parse_spec(data, "<test>")


def test_the_launcher_gives_each_rank_its_nodes_replica_addresses(tmp_path: Path) -> None:
    nodes = [{"name": "n1", "host": "10.0.0.1"}, {"name": "n2", "host": "10.0.0.2"}]
    data = {
        "name": JOB,
        "command": ["python", "train.py"],
        "nodes": nodes,
        "checkpoints": {"memory_every_steps": 1, "memory_replicas": True},
    }
    spec = parse_spec(data, "<test>").resolved(tmp_path)
    gen = GenerationDir.of(job_root(spec.run_dir, spec.job_id) / "run-abc", 3)
    env = rank_environment(spec, spec.nodes, 1, gen, 1, 29500, None, worker_env={})
    assert env[environment.MEMORY_REPLICA_FROM] == "10.0.0.1"
    assert env[environment.MEMORY_REPLICA_TO].startswith("10.0.0.1:")
    assert env[environment.MEMORY_REPLICA_LISTEN].startswith("10.0.0.2:")
    off = parse_spec({**data, "checkpoints": {"memory_every_steps": 1}}, "<test>")
    leaked = {environment.MEMORY_REPLICA_TO: "10.9.9.9:1"}
    env = rank_environment(off.resolved(tmp_path), off.nodes, 1, gen, 1, 1, None, leaked)
    assert environment.MEMORY_REPLICA_TO not in env


# ------------------------------------------------------------------- the restore


def write_snapshot(root: Path, step: int) -> Path:
    env = {
        environment.MEMORY_CHECKPOINT_DIR: str(root),
        environment.MEMORY_KEEP: "100",
        environment.WORLD_SIZE: "3",
        environment.RANK: "0",
        environment.LOCAL_RANK: "0",
        environment.GENERATION: "1",
        environment.JOB_ID: JOB,
    }
    with mock.patch.dict(os.environ, env):
        reset._reset_state()
        (memory.write_dir(step) / "state.pt").write_bytes(bytes(range(256)) * 40)
        path = memory.commit(step)
    reset._reset_state()
    return path


def ends(source: Path, target: Path, port: int) -> tuple[RestoreEnd, RestoreEnd]:
    key = restore_key(SECRET, 25, 1)
    common = {
        "step": 25,
        "job_id": JOB,
        "timeout_s": 60.0,
        "key_hex": key.hex(),
        "address": f"127.0.0.1:{port}",
        "search_path": os.environ["PATH"],
        "python_path": str(Path(lz.__file__).parents[2]),
    }
    return (
        RestoreEnd(verb="receive", path=str(target), **common),  # type: ignore[arg-type]
        RestoreEnd(verb="send", path=str(source), **common),  # type: ignore[arg-type]
    )


@pytest.mark.slow  # two node processes (the shim: in a shell of their own)
@pytest.mark.parametrize("kind", ["local", "shim"])
def test_an_agent_copies_a_snapshot_node_to_node_whole_and_private(
    tmp_path: Path, kind: str
) -> None:
    source = write_snapshot(tmp_path / "holder" / "replicas" / "slot-1", 25)
    target = tmp_path / "spare" / "run" / "step-00000025"
    agent: NodeAgent = (
        LocalAgent(NodeSpec(name="n")) if kind == "local" else LocalShimAgent(NodeSpec(name="n"))
    )
    receive, send = ends(source, target, free_port())
    with ThreadPoolExecutor(2) as pool:
        received = pool.submit(agent.restore_end, receive)
        sent = pool.submit(agent.restore_end, send)
        assert received.result().get("received") == 25, received.result()
        assert sent.result().get("sent", 0) > 10_000, sent.result()

    (copied,) = local_memory_snapshots(target.parent)
    assert copied.step == 25
    assert checkpoint_layout.size_problem(target) is None
    assert (target / "state.pt").read_bytes() == (source / "state.pt").read_bytes()
    for file in target.iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # nothing left aside
    missing = tmp_path / "holder" / "replicas" / "slot-1" / "step-00000009"
    _, send_missing = ends(missing, target, free_port())
    assert "not a committed replica" in agent.restore_end(send_missing)["error"]


@pytest.mark.slow
def test_a_sender_with_the_wrong_key_restores_nothing(tmp_path: Path) -> None:
    source = write_snapshot(tmp_path / "holder" / "replicas" / "slot-1", 25)
    target = tmp_path / "spare" / "run" / "step-00000025"
    agent = LocalAgent(NodeSpec(name="n"))
    receive, send = ends(source, target, free_port())
    forged = send.model_copy(update={"key_hex": "00" * 32})
    with ThreadPoolExecutor(2) as pool:
        received = pool.submit(agent.restore_end, receive.model_copy(update={"timeout_s": 5.0}))
        assert "prove" in pool.submit(agent.restore_end, forged).result()["error"]
        assert "no sender proved the key" in received.result()["error"]
    assert not target.exists()


class TierAgent(LocalAgent):
    """A node whose memory tier (``ROOT`` and below) is a directory of its own."""

    def __init__(self, node: NodeSpec, where: Path) -> None:
        super().__init__(node)
        self.where = where

    def _here(self, path: str) -> Path:
        """Its own directory (``node-<name>`` under the run's) is ``where``."""
        relative = PurePosixPath(path).relative_to(node_memory_dir(ROOT, self.node.name))
        return self.where / relative

    def memory_snapshots(self, root: str) -> list[MemorySnapshot]:
        return [
            s.model_copy(update={"path": f"{root}/{Path(s.path).name}"})
            for s in local_memory_snapshots(self._here(root))
        ]

    def restore_end(self, end: RestoreEnd) -> dict[str, object]:
        return super().restore_end(end.model_copy(update={"path": str(self._here(end.path))}))


@pytest.fixture
def tiers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
    dirs = {name: tmp_path / f"shm-{name}" for name in NAMES}

    @contextmanager
    def fake_agents(access: NodeAccess) -> Iterator[list[NodeAgent]]:
        yield [TierAgent(node, dirs[node.name]) for node in access.nodes]

    monkeypatch.setattr(memory_tier, "agents", fake_agents)
    yield dirs


@pytest.mark.slow  # the two ends of the copy are processes of their own
def test_the_search_restores_the_replica_onto_the_spare_before_the_launch(
    tiers: dict[str, Path],
) -> None:
    for step in (24, 25):
        write_snapshot(tiers["a"], step)
        write_snapshot(tiers["c"], step)
        write_snapshot(tiers["c"] / "replicas" / "slot-1", step)  # c buddies slot 1

    preview = find_module.search_verified(search_request(), move_aside_corrupt=False)
    assert preview.chosen is not None and preview.chosen.step == 25
    assert not (tiers["spare"] / "step-00000025").exists()  # a preview copies nothing

    search = find_module.search_verified(search_request())

    assert search.location == "memory"
    assert search.chosen is not None and search.chosen.step == 25
    [restored_line] = search.memory_restored
    assert restored_line.startswith("step 25 of node spare restored from the replica on c (")
    restored = tiers["spare"] / "step-00000025"
    assert checkpoint_layout.is_committed(restored)
    assert json.loads((restored / checkpoint_layout.MANIFEST).read_text())["generation"] == 1
    assert (restored / "state.pt").read_bytes() == (
        tiers["c"] / "replicas" / "slot-1" / "step-00000025" / "state.pt"
    ).read_bytes()


def test_a_restore_that_fails_leaves_the_resume_to_disk(
    tiers: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in (24, 25):
        write_snapshot(tiers["a"], step)
        write_snapshot(tiers["c"], step)
        write_snapshot(tiers["c"] / "replicas" / "slot-1", step)

    def broken(self: TierAgent, end: RestoreEnd) -> dict[str, object]:
        if end.verb == "receive":
            return {"error": "OSError: No space left on device"}
        return {"error": "no receiver proved the key"}

    monkeypatch.setattr(TierAgent, "restore_end", broken)
    search = find_module.search_verified(search_request())

    assert search.chosen is None
    assert search.memory_unavailable is not None
    assert "No space left on device" in search.memory_unavailable


def test_a_buddy_that_cannot_list_its_replicas_leaves_the_resume_to_disk(
    tiers: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in (24, 25):
        write_snapshot(tiers["a"], step)
        write_snapshot(tiers["c"], step)
        write_snapshot(tiers["c"] / "replicas" / "slot-1", step)
    listing = TierAgent.memory_snapshots

    def no_replicas(self: TierAgent, root: str) -> list[MemorySnapshot]:
        if "/replicas/" in root:
            raise OSError("connection reset")
        return listing(self, root)

    monkeypatch.setattr(TierAgent, "memory_snapshots", no_replicas)
    search = find_module.search_verified(search_request())

    assert search.chosen is None and search.memory_unavailable is None
    assert not (tiers["spare"] / "step-00000025").exists()


@pytest.mark.slow
def test_a_replica_altered_after_it_arrived_is_refused_by_the_spare(tmp_path: Path) -> None:
    """The holder sends the digests its marker recorded when the replica arrived
    (``sendfile``, unread); the spare hashes what it receives: a byte changed on the
    holder since is caught before anything is committed."""
    source = write_snapshot(tmp_path / "holder" / "replicas" / "slot-1", 25)
    marker = source / checkpoint_layout.COMMIT_MARKER
    names = replica.snapshot_files(source)
    recorded = {name: transfer.digest_of(source / name) for name in names}
    marker.write_text(json.dumps({"step": 25, replica.DIGESTS: recorded}))
    assert replica.known_digests(source, names) == [recorded[n] for n in names]
    with open(source / "state.pt", "r+b") as handle:
        handle.write(b"\xff")
    target = tmp_path / "spare" / "run" / "step-00000025"
    agent = LocalAgent(NodeSpec(name="n"))
    receive, send = ends(source, target, free_port())
    with ThreadPoolExecutor(2) as pool:
        received = pool.submit(agent.restore_end, receive)
        pool.submit(agent.restore_end, send).result()
        assert "does not match" in received.result()["error"]
    assert not target.exists()
