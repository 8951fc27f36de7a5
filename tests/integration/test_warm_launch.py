"""The launcher with ``warm_start``: ranks forked from the run's zygote, cold fallbacks
with their reasons, adoption on retry, fencing and the end of a run (real processes,
a torch-free stand-in rank, a light preload)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.launcher import launch_generation
from activities.nodes import zygote_client
from activities.nodes.node_records import RankLaunch, WarmStart
from activities.nodes.procfs import is_alive, read_stat
from activities.nodes.rundir import GenerationDir, read_json
from activities.nodes.shim_agent import LocalShimAgent
from activities.nodes.warm_starts import zygote_dirs
from activities.nodes.zygote_socket import zygote_dir
from activities.stop import stop_generations
from infra import chaos
from lazarus.domain.contracts import LaunchRequest, LaunchResult, StopRequest
from lazarus.domain.memory_tier import memory_checkpoint_dir, on_node
from lazarus.domain.spec import JobSpec, NodeSpec, parse_spec
from lazarus.rank.memory import secure

FAKE_RANK = Path(__file__).resolve().parents[1] / "fixtures" / "fake_rank.py"


def spec_for(tmp_path: Path, preload: list[str] | None = None, name: str = "warm") -> JobSpec:
    return parse_spec(
        {
            "name": name,
            "command": [sys.executable, str(FAKE_RANK)],
            "nproc_per_node": 2,
            "checkpoint_dir": "ckpt",
            "env": {"FAKE_STEPS": "100000", "FAKE_STEP_S": "0.1"},
            "warm_start": {"preload": preload or ["json"], "standby": 1},
        },
        "<test>",
    ).resolved(tmp_path)


def wait_for(predicate, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture
def job_dir(tmp_path: Path) -> Iterator[Path]:
    """The job directory; teardown stops every rank and, as the end of a run, every
    zygote under it."""
    root = tmp_path / ".lazarus" / "runs"  # spec_for's run_dir
    yield root
    for job in root.iterdir() if root.is_dir() else []:
        asyncio.run(
            stop_generations(
                StopRequest(job_id=job.name, run_root=str(job), grace_s=0, end_of_run=True)
            )
        )
    assert not [
        d
        for j in root.glob("*")
        for r in [j, *j.iterdir()]
        for d in zygote_dirs(r)
        if zygote_client.read_zygote(d) is not None
    ], "a zygote was left running"


def launch(spec: JobSpec, generation: int, run: str = "run-a") -> LaunchResult:
    run_root = Path(spec.run_dir) / spec.job_id / run
    return launch_generation(
        LaunchRequest(spec=spec, generation=generation, run_root=str(run_root))
    )


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.timeout(120)
def test_ranks_are_forked_warm_detached_and_relaunches_take_a_standby(
    tmp_path: Path, job_dir: Path
) -> None:
    spec = spec_for(tmp_path)
    first = launch(spec, 1)
    assert first.warm_start is not None
    assert first.warm_start.warm_ranks == [0, 1] and first.warm_start.cold_ranks == []
    assert first.ranks_started_at is not None
    for rank in first.ranks:
        assert parent_of(rank.pid) != os.getpid(), "a rank is never a child of the worker"
        assert rank.pgid != os.getpgrp()
    launched = read_json(Path(first.run_dir) / "launch.json")
    assert launched is not None and launched["warm_start"]["warm_ranks"] == [0, 1]

    directory = zygote_dir(Path(first.run_dir).parent, "local")
    wait_for(lambda: zygote_client.zygote_status(directory).idle_standby_pids, 30, "refill")
    second = launch(spec, 2)
    assert not any(is_alive(r.pid, r.start_ticks) for r in first.ranks), "gen 1 fenced"
    assert second.warm_start is not None and second.warm_start.warm_ranks == [0, 1]
    assert second.warm_start.from_standby >= 1
    # The same zygote served both generations.
    assert len(zygote_dirs(Path(first.run_dir).parent)) == 1


@pytest.mark.timeout(120)
def test_a_retried_launch_adopts_the_forked_ranks(tmp_path: Path, job_dir: Path) -> None:
    spec = spec_for(tmp_path)
    first = launch(spec, 1)
    gen = GenerationDir(Path(first.run_dir))
    gen.launch_file.unlink()  # as if the worker died before writing launch.json
    again = launch(spec, 1)
    assert again.adopted and [r.pid for r in again.ranks] == [r.pid for r in first.ranks]
    assert again.warm_start is not None and again.warm_start.warm_ranks == [0, 1]
    assert len(chaos.live_rank_processes(Path(first.run_dir).parent)) == 2


@pytest.mark.timeout(150)
def test_a_dead_zygote_means_cold_once_then_warm_again(tmp_path: Path, job_dir: Path) -> None:
    spec = spec_for(tmp_path)
    first = launch(spec, 1)
    directory = zygote_dir(Path(first.run_dir).parent, "local")
    info = zygote_client.read_zygote(directory)
    assert info is not None
    os.kill(info.pid, signal.SIGKILL)
    wait_for(lambda: not is_alive(info.pid, info.start_ticks), 10, "the zygote to die")

    second = launch(spec, 2)
    assert second.warm_start is not None and second.warm_start.cold_ranks == [0, 1]
    [reason] = second.warm_start.fallback_reasons
    assert reason.startswith("local: ") and "dead" in reason and "restarted" in reason

    zygote_client.wait_serving(directory, 60)
    third = launch(spec, 3)
    assert third.warm_start is not None and third.warm_start.warm_ranks == [0, 1]


@pytest.mark.timeout(120)
def test_a_failed_preload_starts_cold_and_says_why(tmp_path: Path, job_dir: Path) -> None:
    spec = spec_for(tmp_path, preload=["no_such_module_for_lazarus"])
    result = launch(spec, 1)
    assert result.warm_start is not None and result.warm_start.cold_ranks == [0, 1]
    [reason] = result.warm_start.fallback_reasons
    assert "preload failed" in reason and "no_such_module_for_lazarus" in reason
    assert len(chaos.live_rank_processes(Path(result.run_dir).parent)) == 2


@pytest.mark.timeout(120)
def test_a_new_run_stops_the_old_runs_zygote(tmp_path: Path, job_dir: Path) -> None:
    spec = spec_for(tmp_path)
    old = launch(spec, 1, run="run-a")
    info = zygote_client.read_zygote(zygote_dir(Path(old.run_dir).parent, "local"))
    assert info is not None
    launch(spec, 1, run="run-b")
    assert not is_alive(info.pid, info.start_ticks), "the old run's zygote is fenced"
    assert not any(is_alive(r.pid, r.start_ticks) for r in old.ranks)


@pytest.mark.timeout(120)
def test_end_of_run_stops_the_zygote_and_removes_the_memory_tier(
    tmp_path: Path, job_dir: Path
) -> None:
    spec = spec_for(tmp_path, name=f"warm-{os.getpid()}-{time.monotonic_ns() % 10**6}")
    result = launch(spec, 1)
    run_root = Path(result.run_dir).parent
    memory = Path(on_node(memory_checkpoint_dir(spec.job_id, str(run_root)), os.getuid()))
    secure(memory / "step-1")  # where a rank would have made it: the private root
    info = zygote_client.read_zygote(zygote_dir(run_root, "local"))
    assert info is not None
    stopped = asyncio.run(
        stop_generations(
            StopRequest(job_id=spec.job_id, run_root=str(run_root), grace_s=0, end_of_run=True)
        )
    )
    assert stopped.signalled_groups == 2
    assert not is_alive(info.pid, info.start_ticks)
    assert not memory.exists()
    assert not memory.parent.exists()  # the job's emptied directory in the tier goes too


@pytest.mark.timeout(60)
def test_shim_nodes_fork_warm_through_the_nodes_zygote(tmp_path: Path) -> None:
    gen = tmp_path / "gen-00001"
    agent = LocalShimAgent(NodeSpec(name="n0"))
    env = {"RANK": "0", "FAKE_STEPS": "1", "PATH": os.environ["PATH"]}
    [started] = agent.start_ranks_warm(
        str(gen),
        [
            RankLaunch(
                rank=0, command=[sys.executable, str(FAKE_RANK)], env=env, workdir=str(tmp_path)
            )
        ],
        WarmStart(run_root=str(tmp_path), preload=["json"], standby=1),
    )
    assert started.warm and started.cold_reason is None
    wait_for(lambda: read_json(gen / "rank-0.exit.json"), 30, "the rank to finish")
    assert read_stat(started.pid) is None or not is_alive(started.pid, started.start_ticks)
    info = zygote_client.read_zygote(zygote_dir(tmp_path, "n0"))
    assert info is not None
    agent.end_run(str(tmp_path), [])
    assert not is_alive(info.pid, info.start_ticks)
