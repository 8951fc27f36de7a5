"""Issue 30 item 2, wiring: the peers' node loss on the SSH test hosts
(``multinode_node_loss``): who runs it, in which setup, and how torchft's replacement
group counts. The runs themselves need network namespaces and minutes: their figures
are on docs/results/2026-12-peers.md, with the command."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from bench import catalog
from bench.harness import BenchConfig, BenchContext
from bench.peers import scenarios as peer_scenarios
from bench.peers.jobs import MemberJob, MemberPoint, NvrxLauncherJob
from bench.peers.scenarios_multinode import nvrx_node_loss
from bench.peers.settings import NvrxSettings, TorchftSettings
from bench.systems import PEER_SYSTEMS
from bench.torchrun import GATED_AGENT, Rendezvous


def _ctx(tmp_path: Path) -> BenchContext:
    return BenchContext(cast(Any, None), cast(Any, None), BenchConfig(), tmp_path)


def test_every_peer_runs_the_node_loss_on_the_test_hosts() -> None:
    scenario = catalog.load()["multinode_node_loss"]
    for system in PEER_SYSTEMS:
        assert scenario.runner(system) is not None, system


def test_in_process_on_the_hosts_has_two_processes_per_host_and_four_active(
    tmp_path: Path,
) -> None:
    ctx = _ctx(tmp_path)
    paths = ctx._paths("nvrx-inprocess", "multinode_node_loss", 0)
    prefixes = [["nsenter", f"--target={host}", "--"] for host in (1, 1, 2, 2, 3, 3)]
    members = peer_scenarios.inprocess_members(
        ctx, paths, prefixes, active=4, master_addr="10.0.0.1", env={"GLOO_SOCKET_IFNAME": "v"}
    )
    assert [m.name for m in members] == [f"rank{r}" for r in range(6)]
    for rank, member in enumerate(members):
        assert member.argv[:3] == prefixes[rank] and member.env["RANK"] == str(rank)
        assert member.env["WORLD_SIZE"] == "6" and member.env["MASTER_ADDR"] == "10.0.0.1"
        settings = json.loads(member.env["BENCH_NVRX_INPROCESS"])
        assert settings["active_world_size"] == 4 and settings["processes"] == 6


def test_ft_launcher_agents_are_elastic_with_a_hot_spare(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    how = nvrx_node_loss(ctx)
    assert how.nnodes == "2:3" and how.conf == ("last_call_timeout=1",)
    assert how.standby_waits.search("The node 'h3' attempts to join the next round of the")
    settings = NvrxSettings.for_shape(ctx.shape)
    paths = ctx._paths("nvrx", "multinode_node_loss", 0)
    job = NvrxLauncherJob(
        example_args=ctx.example_args(paths),
        log_path=paths.root / "log",
        nproc=2,
        rendezvous=Rendezvous("10.0.0.1:29400", "bench-x", how.nnodes, how.conf),
        settings=settings,
    )
    argv = job.command("10.0.0.3", is_host=False)
    assert argv[1:3] == ["-m", "nvidia_resiliency_ext.fault_tolerance.launcher"]
    assert argv[argv.index("--nnodes") + 1] == "2:3"
    assert argv[argv.index("--rdzv-conf") + 1] == "is_host=false,last_call_timeout=1"
    assert argv[argv.index("--local-addr") + 1] == "10.0.0.3"
    assert argv[argv.index("--nproc-per-node") + 1] == "2"
    assert "--ft-rank-heartbeat-timeout" in argv and "--standalone" not in argv


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_gated_agent_runs_its_launchers_module_once_the_gate_exists(tmp_path: Path) -> None:
    """The standby's gate runs any launcher's module (torchrun's, NVRx's) as ``-m``."""
    gate = tmp_path / "go"
    gate.touch()
    done = subprocess.run(
        [sys.executable, "-c", GATED_AGENT, str(gate), "timeit", "-n", "1", "pass"],
        capture_output=True,
        text=True,
        timeout=50,
        check=True,
    )
    assert "1 loop" in done.stdout


def test_a_torchft_group_on_a_test_host_advertises_its_address(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    settings = TorchftSettings.for_shape(ctx.shape)
    paths = ctx._paths("torchft", "multinode_node_loss", 0)
    script = peer_scenarios.torchft_script(ctx, paths, settings)
    member = peer_scenarios.torchft_group(
        "spare",
        1,
        script,
        "http://10.0.0.1:29510",
        settings,
        prefix=["nsenter", "--target=1", "--"],
        extra_args=["--advertise", "10.0.0.3", "--wait-for", "gate"],
        env={"GLOO_SOCKET_IFNAME": "veth"},
    )
    assert member.argv[:3] == ["nsenter", "--target=1", "--"]
    assert member.argv[-4:] == ["--advertise", "10.0.0.3", "--wait-for", "gate"]
    assert member.env["REPLICA_GROUP_ID"] == "1"
    assert member.env["TORCHFT_LIGHTHOUSE"] == "http://10.0.0.1:29510"
    assert member.env["GLOO_SOCKET_IFNAME"] == "veth" and member.rank_is_child
    recorded = TorchftSettings().node_loss
    assert "node_timeout_s" in recorded and "h3" in recorded


def test_torchft_counts_the_replacement_groups_first_step_as_the_rejoin(tmp_path: Path) -> None:
    """h2 killed at t=100 after step 50; the survivor commits step 51 at t=110; the
    replacement on h3 (another member) heals and commits step 80 at t=112."""
    job = MemberJob([], tmp_path / "log")
    job.points = [
        MemberPoint(99.0, "group0", 1, 50),
        MemberPoint(99.1, "group1", 1, 50),
        MemberPoint(110.0, "group0", 1, 51),
        MemberPoint(112.0, "spare", 1, 80),
    ]
    figures = peer_scenarios.torchft_figures(
        job, "group1", "group0", 100.0, 50, 1, replacement="spare"
    )
    assert figures["survivors_first_step_s"] == pytest.approx(10.0)
    assert figures["recovery_outside_s"] == pytest.approx(12.0)
    assert figures["recovered"] is True and figures["steps_lost"] == 0
    # Without the replacement named, the killed group never came back.
    alone = peer_scenarios.torchft_figures(job, "group1", "group0", 100.0, 50, 1)
    assert alone["recovered"] is False


class _Exited:
    """A finished member process (``poll`` is all :class:`MemberJob` asks of one)."""

    def poll(self) -> int:
        return 0


def test_one_torchft_runner_dates_the_fault_before_it_and_counts_the_replacement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crash's and the node loss's runner, without processes: at the fault step the
    fault goes in; the survivor commits one step 1 s later, the replacement ``spare``
    one 2 s later. Without the replacement named the victim is not back: its note."""
    ctx = _ctx(tmp_path)
    step = ctx.shape.fault_step
    job = MemberJob([], tmp_path / "log")
    job.procs = {name: cast(Any, _Exited()) for name in ("group0", "spare")}

    @asynccontextmanager
    async def member_job(*_: object) -> AsyncIterator[MemberJob]:
        yield job

    async def weights_ok(*_: object, **__: object) -> bool:
        return True

    async def inject(_: MemberJob) -> None:
        now = time.time()
        job.points += [MemberPoint(now + 1, "group0", 1, step + 1)]
        job.points += [MemberPoint(now + 2, "spare", 1, step + 5)]

    monkeypatch.setattr(peer_scenarios, "member_job", member_job)
    monkeypatch.setattr(ctx, "weights_ok", weights_ok)
    fault = peer_scenarios.TorchftFault(
        "group1", "group0", inject, ["group0", "spare"], "never back", replacement="spare"
    )
    for replacement in ("spare", None):
        job.points = [MemberPoint(time.time() - 1, g, 1, step) for g in ("group0", "group1")]
        paths = ctx._paths("torchft", "multinode_node_loss", 0)
        outcome = asyncio.run(
            peer_scenarios.torchft_run(
                ctx, 0, "multinode_node_loss", paths, [], replace(fault, replacement=replacement)
            )
        )
        assert outcome.metrics["completed"] and outcome.metrics["weights_ok"]
        assert outcome.metrics["survivors_first_step_s"] == pytest.approx(1.0, abs=0.2)
        if replacement:
            assert outcome.metrics["recovery_outside_s"] == pytest.approx(2.0, abs=0.2)
            assert outcome.note is None and "tail" not in outcome.details
        else:
            assert outcome.metrics["recovered"] is False and outcome.note == "never back"
