"""Run directories per workflow run, and stops that never hit what is not ours
(issue 10: defects 1 activity half, 8, 9, 10, 11), with real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from activities.launcher import LaunchUnreachable, launch, launch_generation
from activities.nodes import fencing
from activities.nodes.procfs import is_alive, read_stat
from activities.nodes.rundir import (
    GenerationDir,
    latest_run,
    read_json,
    runs,
    write_json_atomic,
)
from activities.stop import stop_generations
from infra import chaos
from lazarus.domain.contracts import LaunchRequest, NodeAccess, RankProcess, StopRequest
from lazarus.domain.spec import JobSpec, NodeSpec, SSHSpec, parse_spec

FAKE_RANK = Path(__file__).resolve().parents[1] / "fixtures" / "fake_rank.py"
JOB = "fence"


def spec_for(tmp_path: Path, nproc: int = 2) -> JobSpec:
    return parse_spec(
        {
            "name": JOB,
            "command": [sys.executable, str(FAKE_RANK)],
            "nproc_per_node": nproc,
            "checkpoint_dir": "ckpt",
            "env": {"FAKE_STEPS": "100000"},
        },
        "<test>",
    ).resolved(tmp_path)


def job_dir(spec: JobSpec) -> Path:
    return Path(spec.run_dir) / JOB


def stop_everything(spec: JobSpec) -> None:
    asyncio.run(stop_generations(StopRequest(job_id=JOB, run_root=str(job_dir(spec)), grace_s=0)))


@pytest.fixture
def spec(tmp_path: Path) -> Iterator[JobSpec]:
    spec = spec_for(tmp_path)
    yield spec
    stop_everything(spec)


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process leading its own group: what a reused pid/pgid points at."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def forge_pid_file(gen: GenerationDir, rank: int, pid: int) -> None:
    """A stale pid file whose pid and pgid were reused by ``pid`` (wrong start ticks)."""
    stat = read_stat(pid)
    assert stat is not None
    gen.path.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        gen.pid_file(rank),
        {
            "rank": rank,
            "wrapper_pid": pid,
            "pgid": pid,
            "wrapper_start_ticks": stat.start_ticks - 7,
            "pid": pid,
            "start_ticks": stat.start_ticks - 7,
        },
    )


def alive(result_ranks: list[RankProcess]) -> list[bool]:
    return [is_alive(r.pid, r.start_ticks) for r in result_ranks]


# --- defect 1: one run directory per workflow run ---------------------------------------


def test_a_new_run_never_adopts_an_old_runs_generation_and_fences_it(spec: JobSpec) -> None:
    old_root = job_dir(spec) / "run-old"
    new_root = job_dir(spec) / "run-new"
    old = launch_generation(LaunchRequest(spec=spec, generation=1, run_root=str(old_root)))
    assert Path(old.run_dir) == old_root / "gen-00001"
    new = launch_generation(LaunchRequest(spec=spec, generation=1, run_root=str(new_root)))
    assert not new.adopted, "a new run must start its own ranks, never adopt an old run's"
    assert Path(new.run_dir) == new_root / "gen-00001"
    assert {r.pid for r in new.ranks}.isdisjoint({r.pid for r in old.ranks})
    assert not any(alive(old.ranks)), "an earlier run's ranks are fenced by the launch"
    assert all(alive(new.ranks))
    assert [r.name for r in runs(job_dir(spec))] == ["run-old", "run-new"]


def test_a_new_run_fences_legacy_generations_under_the_job_directory(spec: JobSpec) -> None:
    legacy = launch_generation(LaunchRequest(spec=spec, generation=1))
    assert Path(legacy.run_dir) == job_dir(spec) / "gen-00001", "legacy layout kept"
    new = launch_generation(
        LaunchRequest(spec=spec, generation=1, run_root=str(job_dir(spec) / "run-2"))
    )
    assert not any(alive(legacy.ranks)) and all(alive(new.ranks))


def test_chaos_helpers_resolve_a_job_directory_to_its_latest_run(spec: JobSpec) -> None:
    launch_generation(LaunchRequest(spec=spec, generation=1, run_root=str(job_dir(spec) / "a")))
    second = launch_generation(
        LaunchRequest(spec=spec, generation=1, run_root=str(job_dir(spec) / "b"))
    )
    assert latest_run(job_dir(spec)) == job_dir(spec) / "b"
    newest = chaos.newest_generation(job_dir(spec))
    assert newest is not None and newest.path == job_dir(spec) / "b" / "gen-00001"
    assert sorted(chaos.live_rank_processes(job_dir(spec))) == sorted(r.pid for r in second.ranks)
    generation, _ = chaos.wait_for_step(job_dir(spec), 1, timeout_s=60)
    assert generation == 1
    fault = chaos.signal_rank(job_dir(spec), 0, signal.SIGKILL)
    assert fault.pid == second.ranks[0].pid


# --- defect 10: start ticks checked everywhere; EPERM means not ours --------------------


def test_stop_never_signals_a_reused_pid_or_pgid(
    spec: JobSpec, stranger: subprocess.Popen[bytes]
) -> None:
    forge_pid_file(GenerationDir.of(job_dir(spec) / "run-x", 1), 0, stranger.pid)
    result = asyncio.run(
        stop_generations(StopRequest(job_id=JOB, run_root=str(job_dir(spec) / "run-x"), grace_s=0))
    )
    assert result.signalled_groups == 0 and result.unkillable == []
    assert stranger.poll() is None, "an unrelated process was signalled"


def test_launch_fencing_never_signals_a_reused_pid_or_pgid(
    spec: JobSpec, stranger: subprocess.Popen[bytes]
) -> None:
    forge_pid_file(GenerationDir.of(job_dir(spec), 1), 0, stranger.pid)  # legacy gen
    forge_pid_file(GenerationDir.of(job_dir(spec) / "run-a", 1), 0, stranger.pid)  # older run
    root = job_dir(spec) / "run-b"
    forge_pid_file(GenerationDir.of(root, 1), 0, stranger.pid)  # older generation
    launch_generation(LaunchRequest(spec=spec, generation=2, run_root=str(root)))
    assert stranger.poll() is None, "fencing signalled an unrelated process"


def test_a_group_we_may_not_signal_is_gone_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pgid reused by another user's session: killpg raises EPERM. It is not ours,
    so it counts as gone; the stop returns at once instead of failing forever."""
    gen = GenerationDir.of(tmp_path / "run", 1)
    gen.path.mkdir(parents=True)
    pgid = 4_194_000  # no such process: ownership cannot be disproved from /proc
    assert read_stat(pgid) is None
    write_json_atomic(
        gen.pid_file(0), {"pgid": pgid, "pid": pgid, "start_ticks": 1, "wrapper_start_ticks": 1}
    )
    sent: list[int] = []

    def refuse(group: int, sig: int) -> None:
        sent.append(sig)
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "killpg", refuse)  # what procfs.signal_group calls
    monkeypatch.setattr(fencing, "live_groups", lambda pgids: {p: [p] for p in pgids})
    started = time.monotonic()
    result = asyncio.run(
        stop_generations(
            StopRequest(job_id=JOB, run_root=str(gen.path.parent), grace_s=5, kill_wait_s=5)
        )
    )
    assert time.monotonic() - started < 4, "an EPERM group must not be waited on"
    assert sent == [signal.SIGTERM], "tried once, then treated as gone"
    assert result.signalled_groups == 0 and result.unkillable == []


