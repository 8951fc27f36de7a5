"""Launch, re-attach and stop with real processes (a torch-free stand-in rank)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from activities.launcher import LaunchRefused, launch_generation
from activities.nodes.procfs import is_alive, read_stat
from activities.nodes.rundir import GenerationDir, read_json
from activities.stop import stop_generations
from infra import chaos
from lazarus.domain.checkpoint_layout import TEMP_SUFFIX
from lazarus.domain.contracts import LaunchRequest, StopRequest
from lazarus.domain.spec import JobSpec, parse_spec

FAKE_RANK = Path(__file__).resolve().parents[1] / "fixtures" / "fake_rank.py"


def spec_for(tmp_path: Path, steps: int = 1000, **env: str) -> JobSpec:
    return parse_spec(
        {
            "name": "mech",
            "command": [sys.executable, str(FAKE_RANK)],
            "nproc_per_node": 2,
            "checkpoint_dir": "ckpt",
            "env": {"FAKE_STEPS": str(steps), **env},
        },
        "<test>",
    ).resolved(tmp_path)


@pytest.fixture
def job(tmp_path: Path):  # type: ignore[no-untyped-def]
    spec = spec_for(tmp_path)
    yield spec
    asyncio.run(
        stop_generations(
            StopRequest(job_id=spec.job_id, run_root=str(Path(spec.run_dir) / "mech"), grace_s=0)
        )
    )


def test_ranks_are_detached_from_the_launcher(job: JobSpec) -> None:
    result = launch_generation(LaunchRequest(spec=job, generation=1))
    for rank in result.ranks:
        stat = read_stat(rank.pid)
        assert stat is not None
        assert stat.pgrp == rank.pgid != os.getpgrp(), "each rank has its own process group"
        parent = int(Path(f"/proc/{rank.pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
        assert parent != os.getpid(), "a rank must never be a child of the worker"
        env = Path(f"/proc/{rank.pid}/environ").read_bytes().split(b"\0")
        assert f"RANK={rank.rank}".encode() in env and b"WORLD_SIZE=2" in env
        assert b"LAZARUS_JOB_ID=mech" in env and b"TORCHELASTIC_RESTART_COUNT=0" in env


def test_relaunching_the_same_generation_adopts_instead_of_duplicating(job: JobSpec) -> None:
    first = launch_generation(LaunchRequest(spec=job, generation=1))
    again = launch_generation(LaunchRequest(spec=job, generation=1))
    assert again.adopted and [r.pid for r in again.ranks] == [r.pid for r in first.ranks]
    assert again.master_port == first.master_port
    assert len(chaos.live_rank_processes(Path(job.run_dir) / "mech")) == 2


def test_new_generation_gets_fresh_port_and_fences_the_old(job: JobSpec) -> None:
    first = launch_generation(LaunchRequest(spec=job, generation=1))
    second = launch_generation(LaunchRequest(spec=job, generation=2))
    assert second.master_port != first.master_port
    assert not any(is_alive(r.pid, r.start_ticks) for r in first.ranks), "old generation fenced"
    with pytest.raises(LaunchRefused, match="fenced"):
        launch_generation(LaunchRequest(spec=job, generation=1))


def test_exit_status_is_recorded_with_no_controller(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, steps=3, FAKE_FAIL_RANK="1", FAKE_FAIL_AT="2")
    result = launch_generation(LaunchRequest(spec=spec, generation=1))
    gen = GenerationDir(Path(result.run_dir))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (
        gen.exit_file(0).exists() and gen.exit_file(1).exists()
    ):
        time.sleep(0.05)
    assert read_json(gen.exit_file(1))["exit_code"] == 3  # type: ignore[index]
    assert read_json(gen.exit_file(0))["exit_code"] == 0  # type: ignore[index]
    assert "injected failure" in gen.log_file(1).read_text()


def test_a_missing_program_is_refused_before_anything_starts(tmp_path: Path) -> None:
    spec = parse_spec(
        {"name": "bad", "command": ["no-such-program-xyz"], "checkpoint_dir": "c"}, "<test>"
    ).resolved(tmp_path)
    with pytest.raises(LaunchRefused, match="no-such-program-xyz"):
        launch_generation(LaunchRequest(spec=spec, generation=1))


def test_stop_takes_down_stopped_ranks_and_is_idempotent(job: JobSpec) -> None:
    result = launch_generation(LaunchRequest(spec=job, generation=1))
    os.kill(result.ranks[0].pid, signal.SIGSTOP)
    # What a wrapper killed between its write and its rename leaves behind.
    leftover = Path(result.run_dir) / f".rank-0.exit.json.999{TEMP_SUFFIX}"
    leftover.write_text("{")
    request = StopRequest(job_id="mech", run_root=str(Path(job.run_dir) / "mech"), grace_s=2)
    stopped = asyncio.run(stop_generations(request))
    assert stopped.signalled_groups == 2 and stopped.generations == [1]
    assert not any(is_alive(r.pid, r.start_ticks) for r in result.ranks)
    assert not leftover.exists(), "the stop sweeps what its dead writers left"
    again = asyncio.run(stop_generations(request))
    assert again.signalled_groups == 0


def test_a_stopped_generation_cannot_be_launched_late(job: JobSpec) -> None:
    launch_generation(LaunchRequest(spec=job, generation=1))
    asyncio.run(
        stop_generations(
            StopRequest(job_id="mech", run_root=str(Path(job.run_dir) / "mech"), grace_s=1)
        )
    )
    with pytest.raises(LaunchRefused, match="was stopped"):
        launch_generation(LaunchRequest(spec=job, generation=1))


def test_a_launch_sweeps_what_a_killed_checkpoint_writer_left(job: JobSpec) -> None:
    """A rank SIGKILLed between writing a manifest and renaming it leaves its temporary
    file in the checkpoint; the next launch, with every older rank fenced, removes it."""
    leftover = Path(job.checkpoint_dir) / "step-00000015" / f".manifest.json.9.1{TEMP_SUFFIX}"
    leftover.parent.mkdir(parents=True)
    leftover.write_text("{")
    launch_generation(LaunchRequest(spec=job, generation=1))
    assert not leftover.exists()
