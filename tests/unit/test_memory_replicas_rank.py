"""Memory-tier replicas, rank side: the push to a buddy and its receiver (issues 28, 36).

Real sockets on 127.0.0.1 and a receiver thread, so ``slow``. The private root is
moved under ``tmp_path``, as in ``test_memory_tier_safety``; node "A" pushes its
committed snapshot, node "B" (another memory directory) receives it under
``replicas/slot-0``. Covered: a whole copy (files, manifest, 0600, bounded to
``keep``), a copy torn mid-way (nothing committed, nothing left), refusals (a stale
generation's key, another job, a peer that is not the node replicated, a file name
that would leave the directory), and a receiver replaced at a rejoin while its
pusher is dead mid-push (the training thread is not held). The attacks of another
user are in ``tests/integration/test_replica_attacks.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pytest

from lazarus.domain import chaos_points, checkpoint_layout, environment, memory_tier
from lazarus.rank import memory, replica, reset, transfer
from tests.memory_root import private_roots_under

JOB = "job"
SECRET = "5e" * 32
KEY = memory_tier.generation_key(SECRET, 1)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


@pytest.fixture
def shm(tmp_path: Path) -> Iterator[Path]:
    with private_roots_under(tmp_path) as root:
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
        reset._reset_state()
        (memory.write_dir(step) / "state.pt").write_bytes(payload)
        final = memory.commit(step)
    reset._reset_state()
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
        key=KEY,
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


def push(final: Path, receiver: replica.Receiver, **overrides: object) -> int:
    fields: dict[str, object] = {"key": KEY, "slot": 0, "job_id": JOB, "generation": 1}
    fields.update(overrides)
    return replica.push(final, to(receiver), **fields)  # type: ignore[arg-type]


def wait_for(predicate: Callable[[], object], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)


class _DiesAfter:
    """A file handle whose node dies after ``count`` bytes: the pusher's socket closes."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.name = "state.pt"

    def readinto(self, view: memoryview) -> int:
        if self.count <= 0:
            raise OSError("the node died")
        got = min(self.count, len(view))
        view[:got] = b"x" * got
        self.count -= got
        return got


def offer(files: list[tuple[str, int]], step: int) -> transfer.Offer:
    return transfer.Offer({"job_id": JOB, "generation": 1, "slot": 0, "step": step}, files)


def send_offer(receiver: replica.Receiver, what: transfer.Offer, handles: list[object]) -> int:
    """The protocol's sending half with a hand-made offer and handles (a pusher that
    knows the key but misbehaves)."""
    with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as sock:
        return transfer._send_on(sock, KEY, what, handles, time.monotonic() + 30)


def test_a_committed_snapshot_arrives_whole_private_and_bounded(
    receiver: replica.Receiver,
) -> None:
    env = node_env(logical("a"))
    for step in (1, 2, 3):
        final = snapshot(env, step, bytes([step]) * (9 << 20))  # several chunks
        assert push(final, receiver) >= 9 << 20
    held = replicas_of(receiver)
    assert [s for s, _ in checkpoint_layout.committed_steps(held)] == [2, 3]  # keep 2
    copy = held / checkpoint_layout.step_dir_name(3)
    assert checkpoint_layout.size_problem(copy) is None
    assert (copy / "state.pt").read_bytes() == bytes([3]) * (9 << 20)
    original = json.loads((final / checkpoint_layout.MANIFEST).read_text())
    assert json.loads((copy / checkpoint_layout.MANIFEST).read_text()) == original
    for file in copy.iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    assert stat.S_IMODE(held.stat().st_mode) == 0o700
    assert receiver.committed == [(0, 1), (0, 2), (0, 3)] and receiver.refused == []
    on_disk = sorted(p.name for p in held.iterdir())  # no leftover of a copy in flight
    assert on_disk == [p.name for _, p in checkpoint_layout.committed_steps(held)]


def test_a_copy_torn_mid_way_is_never_committed_and_leaves_nothing(
    receiver: replica.Receiver,
) -> None:
    final = snapshot(node_env(logical("a")), 4, b"x" * 1000)
    manifest_size = (final / checkpoint_layout.MANIFEST).stat().st_size
    torn = offer([("state.pt", 1000), (checkpoint_layout.MANIFEST, manifest_size)], 4)
    with pytest.raises(OSError, match="the node died"):
        send_offer(receiver, torn, [_DiesAfter(400), None])
    wait_for(lambda: receiver.refused)
    assert receiver.refused and "torn" in receiver.refused[0], receiver.refused
    assert checkpoint_layout.committed_steps(replicas_of(receiver)) == []
    assert list(replicas_of(receiver).iterdir()) == []
    push(final, receiver)  # the receiver still serves the next, whole push
    assert receiver.committed == [(0, 4)]