# --- defect 9: a group that will not die is reported, within a bound --------------------


def test_a_group_that_survives_sigkill_is_reported_within_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen = GenerationDir.of(tmp_path / "run", 1)
    gen.path.mkdir(parents=True)
    pgid = 4_194_001
    assert read_stat(pgid) is None
    write_json_atomic(
        gen.pid_file(0), {"pgid": pgid, "pid": pgid, "start_ticks": 1, "wrapper_start_ticks": 1}
    )
    signals: list[signal.Signals] = []

    def record(group: int, sig: signal.Signals) -> bool:
        signals.append(sig)
        return True  # delivered, but the process is in state D: nothing happens

    monkeypatch.setattr(fencing, "signal_group", record)
    monkeypatch.setattr(fencing, "live_groups", lambda pgids: {p: [p, p + 1] for p in pgids})
    started = time.monotonic()
    result = asyncio.run(
        stop_generations(
            StopRequest(job_id=JOB, run_root=str(gen.path.parent), grace_s=0.2, kill_wait_s=0.5)
        )
    )
    elapsed = time.monotonic() - started
    assert elapsed < 30, f"the stop must return within its bound, took {elapsed:.1f} s"
    assert signal.SIGKILL in signals
    assert result.killed_groups == 1
    [group] = result.unkillable
    assert group.node == "local" and group.pgid == pgid and group.pids == [pgid, pgid + 1]
    assert "SIGKILL" in group.reason and str(pgid) in group.reason
    assert gen.stopped_file.exists(), "the generation is still fenced against a late launch"


