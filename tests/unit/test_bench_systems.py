"""Issue 12, bench side: two Lazarus systems side by side with torchrun.

``lazarus`` runs the recommended fast setup (warm starts from a zygote, the memory
checkpoint tier, the disk interval set by the controller), ``lazarus_cold`` the
spec's defaults; both run the one Lazarus script of each scenario, from the one
registry, and the side-by-side table shows both beside torchrun."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from bench import catalog, registry, report
from bench.__main__ import build_parser
from bench.harness import BenchConfig, BenchContext, BenchRun, Plan, RunRecord, _merged
from bench.jobs import JobPaths, JobShape, build_spec
from bench.registry import runs, scenario
from bench.systems import LAZARUS_SETUPS, SYSTEMS, System


def test_both_lazarus_systems_run_the_one_lazarus_script() -> None:
    scenarios = catalog.load()
    assert {"lazarus", "lazarus_cold"} <= set(SYSTEMS)
    for name, sc in scenarios.items():
        assert sc.runner("lazarus_cold") is sc.run, name
    with pytest.raises(ValueError, match="register the Lazarus script as 'lazarus'"):
        runs(scenario("test_systems_only", "A test.\n\n1. nothing"), "lazarus_cold")
    del registry.SCENARIOS["test_systems_only"]


def test_systems_flag_accepts_lazarus_cold() -> None:
    args = build_parser().parse_args(
        ["compare", "--systems", "lazarus,lazarus_cold,torchrun", "--scenarios", "crash,hang"]
    )
    assert args.systems == ["lazarus", "lazarus_cold", "torchrun"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compare", "--systems", "lazarus_warm"])


def test_the_fast_setup_is_warm_start_and_the_memory_tier_and_cold_is_the_defaults(
    tmp_path: Path,
) -> None:
    shape = JobShape()
    fast = LAZARUS_SETUPS["lazarus"].spec_fields(shape)
    assert fast == {
        "warm_start": {"preload": ["torch"], "standby": 1},
        "checkpoints": {"memory_every_steps": 1, "every_steps": shape.ckpt_every},
    }
    assert LAZARUS_SETUPS["lazarus_cold"].spec_fields(shape) == {}
    # The fields are the spec's own: a job built with them parses, and says so.
    spec = build_spec("fast", JobPaths(tmp_path), shape, extra=fast)
    assert spec.warm is not None and spec.warm.preload == ["torch"] and spec.warm.standby == 1
    assert spec.checkpoints.memory_every_steps == 1
    assert spec.checkpoints.every_steps == shape.ckpt_every
    cold = build_spec("cold", JobPaths(tmp_path), shape)
    assert cold.warm is None and cold.checkpoints.memory_every_steps is None


def test_a_scenarios_checkpoint_settings_merge_with_the_setups() -> None:
    setup = LAZARUS_SETUPS["lazarus"].spec_fields(JobShape())
    merged = _merged(setup, {"checkpoints": {"keep_local": 5}, "recovery": {"max_restarts": 9}})
    assert merged["checkpoints"] == {"memory_every_steps": 1, "every_steps": 20, "keep_local": 5}
    assert merged["recovery"] == {"max_restarts": 9}
    assert merged["warm_start"] == setup["warm_start"]


def test_a_run_of_each_system_gets_its_setup_and_shares_the_cleanup_records() -> None:
    ctx = BenchContext(cast(Any, None), cast(Any, None), BenchConfig.quick(), Path("/nowhere"))
    assert ctx.setup is LAZARUS_SETUPS["lazarus"]
    cold = ctx.under("lazarus_cold")
    assert cold.setup is LAZARUS_SETUPS["lazarus_cold"] and ctx.setup is LAZARUS_SETUPS["lazarus"]
    assert ctx.under("torchrun").setup is LAZARUS_SETUPS["lazarus"]
    # What a run under one system starts, the invocation's cleanup still finds.
    cold.run_roots["job"] = Path("/nowhere/job")
    assert ctx.run_roots == {"job": Path("/nowhere/job")}
    assert cold.watched is ctx.watched and cold.resources is ctx.resources


def _compare(per_system: dict[System, float]) -> BenchRun:
    run = BenchRun(
        config=BenchConfig.quick(),
        plan=Plan(scenarios=["crash"], systems=list(per_system), repeats=1),
        started_at=0.0,
    )
    run.records = [
        RunRecord("crash", 0, 0.0, 1.0, {"recovery_outside_s": v, "weights_ok": True}, {}, system=s)
        for s, v in per_system.items()
    ]
    return run


def test_the_table_shows_fast_and_cold_beside_torchrun_with_ratios() -> None:
    run = _compare({"lazarus": 2.0, "lazarus_cold": 6.0, "torchrun": 5.0})
    table = report.compare_table(report.summary(run))
    lines = table.splitlines()
    assert lines[0] == (
        "| scenario | metric | Lazarus | torchrun | Lazarus/torchrun | Lazarus (cold) "
        "| cold/torchrun | torchrun (default setup) |"
    )
    assert "| crash | recovery_outside_s | 2 | 5 | 0.40 | 6 | 1.20 |  |" in lines
    # Without lazarus_cold the table keeps its old columns.
    plain = report.compare_table(report.summary(_compare({"lazarus": 2.0, "torchrun": 5.0})))
    assert plain.startswith("| scenario | metric | Lazarus | torchrun | Lazarus/torchrun |")
    assert "cold" not in plain
    data = report.payload(run, report.summary(run), "compare")
    assert data["config"]["lazarus_setups"]["lazarus_cold"] == {}
    assert "warm_start" in data["config"]["lazarus_setups"]["lazarus"]


def test_preload_flag_sets_the_fast_setups_preload_and_refuses_bad_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.__main__ import _config

    args = build_parser().parse_args(["compare", "--preload", "torch,torch._dynamo"])
    config = _config(args)
    assert config.warm_preload == ("torch", "torch._dynamo")
    fields = LAZARUS_SETUPS["lazarus"].spec_fields(config.shape, config.warm_preload)
    assert fields["warm_start"] == {"preload": ["torch", "torch._dynamo"], "standby": 1}
    assert _config(build_parser().parse_args(["compare"])).warm_preload == ("torch",)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compare", "--preload", "torch,not-a-module"])
    assert "warm_start.preload" in capsys.readouterr().err


# --------------------------------------------------------------------------- multi-node


def test_the_multinode_scenarios_run_under_lazarus_and_torchrun_on_four_ranks() -> None:
    from bench.scenarios_multinode_compare import WORLD_SIZE

    scenarios = catalog.load()
    for name in ("multinode_crash", "multinode_node_loss"):
        sc = scenarios[name]
        assert sc.run is not None and "torchrun" in sc.others, name
        assert sc.unavailable is not None, name  # skipped, with the reason, without root
        assert sc.references(JobShape()) == [(WORLD_SIZE, JobShape().steps)], name
        assert name in report.HEADLINE, name
    args = build_parser().parse_args(
        [
            "compare",
            "--scenarios",
            "multinode_crash,multinode_node_loss",
            "--systems",
            "lazarus,torchrun",
        ]
    )
    assert args.scenarios == ["multinode_crash", "multinode_node_loss"]


def test_a_multinode_torchrun_agent_meets_the_others_through_c10d_on_the_first_host() -> None:
    from bench.torchrun import GATED_AGENT, Rendezvous, TorchrunJob

    job = TorchrunJob(
        ["train.py"],
        Path("/nowhere/torchrun.log"),
        rendezvous=Rendezvous("10.0.0.11:29400", "bench-x", "1:2", ("keep_alive_interval=1",)),
    )
    first = job.command("10.0.0.11", is_host=True)
    assert "--standalone" not in first
    flags = dict(zip(first[3:-1:2], first[4:-1:2], strict=False))
    assert flags["--nnodes"] == "1:2" and flags["--rdzv-backend"] == "c10d"
    assert flags["--rdzv-endpoint"] == "10.0.0.11:29400" and flags["--local-addr"] == "10.0.0.11"
    assert flags["--rdzv-conf"] == "is_host=true,keep_alive_interval=1"
    assert "is_host=false,keep_alive_interval=1" in job.command("10.0.0.12")
    assert job.env()["LOGLEVEL"] == "INFO"
    # The standby's gate runs the launcher's module (torch.distributed.run here) as -m.
    assert "runpy.run_module(module, run_name='__main__'" in GATED_AGENT
    single = TorchrunJob(["train.py"], Path("/nowhere/torchrun.log"))
    assert "--standalone" in single.command() and "LOGLEVEL" not in single.env()


def test_a_multinode_generation_starts_when_a_rank_number_comes_again() -> None:
    from bench.torchrun import RankProcess, Rendezvous, TorchrunJob

    job = TorchrunJob(["train.py"], Path("/nowhere/log"), rendezvous=Rendezvous("h:1", "r", "2"))
    seen: list[int] = []
    # Two agents' first workers, then (a restart) the same ranks again from either
    # agent, whatever its own restart count (a standby's is 0).
    for agent, rank, restarts in [(1, 0, 0), (1, 1, 0), (2, 2, 0), (2, 3, 0), (2, 2, 1), (3, 0, 0)]:
        env = {"RANK": str(rank), "TORCHELASTIC_RESTART_COUNT": str(restarts)}
        generation = job._generation_of(agent, env)
        job.ranks.append(RankProcess(100 + len(seen), 0, rank, generation, 0.0, agent))
        seen.append(generation)
    assert seen == [1, 1, 1, 1, 2, 2]


def test_lazarus_asks_for_rejoin_on_ssh_nodes_and_falls_back_when_the_spec_refuses(
    tmp_path: Path,
) -> None:
    from bench.scenarios_multinode import ssh_builder
    from bench.scenarios_multinode_compare import NODE_LOSS_LAYOUT
    from infra.testhosts import TestHost, TestHosts

    hosts = TestHosts(3, tmp_path / "hosts")
    hosts.hosts = [TestHost(f"h{i}", f"ns{i}", f"10.0.0.1{i}", 22, "eth0") for i in range(1, 4)]
    ctx = BenchContext(cast(Any, None), cast(Any, None), BenchConfig(), tmp_path)
    build, setup = ssh_builder(ctx, hosts, NODE_LOSS_LAYOUT, rejoin=True)
    spec = build("bench-mn", JobPaths(tmp_path / "job"))
    assert setup.rejoin_asked
    assert [n.name for n in spec.nodes] == ["h1", "h2"] and [n.name for n in spec.spares] == ["h3"]
    assert spec.nproc_per_node == 2 and spec.world_size == 4
    assert spec.warm is not None and spec.checkpoints.memory_every_steps == 1
    assert spec.env["GLOO_SOCKET_IFNAME"] == "eth0" and spec.env["OMP_NUM_THREADS"] == "1"
    assert "--pg-timeout-s" in spec.command  # the command line torchrun runs
    if setup.rejoin_used:  # the spec takes rejoin on ssh nodes
        assert spec.rejoin is not None and "--resilient" in spec.command
    else:
        assert setup.rejoin_refused and "rejoin" in setup.rejoin_refused
        assert spec.rejoin is None and "--resilient" not in spec.command
    cold = ctx.under("lazarus_cold")
    build, setup = ssh_builder(cold, hosts, NODE_LOSS_LAYOUT, rejoin=False)
    spec = build("bench-mn-cold", JobPaths(tmp_path / "cold"))
    assert not setup.rejoin_asked and spec.rejoin is None and spec.warm is None
