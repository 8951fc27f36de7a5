"""Carrying survivors into the next generation (``rejoin``) with real processes: a
torch-free stand-in rank. The launch keeps a live rank's process, links its records
into the new generation, asks it to rejoin through its control file, fences
everything else, and a retried launch carries the same survivor again."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest

from activities.launcher import launch_generation
from activities.nodes.factory import substituted_agents
from activities.nodes.procfs import is_alive
from activities.nodes.rundir import GenerationDir, read_json
from activities.nodes.shim_agent import LocalShimAgent
from activities.nodes.shim_calls import ShimCall, ShimReply
from activities.stop import stop_generations
from infra import chaos
from lazarus.domain import environment as env_names
from lazarus.domain.contracts import LaunchRequest, StopRequest
from lazarus.domain.spec import JobSpec, parse_spec

pytestmark = pytest.mark.timeout(120)

FAKE_RANK = Path(__file__).resolve().parents[1] / "fixtures" / "fake_rank.py"


@pytest.fixture
def job(tmp_path: Path):  # type: ignore[no-untyped-def]
    spec = parse_spec(
        {
            "name": "rejoin",
            "command": [sys.executable, str(FAKE_RANK)],
            "nproc_per_node": 2,
            "checkpoint_dir": "ckpt",
            "env": {"FAKE_STEPS": "100000"},
            "rejoin": {"timeout_s": 45},
        },
        "<test>",
    ).resolved(tmp_path)
    yield spec
    asyncio.run(
        stop_generations(
            StopRequest(job_id=spec.job_id, run_root=str(Path(spec.run_dir) / "rejoin"), grace_s=0)
        )
    )


def kill_and_wait(pid: int, ticks: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while is_alive(pid, ticks) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_survivor_keeps_its_process_and_is_asked_to_rejoin(job: JobSpec) -> None:
    first = launch_generation(LaunchRequest(spec=job, generation=1))
    survivor, failed = first.ranks
    assert f"{env_names.REJOIN_TIMEOUT_S}=45.0".encode() in Path(
        f"/proc/{survivor.pid}/environ"
    ).read_bytes().split(b"\0")
    kill_and_wait(failed.pid, failed.start_ticks)
    exit_deadline = time.monotonic() + 30
    gen1 = GenerationDir.of(Path(first.run_dir).parent, 1)
    while not gen1.exit_file(1).exists() and time.monotonic() < exit_deadline:
        time.sleep(0.05)

    second = launch_generation(LaunchRequest(spec=job, generation=2, rejoin_ranks=[0, 1]))

    assert second.rejoined == [0]
    assert second.rejoin_refused == ["rank 1: its process has exited"]
    kept, started = second.ranks
    assert (kept.pid, kept.start_ticks) == (survivor.pid, survivor.start_ticks)
    assert is_alive(survivor.pid, survivor.start_ticks), "the launch never fenced the survivor"
    assert started.pid != failed.pid and is_alive(started.pid, started.start_ticks)
    gen2 = GenerationDir.of(Path(second.run_dir).parent, 2)
    assert gen2.pid_file(0).is_symlink() and read_json(gen2.pid_file(0)) == read_json(
        gen1.pid_file(0)
    )
    assert gen2.log_file(0).resolve() == gen1.log_file(0).resolve()
    assert not gen2.exit_file(0).exists(), "its exit record will land in generation 1's dir"
    request = (read_json(gen1.control_file) or {})[env_names.CONTROL_REJOIN]
    assert request["generation"] == 2 and list(request["env"]) == ["0"]
    env = request["env"]["0"]
    assert set(env) == set(env_names.REJOIN_VARIABLES)
    assert env[env_names.GENERATION] == "2"
    assert env[env_names.MASTER_PORT] == str(second.master_port)
    assert env[env_names.HEARTBEAT_FILE] == str(gen2.heartbeat_file(0))
    assert env[env_names.CONTROL_FILE] == str(gen2.control_file)
    assert env[env_names.RESUME_FROM] is None, "no checkpoint: unset, not left as it was"
    assert len(chaos.live_rank_processes(Path(job.run_dir) / "rejoin")) == 2

    # A retry of the same launch (the worker died before launch.json) carries the same
    # survivor and adopts the rank it started: no duplicate.
    gen2.launch_file.unlink()
    again = launch_generation(LaunchRequest(spec=job, generation=2, rejoin_ranks=[0, 1]))
    assert [r.pid for r in again.ranks] == [r.pid for r in second.ranks]
    assert again.rejoined == [0]
    assert len(chaos.live_rank_processes(Path(job.run_dir) / "rejoin")) == 2

    # A later whole-generation launch fences the survivor through generation 2's links.
    third = launch_generation(LaunchRequest(spec=job, generation=3))
    assert not is_alive(survivor.pid, survivor.start_ticks)
    assert third.rejoined == []


def test_a_survivor_carried_twice_keeps_one_home(job: JobSpec) -> None:
    first = launch_generation(LaunchRequest(spec=job, generation=1))
    survivor = first.ranks[0]
    for generation in (2, 3):
        for pid in launched_pids(job, generation - 1):
            if pid != survivor.pid:
                kill_and_wait(pid, ticks_of(pid))
        result = launch_generation(LaunchRequest(spec=job, generation=generation, rejoin_ranks=[0]))
        assert result.rejoined == [0] and result.ranks[0].pid == survivor.pid
    gen3 = GenerationDir.of(Path(first.run_dir).parent, 3)
    home = GenerationDir.of(Path(first.run_dir).parent, 1)
    assert Path(os.path.realpath(gen3.pid_file(0))) == home.pid_file(0).resolve()
    assert (read_json(GenerationDir.of(home.path.parent, 2).control_file) or {}).get(
        env_names.CONTROL_REJOIN, {}
    ).get("generation") == 3, "the second request goes where the survivor reads now"


def launched_pids(job: JobSpec, generation: int) -> list[int]:
    done = read_json(GenerationDir.of(Path(job.run_dir) / "rejoin", generation).launch_file)
    assert done is not None
    return [int(r["pid"]) for r in done["ranks"]]


def ticks_of(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rindex(")") + 2 :].split()[19])


class _CountingShim(LocalShimAgent):
    """The shim run on this machine, as an ssh node's would be, counting its verbs."""

    verbs: ClassVar[list[str]] = []

    def _call(self, invocations: list[list[str] | ShimCall], timeout_s: float) -> ShimReply:
        _CountingShim.verbs += [i.argv[0] if isinstance(i, ShimCall) else i[0] for i in invocations]
        return super()._call(invocations, timeout_s)


