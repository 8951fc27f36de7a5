"""Memory-tier replicas, rank side: the push to a buddy and its receiver (issue 28, item 3).

Real sockets on 127.0.0.1 and a receiver thread, so ``slow``. The private root is
moved under ``tmp_path``, as in ``test_memory_tier_safety``; node "A" pushes its
committed snapshot, node "B" (another memory directory) receives it under
``replicas/slot-0``. Covered: a whole copy (files, manifest, 0600, bounded to
``keep``), a copy torn mid-way (nothing committed, nothing left), and refusals (a
stale generation, another job, a peer that is not the node replicated, a file name
that would leave the directory).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

import lazarus.rank as lz
from lazarus.domain import chaos_points, checkpoint_layout, environment, memory_tier
from lazarus.rank import memory, replica

JOB = "job"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


@pytest.fixture
def shm(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "shm"
    root.mkdir()
    root.chmod(0o1777)
    with mock.patch.object(memory_tier, "PRIVATE_ROOT_PREFIX", f"{root}/lazarus-"):
        yield root


def node_env(
    tier: Path, generation: int = 1, extra: dict[str, str] | None = None
) -> dict[str, str]:
    return {
        environment.JOB_ID: JOB,
        environment.GENERATION: str(generation),
        environment.WORLD_SIZE: "2",
        environment.RANK: "0",
        environment.LOCAL_RANK: "0",
        environment.MEMORY_KEEP: "2",
        environment.MEMORY_CHECKPOINT_DIR: str(tier),
        **(extra or {}),
    }


def logical(name: str) -> Path:
    return Path(memory_tier.MEMORY_ROOT) / JOB / name


def snapshot(env: dict[str, str], step: int, payload: bytes) -> Path:
    with mock.patch.dict(os.environ, env):
        lz._reset_state()
        (memory.write_dir(step) / "state.pt").write_bytes(payload)
        final = memory.commit(step)
    lz._reset_state()
    return final


@pytest.fixture
def receiver(shm: Path) -> Iterator[replica.Receiver]:
    config = replica._Config(
        listen="127.0.0.1:0",
        allowed_from="127.0.0.1",
        root=Path(memory_tier.on_node(str(logical("b")), os.getuid())),
        job_id=JOB,
        generation=1,
        keep=2,
    )
    memory.secure(config.root)
    got = replica.Receiver(config)
    try:
        yield got
    finally:
        got.close()


def to(receiver: replica.Receiver) -> str:
    return f"127.0.0.1:{receiver.port}"


def replicas_of(receiver: replica.Receiver, slot: int = 0) -> Path:
    return Path(memory_tier.replica_dir(str(receiver.config.root), slot))


def test_a_committed_snapshot_arrives_whole_private_and_bounded(
    receiver: replica.Receiver,
) -> None:
    env = node_env(logical("a"))
    for step in (1, 2, 3):
        final = snapshot(env, step, bytes([step]) * (3 << 20))  # several chunks
        sent = replica.push(final, to(receiver), slot=0, job_id=JOB, generation=1)
        assert sent >= 3 << 20
    held = replicas_of(receiver)
    assert [s for s, _ in checkpoint_layout.committed_steps(held)] == [2, 3]  # keep 2
    copy = held / checkpoint_layout.step_dir_name(3)
    assert checkpoint_layout.size_problem(copy) is None
    assert (copy / "state.pt").read_bytes() == bytes([3]) * (3 << 20)
    original = json.loads((final / checkpoint_layout.MANIFEST).read_text())
    assert json.loads((copy / checkpoint_layout.MANIFEST).read_text()) == original
    for file in copy.iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    assert stat.S_IMODE(held.stat().st_mode) == 0o700
    assert receiver.committed == [(0, 1), (0, 2), (0, 3)] and receiver.refused == []


def test_a_copy_torn_mid_way_is_never_committed_and_leaves_nothing(
    receiver: replica.Receiver,
) -> None:
    final = snapshot(node_env(logical("a")), 4, b"x" * 1000)
    manifest_size = (final / checkpoint_layout.MANIFEST).stat().st_size
    header = {
        "v": 1,
        "job_id": JOB,
        "generation": 1,
        "slot": 0,
        "step": 4,
        "files": [["state.pt", 1000], [checkpoint_layout.MANIFEST, manifest_size]],
    }
    with socket.create_connection(("127.0.0.1", receiver.port)) as sock:
        sock.sendall(json.dumps(header).encode() + b"\n" + b"x" * 400)  # the pusher dies
    deadline = time.monotonic() + 30
    while not receiver.refused and time.monotonic() < deadline:
        time.sleep(0.05)
    assert receiver.refused and "torn" in receiver.refused[0], receiver.refused
    assert checkpoint_layout.committed_steps(replicas_of(receiver)) == []
    assert list(replicas_of(receiver).iterdir()) == []
    # The receiver still serves the next, whole push.
    replica.push(final, to(receiver), slot=0, job_id=JOB, generation=1)
    assert receiver.committed == [(0, 4)]


def test_a_copy_cut_short_before_its_commit_is_refused(
    receiver: replica.Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every byte arrived, then a file of the copy is cut short before the receiver
    checks it (the chaos matrix's ``replica_torn@replicated`` holds it there, at
    ``replica.before_commit``): the manifest's sizes refuse it, nothing is committed."""
    points = tmp_path / "points"
    points.mkdir()
    monkeypatch.setenv(chaos_points.CHAOS_DIR_ENV, str(points))
    final = snapshot(node_env(logical("a")), 5, b"y" * 4000)
    outcome: list[BaseException | int] = []

    def push() -> None:
        try:
            outcome.append(replica.push(final, to(receiver), slot=0, job_id=JOB, generation=1))
        except BaseException as exc:
            outcome.append(exc)

    pusher = threading.Thread(target=push)
    pusher.start()
    reached = chaos_points.reached_file(points, chaos_points.REPLICA_BEFORE_COMMIT)
    deadline = time.monotonic() + 30
    while not reached.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert reached.exists(), "the receiver never reached replica.before_commit"
    held = replicas_of(receiver) / checkpoint_layout.step_dir_name(5)
    os.truncate(held / "state.pt", 1000)
    chaos_points.go_file(points, chaos_points.REPLICA_BEFORE_COMMIT).touch()
    pusher.join(timeout=30)
    [answer] = outcome
    assert isinstance(answer, replica.ReplicaRefused) and "torn" in str(answer), answer
    assert receiver.committed == [] and "torn" in receiver.refused[0], receiver.refused
    assert not held.exists()