def test_a_copy_cut_short_before_its_commit_is_refused(
    receiver: replica.Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every byte arrived and matched its hash, then a file of the copy is cut short
    before the receiver checks it (the chaos matrix's ``replica_torn@replicated``
    holds it there, at ``replica.before_commit``): the manifest's sizes refuse it,
    nothing is committed."""
    points = tmp_path / "points"
    points.mkdir()
    monkeypatch.setenv(chaos_points.CHAOS_DIR_ENV, str(points))
    final = snapshot(node_env(logical("a")), 5, b"y" * 4000)
    outcome: list[BaseException | int] = []

    def pushing() -> None:
        try:
            outcome.append(push(final, receiver))
        except BaseException as exc:
            outcome.append(exc)

    pusher = threading.Thread(target=pushing)
    pusher.start()
    reached = chaos_points.reached_file(points, chaos_points.REPLICA_BEFORE_COMMIT)
    wait_for(reached.exists)
    assert reached.exists(), "the receiver never reached replica.before_commit"
    [incoming] = replicas_of(receiver).glob(f"{replica.INCOMING_PREFIX}*")
    os.truncate(incoming / "state.pt", 1000)
    chaos_points.go_file(points, chaos_points.REPLICA_BEFORE_COMMIT).touch()
    pusher.join(timeout=30)
    [answer] = outcome
    assert isinstance(answer, replica.ReplicaRefused) and "torn" in str(answer), answer
    wait_for(lambda: receiver.refused)  # noted just after the answer is sent
    assert receiver.committed == [] and "torn" in receiver.refused[0], receiver.refused
    assert list(replicas_of(receiver).iterdir()) == []


def test_a_stale_generations_pusher_cannot_prove_the_key(receiver: replica.Receiver) -> None:
    final = snapshot(node_env(logical("a")), 5, b"y" * 10)
    stale = memory_tier.generation_key(SECRET, 0)
    with pytest.raises(replica.ReplicaRefused, match="proved the key"):
        push(final, receiver, key=stale, generation=0)
    assert checkpoint_layout.committed_steps(replicas_of(receiver)) == []
    wait_for(lambda: receiver.refused)
    assert "proving it holds the key" in receiver.refused[0]


def test_a_push_of_another_job_is_refused(receiver: replica.Receiver) -> None:
    final = snapshot(node_env(logical("a")), 5, b"y" * 10)
    with pytest.raises(replica.ReplicaRefused, match="another job"):
        push(final, receiver, job_id="other")
    assert checkpoint_layout.committed_steps(replicas_of(receiver)) == []


def test_a_file_name_that_leaves_the_directory_is_refused(receiver: replica.Receiver) -> None:
    escape = offer([("../escape", 3), (checkpoint_layout.MANIFEST, 2)], 6)
    with pytest.raises(transfer.TransferRefused, match="not one plain path component"):
        send_offer(receiver, escape, [None, None])
    assert not (receiver.config.root / "replicas" / "escape").exists()


def test_only_the_node_replicated_may_push(shm: Path) -> None:
    config = replica._Config(
        listen="127.0.0.1:0",
        allowed_from="192.0.2.7",  # TEST-NET: never this machine
        root=Path(memory_tier.on_node(str(logical("c")), os.getuid())),
        job_id=JOB,
        generation=1,
        keep=2,
        key=KEY,
    )
    memory.secure(config.root)
    guarded = replica.Receiver(config)
    try:
        final = snapshot(node_env(logical("a")), 7, b"z")
        with pytest.raises(replica.ReplicaRefused, match="proved the key"):
            replica.push(
                final, f"127.0.0.1:{guarded.port}", key=KEY, slot=0, job_id=JOB, generation=1
            )
        assert "not the node replicated" in guarded.refused[0]
    finally:
        guarded.close()


def test_a_push_never_prunes_a_newer_replica_and_the_ring_moves_on(
    receiver: replica.Receiver,
) -> None:
    env = node_env(logical("a"))
    for step in (10, 11):
        push(snapshot(env, step, bytes([step]) * 100), receiver)
    late = snapshot(node_env(logical("a-late")), 3, b"old")
    push(late, receiver)  # an older step, pushed late: 10 and 11 stay
    held = [s for s, _ in checkpoint_layout.committed_steps(replicas_of(receiver))]
    assert held == [10, 11] or held == [3, 10, 11], held
    assert {10, 11} <= set(held)


def test_replacing_the_receiver_never_waits_on_a_dead_pusher(shm: Path) -> None:
    """A rejoin replaces the receiver (new generation, new key) on the training
    thread while the old one is stuck in a copy from a node that died mid-push and
    sent no FIN: the replacement returns within a second, and the new one serves."""
    hosts = ["127.0.0.1", "127.0.0.1"]
    env_b = node_env(logical("b"), extra=memory_tier.replica_environment(SECRET, 1, hosts, 1))
    try:
        with mock.patch.dict(os.environ, env_b):
            old = replica.ensure_receiver()
        assert old is not None
        final = snapshot(node_env(logical("a")), 12, b"q" * 1000)
        manifest_size = (final / checkpoint_layout.MANIFEST).stat().st_size
        stalled = threading.Event()

        class _Silent(_DiesAfter):
            def readinto(self, view: memoryview) -> int:
                if self.count <= 0:
                    stalled.set()
                    time.sleep(60)  # the node is gone: no byte, no FIN
                return super().readinto(view)

        what = offer([("state.pt", 1 << 30), (checkpoint_layout.MANIFEST, manifest_size)], 12)

        def dead_pusher() -> None:
            deadline = time.monotonic() + 60
            with (
                contextlib.suppress(Exception),
                socket.create_connection(("127.0.0.1", old.port), timeout=10) as sock,
            ):
                transfer._send_on(sock, KEY, what, [_Silent(64 << 10), None], deadline)

        threading.Thread(target=dead_pusher, daemon=True).start()
        wait_for(stalled.is_set)
        assert stalled.is_set()
        env_b2 = node_env(
            logical("b"), 2, extra=memory_tier.replica_environment(SECRET, 2, hosts, 1)
        )
        started = time.monotonic()
        with mock.patch.dict(os.environ, env_b2):
            new = replica.ensure_receiver()
        took = time.monotonic() - started
        assert new is not None and new is not old
        assert took < 5, f"the training thread waited {took:.1f} s on a dead pusher"
        wait_for(lambda: not any(replicas_of(new).glob(f"{replica.INCOMING_PREFIX}*")))
        assert list(replicas_of(new).glob(f"{replica.INCOMING_PREFIX}*")) == []
        # The rejoined generation's pushes reach the new receiver.
        key2 = memory_tier.generation_key(SECRET, 2)
        final2 = snapshot(node_env(logical("a"), 2), 13, b"r" * 1000)
        to2 = env_b2[environment.MEMORY_REPLICA_LISTEN]
        replica.push(final2, to2, key=key2, slot=0, job_id=JOB, generation=2)
        assert new.committed == [(0, 13)]
    finally:
        replica.stop_receiver()


def test_the_launchers_variables_start_the_receiver_and_push_after_commit(shm: Path) -> None:
    """``ensure_receiver`` and ``push_committed`` as the torch side calls them, from
    the environment the launcher writes (two nodes on one address, two ports)."""
    hosts = ["127.0.0.1", "127.0.0.1"]
    env_b = node_env(logical("b"), extra=memory_tier.replica_environment(SECRET, 1, hosts, 1))
    env_a = node_env(
        logical("a"),
        extra={
            environment.GROUP_RANK: "0",
            **memory_tier.replica_environment(SECRET, 1, hosts, 0),
        },
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


def test_without_the_secret_no_replica_is_pushed_or_received(shm: Path) -> None:
    hosts = ["127.0.0.1", "127.0.0.1"]
    env = memory_tier.replica_environment(SECRET, 1, hosts, 1)
    env.pop(environment.MEMORY_REPLICA_SECRET)
    with mock.patch.dict(os.environ, node_env(logical("b"), extra=env)):
        assert replica.ensure_receiver() is None
        final = snapshot(node_env(logical("b"), extra=env), 9, b"v")
        with mock.patch.dict(os.environ, node_env(logical("b"), extra=env)):
            assert not replica.push_committed(final)