def _warm_rejoin_spec(tmp_path: Path, name: str) -> JobSpec:
    """Two warm ranks of the fake script on one shim node, with rejoin."""
    return parse_spec(
        {
            "name": name,
            "command": [sys.executable, str(FAKE_RANK)],
            "nproc_per_node": 2,
            "checkpoint_dir": "ckpt",
            "env": {"FAKE_STEPS": "100000", "FAKE_STEP_S": "0.1"},
            "rejoin": {"timeout_s": 45},
            "warm_start": {"preload": ["json"], "standby": 1},
        },
        "<test>",
    ).resolved(tmp_path)


def test_a_shim_node_carries_and_forks_the_replacement_in_one_call(tmp_path: Path) -> None:
    """With warm starts, a shim node (ssh) carries its survivor and forks the crashed
    rank's replacement in one ``rejoin`` call, one interpreter on the node
    (``NodeAgent.carry_and_start``), not a ``rejoin`` and then a ``warm``."""
    spec = _warm_rejoin_spec(tmp_path, "rejoin-warm")
    run_root = Path(spec.run_dir) / spec.job_id
    try:
        with substituted_agents(_CountingShim):
            first = launch_generation(LaunchRequest(spec=spec, generation=1))
            assert first.warm_start is not None and first.warm_start.warm_ranks == [0, 1]
            survivor, failed = first.ranks
            kill_and_wait(failed.pid, failed.start_ticks)
            _CountingShim.verbs.clear()

            second = launch_generation(LaunchRequest(spec=spec, generation=2, rejoin_ranks=[0, 1]))
    finally:
        asyncio.run(
            stop_generations(
                StopRequest(job_id=spec.job_id, run_root=str(run_root), grace_s=0, end_of_run=True)
            )
        )
    assert second.rejoined == [0]
    assert second.warm_start is not None and second.warm_start.warm_ranks == [1]
    kept, started = second.ranks
    assert (kept.pid, kept.start_ticks) == (survivor.pid, survivor.start_ticks)
    assert started.pid not in (survivor.pid, failed.pid)
    assert _CountingShim.verbs == ["rejoin"], _CountingShim.verbs


class _OlderNode(_CountingShim):
    """A node whose Lazarus predates ``CarryRequest.start``: it refuses the field, as
    pydantic's ``extra="forbid"`` does, before doing anything."""

    def _call(self, invocations: list[list[str] | ShimCall], timeout_s: float) -> ShimReply:
        if any(isinstance(i, ShimCall) and '"start":' in i.stdin for i in invocations):
            _CountingShim.verbs.append("refused")
            refusal = b'{"error": "rejoin: bad request on stdin: start: Extra inputs"}\n'
            return ShimReply(2, refusal, 0.0)
        return super()._call(invocations, timeout_s)


def test_a_node_that_refuses_the_start_still_carries_its_survivor(tmp_path: Path) -> None:
    """An older node refuses the one-call request: the survivor is carried all the
    same, and the replacement starts through the usual ``warm`` afterwards."""
    spec = _warm_rejoin_spec(tmp_path, "rejoin-older")
    run_root = Path(spec.run_dir) / spec.job_id
    try:
        with substituted_agents(_OlderNode):
            first = launch_generation(LaunchRequest(spec=spec, generation=1))
            survivor, failed = first.ranks
            kill_and_wait(failed.pid, failed.start_ticks)
            _CountingShim.verbs.clear()
            second = launch_generation(LaunchRequest(spec=spec, generation=2, rejoin_ranks=[0, 1]))
    finally:
        asyncio.run(
            stop_generations(
                StopRequest(job_id=spec.job_id, run_root=str(run_root), grace_s=0, end_of_run=True)
            )
        )
    assert second.rejoined == [0]
    kept, started = second.ranks
    assert (kept.pid, kept.start_ticks) == (survivor.pid, survivor.start_ticks)
    assert started.pid not in (survivor.pid, failed.pid)
    assert _CountingShim.verbs == ["refused", "rejoin", "warm"], _CountingShim.verbs