@pytest.mark.parametrize(
    ("job", "generation", "why"),
    [(JOB, 0, "generation 0"), ("other", 1, "job 'other'")],
    ids=["stale-generation", "other-job"],
)
def test_a_push_from_another_timeline_or_job_is_refused(
    receiver: replica.Receiver, job: str, generation: int, why: str
) -> None:
    final = snapshot(node_env(logical("a")), 5, b"y" * 10)
    with pytest.raises(replica.ReplicaRefused, match=why):
        replica.push(final, to(receiver), slot=0, job_id=job, generation=generation)
    assert checkpoint_layout.committed_steps(replicas_of(receiver)) == []


def test_a_file_name_that_leaves_the_directory_is_refused(
    receiver: replica.Receiver,
) -> None:
    header = {
        "v": 1,
        "job_id": JOB,
        "generation": 1,
        "slot": 0,
        "step": 6,
        "files": [["../escape", 3], [checkpoint_layout.MANIFEST, 2]],
    }
    with socket.create_connection(("127.0.0.1", receiver.port)) as sock:
        sock.sendall(json.dumps(header).encode() + b"\n")
        answer = replica._read_line(sock)
    assert "not one plain path component" in answer
    assert not (receiver.config.root / "replicas" / "escape").exists()


def test_only_the_node_replicated_may_push(shm: Path) -> None:
    config = replica._Config(
        listen="127.0.0.1:0",
        allowed_from="192.0.2.7",  # TEST-NET: never this machine
        root=Path(memory_tier.on_node(str(logical("c")), os.getuid())),
        job_id=JOB,
        generation=1,
        keep=2,
    )
    memory.secure(config.root)
    guarded = replica.Receiver(config)
    try:
        final = snapshot(node_env(logical("a")), 7, b"z")
        with pytest.raises(replica.ReplicaRefused, match=r"is not 192\.0\.2\.7"):
            replica.push(final, f"127.0.0.1:{guarded.port}", slot=0, job_id=JOB, generation=1)
    finally:
        guarded.close()


def test_the_launchers_variables_start_the_receiver_and_push_after_commit(shm: Path) -> None:
    """``ensure_receiver`` and ``push_committed`` as the torch side calls them, from
    the environment the launcher writes (two nodes on one address, two ports)."""
    hosts = ["127.0.0.1", "127.0.0.1"]
    env_b = node_env(logical("b"), extra=memory_tier.replica_environment(JOB, 1, hosts, 1))
    env_a = node_env(
        logical("a"),
        extra={environment.GROUP_RANK: "0", **memory_tier.replica_environment(JOB, 1, hosts, 0)},
    )
    assert env_a[environment.MEMORY_REPLICA_TO] == env_b[environment.MEMORY_REPLICA_LISTEN]
    try:
        with mock.patch.dict(os.environ, env_b):
            started = replica.ensure_receiver()
            assert started is not None
            assert replica.ensure_receiver() is started  # idempotent per generation
        final = snapshot(env_a, 8, b"w" * 100)
        with mock.patch.dict(os.environ, env_a):
            assert replica.push_committed(final)  # handed to the pusher thread
        assert replica.wait_for_pushes(30)
        held = memory_tier.replica_dir(memory_tier.on_node(str(logical("b")), os.getuid()), 0)
        assert [s for s, _ in checkpoint_layout.committed_steps(Path(held))] == [8]
    finally:
        replica.stop_receiver()
