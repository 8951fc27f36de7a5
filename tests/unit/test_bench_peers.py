"""Issue 30, wiring: the peers (NVRx ft_launcher, NVRx in-process, torchft) in
``python -m bench compare``: their command lines, their settings in the results
file, the reason each gives for a scenario it does not run, and the NVRx
installer's idempotence. Nothing here starts a process; the smoke test of a real
run is tests/e2e/test_bench_peers_smoke.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from bench import catalog
from bench.__main__ import build_parser
from bench.harness import BenchConfig, BenchContext
from bench.jobs import JobShape
from bench.peers import scenarios as peer_scenarios
from bench.peers.jobs import MemberJob, MemberPoint, NvrxLauncherJob
from bench.peers.settings import NvrxSettings, TorchftSettings, peer_settings
from bench.peers.soak import EPOCH, MemberDriver
from bench.soak import PEER_SOAKS
from bench.systems import PEER_SYSTEMS, SOAK_SYSTEMS, SYSTEMS
from infra import install_nvrx


def _ctx(tmp_path: Path, config: BenchConfig | None = None) -> BenchContext:
    return BenchContext(cast(Any, None), cast(Any, None), config or BenchConfig(), tmp_path)


def test_the_peers_are_systems_of_compare_and_run_crash_and_hang() -> None:
    assert set(PEER_SYSTEMS) <= set(SYSTEMS)
    assert set(PEER_SYSTEMS) <= set(SOAK_SYSTEMS)
    assert set(PEER_SOAKS) == set(PEER_SYSTEMS), "every peer plays the soak"
    args = build_parser().parse_args(
        ["compare", "--systems", "lazarus,nvrx,nvrx_inprocess,torchft", "--scenarios", "crash"]
    )
    assert args.systems == ["lazarus", "nvrx", "nvrx_inprocess", "torchft"]
    scenarios = catalog.load()
    for system in PEER_SYSTEMS:
        assert scenarios["crash"].runner(system) is not None, system
        assert scenarios["hang"].runner(system) is not None, system
        # Every other scenario of compare gives a reason, never a blank cell.
        for name in ("clean", "controller_crash", "straggler", "node_loss", "pause_resume"):
            reason = scenarios[name].not_possible.get(system)
            assert reason and reason.startswith(("not possible", "not measured")), (name, system)


def test_ft_launcher_runs_the_example_with_nvrx_heartbeats_and_short_timeouts(
    tmp_path: Path,
) -> None:
    ctx = _ctx(tmp_path)
    paths = ctx._paths("nvrx", "crash", 0)
    settings = NvrxSettings.for_shape(ctx.shape)
    job = NvrxLauncherJob(
        example_args=ctx.example_args(paths),
        log_path=paths.root / "log",
        max_restarts=settings.max_restarts,
        monitor_interval_s=settings.monitor_interval_s,
        settings=settings,
    )
    argv = job.command()
    assert argv[1:3] == ["-m", "nvidia_resiliency_ext.fault_tolerance.launcher"]
    assert "--standalone" in argv and argv[argv.index("--max-restarts") + 1] == "3"
    assert argv[argv.index("--ft-rank-heartbeat-timeout") + 1] == str(ctx.shape.hang_timeout_s)
    assert argv[argv.index("--monitor-interval") + 1] == "0.5"
    script = argv.index(str(peer_scenarios.PEERS_DIR / "nvrx_train.py"))
    # The example's own arguments follow the wrapper script unchanged.
    assert argv[script + 1 :] == ctx.example_args(paths)[1:]
    assert job.env()["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_nvrx_in_process_starts_two_ranks_and_a_spare_without_local_rank(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    members = peer_scenarios.inprocess_members(ctx, ctx._paths("nvrx-inprocess", "crash", 0))
    assert [m.name for m in members] == ["rank0", "rank1", "rank2"]
    for rank, member in enumerate(members):
        assert member.env["RANK"] == str(rank) and member.env["WORLD_SIZE"] == "3"
        assert "LOCAL_RANK" not in member.env
        assert member.argv[2].endswith("nvrx_inprocess_train.py")
        settings = json.loads(member.env["BENCH_NVRX_INPROCESS"])
        assert settings["active_world_size"] == 2
        assert settings["soft_timeout_s"] == ctx.shape.hang_timeout_s
    assert len({m.env["MASTER_PORT"] for m in members}) == 1


def test_torchft_runs_a_lighthouse_and_one_torchrun_per_group(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    members = peer_scenarios.torchft_members(ctx, ctx._paths("torchft", "crash", 0))
    lighthouse, *groups = members
    assert lighthouse.argv[0].endswith("torchft_lighthouse")
    assert lighthouse.argv[lighthouse.argv.index("--heartbeat_timeout_ms") + 1] == "1000"
    assert lighthouse.argv[lighthouse.argv.index("--min_replicas") + 1] == "1"
    assert [g.name for g in groups] == ["group0", "group1"]
    for group, member in enumerate(groups):
        assert member.rank_is_child
        assert member.env["REPLICA_GROUP_ID"] == str(group)
        assert member.env["TORCHFT_LIGHTHOUSE"].startswith("http://127.0.0.1:")
        argv = member.argv
        assert argv[argv.index("--max-restarts") + 1] == "3"
        assert argv[argv.index("--nproc-per-node") + 1] == "1"
        # The same job: steps, step time, checkpoint interval.
        assert argv[argv.index("--steps") + 1] == str(ctx.shape.steps)
        assert argv[argv.index("--step-time") + 1] == str(ctx.shape.step_time_s)
        assert argv[argv.index("--ckpt-every") + 1] == str(ctx.shape.ckpt_every)


def test_results_record_each_peers_version_and_settings() -> None:
    shape = JobShape.quick()
    recorded = peer_settings(["lazarus", "nvrx", "nvrx_inprocess", "torchft"], shape)
    assert set(recorded) == {"nvrx", "nvrx_inprocess", "torchft"}
    assert recorded["nvrx"]["rank_heartbeat_timeout_s"] == shape.hang_timeout_s
    assert recorded["nvrx_inprocess"]["processes"] == 3
    assert recorded["torchft"]["heartbeat_timeout_ms"] == TorchftSettings().heartbeat_timeout_ms
    assert all("version" in settings for settings in recorded.values())
    assert "comm_hook" in recorded["torchft"]  # the one behavioural change, said
    assert peer_settings(["lazarus", "torchrun"], shape) == {}
    json.dumps(recorded)  # JSON-ready


def test_install_nvrx_does_nothing_when_the_pinned_version_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(install_nvrx, "site_packages", lambda: tmp_path)
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(install_nvrx, "pip", lambda *args: calls.append(args))
    target = install_nvrx.target_dir()
    (target / f"nvidia_resiliency_ext-{install_nvrx.VERSION}.dist-info").mkdir(parents=True)
    (tmp_path / install_nvrx.PTH_NAME).write_text(f"{target}\n")
    assert "already installed" in install_nvrx.install()
    assert calls == []
    assert install_nvrx.installed_version(target) == install_nvrx.VERSION
    assert len(install_nvrx.SHA256) == 64


def test_install_nvrx_refuses_a_wheel_with_another_checksum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(install_nvrx, "site_packages", lambda: tmp_path)

    def pip(*args: str) -> None:
        if args[0] == "download":
            dest = Path(args[args.index("--dest") + 1])
            (dest / install_nvrx.WHEEL).write_bytes(b"not the wheel")
        else:
            raise AssertionError(f"installed after a bad checksum: {args}")

    monkeypatch.setattr(install_nvrx, "pip", pip)
    with pytest.raises(SystemExit, match="sha256"):
        install_nvrx.install()
    assert not (tmp_path / install_nvrx.PTH_NAME).exists()


def test_torchft_figures_tell_the_survivors_first_step_from_the_rejoin(tmp_path: Path) -> None:
    """Fault at t=100 after step 50: the survivor discards step 51, commits it at
    t=101.5; the killed group's new process heals and commits step 70 at t=104."""
    job = MemberJob([], tmp_path / "log")
    job.points = [
        MemberPoint(99.0, "group0", 1, 50),
        MemberPoint(99.1, "group1", 1, 50),
        MemberPoint(100.5, "group0", 1, 51, committed=False),
        MemberPoint(101.5, "group0", 1, 51),
        MemberPoint(104.0, "group1", 2, 70),
    ]
    figures = peer_scenarios.torchft_figures(job, "group1", "group0", 100.0, 50, 1)
    assert figures["survivors_first_step_s"] == pytest.approx(1.5)
    assert figures["recovery_outside_s"] == pytest.approx(4.0)
    assert figures["recovered"] is True and figures["steps_lost"] == 1
    # A group back only after the survivor finished starts alone from step 0: no rejoin.
    job.points[-1] = MemberPoint(104.0, "group1", 2, 1)
    late = peer_scenarios.torchft_figures(job, "group1", "group0", 100.0, 50, 1)
    assert late["recovered"] is False and late["recovery_outside_s"] is None