# --- defect 11: stopping one logical local node leaves the others alone -----------------


def test_stopping_one_local_node_leaves_the_running_generation_alone(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, nproc=1)
    a, b, c = NodeSpec(name="a"), NodeSpec(name="b"), NodeSpec(name="c")
    root = str(job_dir(spec) / "run-1")
    try:
        first = launch_generation(
            LaunchRequest(spec=spec, generation=1, nodes=[a, b], run_root=root)
        )
        # b was quarantined: generation 2 runs on a and the spare c.
        second = launch_generation(
            LaunchRequest(spec=spec, generation=2, nodes=[a, c], run_root=root)
        )
        assert not any(alive(first.ranks))
        # `lazarus return b`: fence b before it becomes a spare.
        returned = asyncio.run(
            stop_generations(
                StopRequest(job_id=JOB, run_root=root, grace_s=0, access=NodeAccess(nodes=[b]))
            )
        )
        assert all(alive(second.ranks)), "returning b killed the running generation"
        assert not GenerationDir(Path(second.run_dir)).stopped_file.exists()
        assert 2 not in returned.generations
        # Stopping c alone takes only c's rank of the running generation.
        asyncio.run(
            stop_generations(
                StopRequest(job_id=JOB, run_root=root, grace_s=0, access=NodeAccess(nodes=[c]))
            )
        )
        by_node = {r.node: is_alive(r.pid, r.start_ticks) for r in second.ranks}
        assert by_node == {"a": True, "c": False}
    finally:
        stop_everything(spec)


# --- defect 8: an unreachable node is a node failure, and leaves nothing running --------


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.timeout(120)
def test_an_unreachable_node_fails_the_launch_as_a_node_failure(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, nproc=1).model_copy(
        update={"ssh": SSHSpec(connect_timeout_s=2, known_hosts=str(tmp_path / "known_hosts"))}
    )
    down = NodeSpec(name="down", launcher="ssh", host="127.0.0.1", port=closed_port())
    root = job_dir(spec) / "run-1"
    request = LaunchRequest(
        spec=spec, generation=1, nodes=[NodeSpec(name="a"), down], run_root=str(root)
    )
    try:
        with pytest.raises(ApplicationError) as raised:
            asyncio.run(launch(request))
        error = raised.value
        assert error.type == "NodeUnreachable" and error.non_retryable
        assert list(error.details) == ["down"] and "down" in error.message
        gen = GenerationDir.of(root, 1)
        pid_record = read_json(gen.pid_file(0))
        assert pid_record is not None, "rank 0 had started on node a"
        assert not is_alive(int(pid_record["pid"]), int(pid_record["start_ticks"])), (
            "what the launch started on the reachable node must be stopped"
        )
        assert gen.stopped_file.exists(), "the half-launched generation is never relaunched"
        with pytest.raises(LaunchUnreachable):  # the blocking core raises the typed error
            launch_generation(request.model_copy(update={"generation": 2}))
    finally:
        stop_everything(spec)
    assert os.path.isdir(root)