def _torchft_driver(tmp_path: Path, points: list[MemberPoint]) -> MemberDriver:
    job = MemberJob([], tmp_path / "log")
    job.points = points
    job.ups = [(0.0, "group0", 1), (0.0, "group1", 1), (5.0, "group1", 2)]
    return MemberDriver("torchft", job, list, lambda _, f: f"group{f.rank}", "lighthouse", 2)


def test_the_torchft_soak_counts_a_step_once_every_group_committed_it(tmp_path: Path) -> None:
    """Survivors training alone are not the whole job: a step counts when the last
    group commits it, and the generation grows when any group restarts."""
    points = [
        MemberPoint(1.0, "group0", 1, 1),
        MemberPoint(1.1, "group1", 1, 1),
        MemberPoint(2.0, "group0", 1, 2),  # group1 died: group0 alone
        MemberPoint(3.0, "group0", 1, 3),
        MemberPoint(3.5, "group0", 1, 4, committed=False),
        MemberPoint(6.0, "group1", 2, 3),  # group1 healed and back
        MemberPoint(6.1, "group0", 1, 4),
        MemberPoint(6.2, "group1", 2, 4),
    ]
    driver = _torchft_driver(tmp_path, points)
    counted = [(p.t, p.generation, p.step) for p in driver.trace().sorted_points()]
    assert counted == [(1.1, 2, 1), (6.0, 3, 3), (6.2, 3, 4)]
    assert [p.step for p in driver.trace(full_world=False).sorted_points()] == [1, 1, 2, 3, 3, 4, 4]
    assert driver.generation_step() == (3, 4)


def test_an_operator_restart_starts_a_later_generation(tmp_path: Path) -> None:
    driver = _torchft_driver(tmp_path, [MemberPoint(1.0, "group0", 1, 1)])
    assert driver.generation_at(1.0) == 2
    driver.restarts.append(2.0)
    assert driver.generation_at(3.0) == EPOCH + 2
