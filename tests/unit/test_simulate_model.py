"""The simulator's pure model: training progress with checkpoints, the seeded trace, the
configurations it compares."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from pathlib import Path

import pytest

from lazarus.domain.contracts import NodeAccess, PreflightActivityRequest
from lazarus.domain.spec import NodeSpec, PreflightSpec
from workers.simulate import watch
from workers.simulate.cli import add_command, config_from
from workers.simulate.cluster import PROBATION_COMMAND, SimCluster, fault_reported_first
from workers.simulate.model import (
    CALIBRATION,
    CALIBRATION_FILE,
    DAY_S,
    LLAMA3_CHECKPOINT_S,
    CostModel,
    TraceConfig,
    llama3_profile,
    make_trace,
    progress_at,
)
from workers.simulate.runner import SimConfig, variants
from workers.simulate.watch import (
    TEST_SERVER_NAME,
    clock_stopped,
    find_test_server,
    report_progress,
    until_done_or_overrun,
)

pytestmark = pytest.mark.timeout(30)


def test_progress_counts_steps_and_blocks_for_each_checkpoint() -> None:
    # 10 steps of 1 s, then 5 s blocked, then the checkpoint at step 10 is committed
    assert progress_at(0, 9.5, every=10, step_s=1.0, checkpoint_s=5.0).checkpoint_step is None
    p = progress_at(0, 15.0, every=10, step_s=1.0, checkpoint_s=5.0)
    assert (p.step, p.checkpoint_step, p.checkpointing_s) == (10, 10, 5.0)
    p = progress_at(10, 17.0, every=10, step_s=1.0, checkpoint_s=5.0)
    assert (p.step, p.checkpoint_step) == (22, 20)


def test_the_trace_is_seeded_and_matches_the_profile_rate() -> None:
    config = TraceConfig(nodes=2048, horizon_s=54 * DAY_S, profile=llama3_profile(8), seed=3)
    first, again = make_trace(config), make_trace(config)
    assert [(e.at_s, e.node) for e in first.events] == [(e.at_s, e.node) for e in again.events]
    expected = 4.7e-4 * 8 * 2048 * 54  # about 416, as Llama 3's 419
    assert 0.8 * expected < len(first.events) < 1.2 * expected
    assert first.lemons and first.flagged


def test_rendezvous_grows_per_rank_from_the_published_figures() -> None:
    """16,384 GPUs: the 3-node measurement plus 3.7 ms a rank (the libuv TCPStore's
    100 s and NCCL's 265 s at 98,304 ranks), 61 s; the linear model it replaced gave
    278 s, and stays selectable to reproduce the earlier figures."""
    published = CostModel(nodes=2048, step_s=10.0, checkpoint_s=LLAMA3_CHECKPOINT_S)
    assert published.rendezvous_s == pytest.approx(0.407 + 16_384 * 365 / 98_304)
    assert published.rendezvous_s == pytest.approx(61.2, abs=0.1)
    linear = CostModel(nodes=2048, step_s=10.0, checkpoint_s=20.0, rendezvous="linear")
    assert linear.rendezvous_s == pytest.approx(277.8, abs=0.1)
    assert published.startup_s < linear.startup_s
    assert SimConfig(nodes=512).costs().rendezvous_s < published.rendezvous_s
    with pytest.raises(ValueError, match="rendezvous: 'gossip' is not one of published, linear"):
        CostModel(nodes=8, step_s=1.0, checkpoint_s=1.0, rendezvous="gossip")


def test_llama3_checkpoint_cost_is_its_state_at_tectonics_sustained_rate() -> None:
    """405B parameters at 14 bytes each (5.7 TB) at 2 TB/s: 2.8 s blocked, which puts
    Daly's ceiling at Llama 3's 3.1 h MTBF at 97.8% (94.1% at the old 20 s)."""
    assert pytest.approx(2.835) == LLAMA3_CHECKPOINT_S
    config = SimConfig()
    assert config.checkpoint_s == LLAMA3_CHECKPOINT_S
    assert config.daly_ettr(config.tau_s()) == pytest.approx(0.978, abs=0.001)
    old = SimConfig(checkpoint_s=20.0)
    assert old.daly_ettr(old.tau_s()) == pytest.approx(0.941, abs=0.001)


def test_configurations_compare_fixed_auto_lemons_and_spares() -> None:
    rows = {row.name: row for row in variants(SimConfig())}
    assert {"fixed", "fixed+lemon", "auto", "auto+lemon"} <= set(rows)
    assert rows["auto+lemon"].interval_kind == "auto" and rows["auto+lemon"].lemon_exclusion
    assert {rows[f"auto+lemon spares {pct}%"].spares_pct for pct in (0, 2)} == {0, 2}
    tau = SimConfig().tau_s()
    sweep = sorted(row.interval_s for row in rows.values() if row.interval_kind == "sweep")
    assert sweep[0] < tau < sweep[-1]


def test_quick_runs_only_its_rows_and_names_unknown_ones() -> None:
    assert [row.name for row in variants(SimConfig.quick())] == list(SimConfig.quick().rows)
    with pytest.raises(ValueError, match="nope"):
        variants(SimConfig(rows=("nope",)))


async def test_a_clock_that_stands_still_is_reported_with_where_it_stopped() -> None:
    class StillCluster:
        async def now(self) -> float:
            return 4321.0

    stopped_at = await clock_stopped(StillCluster(), after_s=0.2)  # type: ignore[arg-type]
    assert stopped_at == 4321.0


async def test_a_moving_clock_is_not_reported() -> None:
    class MovingCluster:
        seconds = 0.0

        async def now(self) -> float:
            self.seconds += 100.0  # skipping ahead, as a free test server does
            return self.seconds

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(clock_stopped(MovingCluster(), after_s=0.2), timeout=1.0)  # type: ignore[arg-type]


async def test_a_clock_that_only_creeps_in_real_time_counts_as_stopped() -> None:
    # A locked test-server clock still moves at the pace of real time.
    class CreepingCluster:
        async def now(self) -> float:
            return 1000.0 + time.monotonic()

    stopped_at = await clock_stopped(CreepingCluster(), after_s=0.2)  # type: ignore[arg-type]
    assert stopped_at > 1000.0


async def test_a_clock_whose_server_stops_answering_counts_as_stopped() -> None:
    """A 54-day row's clock stopped and the watchdog said nothing for 13 minutes: a
    reading the server holds must not hold the watchdog with it."""

    class SilentCluster:
        readings = 0

        async def now(self) -> float:
            self.readings += 1
            if self.readings > 1:
                await asyncio.Event().wait()  # held by the server, forever
            return 86_400.0

    stopped_at = await asyncio.wait_for(
        clock_stopped(SilentCluster(), after_s=0.2, read_timeout_s=0.05),  # type: ignore[arg-type]
        timeout=5.0,
    )
    assert stopped_at == 86_400.0


async def test_a_long_row_reports_its_simulated_day_as_it_goes() -> None:
    class Locks:
        refused_completions, never_started = 3, 1

    class HalfwayCluster:
        horizon_s = 54 * 86_400.0
        interruptions = [object()] * 7
        locks = Locks()

        async def now(self) -> float:
            return 27 * 86_400.0

    lines: list[str] = []
    reporter = asyncio.create_task(
        report_progress(HalfwayCluster(), "auto+lemon", lines.append, every_s=0.01)  # type: ignore[arg-type]
    )
    while not lines:
        await asyncio.sleep(0.01)
    reporter.cancel()
    assert lines[0].startswith(
        "auto+lemon: day 27.0 of 54, 7 interruptions, locks given back 3 refused + 1 dropped"
    )


async def test_a_job_that_closes_as_the_clock_leaps_past_the_horizon_did_not_overrun(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A closed job holds the clock no more: it may leap past the horizon before the
    driver's next look at the job. A 54-day row that had succeeded was marked overran."""

    class LeapingCluster:
        env = None
        overran = asyncio.Event()

        async def now(self) -> float:
            return 100 * 86_400.0

    class Handle:
        id = "lazarus-sim"

    async def closed_a_moment_later(*_: object) -> str:
        await asyncio.sleep(0.2)
        return "SUCCEEDED"

    monkeypatch.setattr(watch, "job_result", closed_a_moment_later)
    cluster = LeapingCluster()
    cluster.overran.set()  # the clock is already a day past the horizon
    status, diagnosis = await until_done_or_overrun(None, Handle(), cluster)  # type: ignore[arg-type]
    assert diagnosis is None
    assert str(status) == "SUCCEEDED"


def test_the_command_line_reproduces_the_earlier_model() -> None:
    """``--checkpoint-s 20 --rendezvous linear`` is the model of the figures before;
    an unknown model is refused by name before anything starts."""
    parser = argparse.ArgumentParser()
    add_command(parser.add_subparsers())
    args = parser.parse_args(["simulate", "--checkpoint-s", "20", "--rendezvous", "linear"])
    config = config_from(args)
    assert (config.checkpoint_s, config.rendezvous) == (20.0, "linear")
    assert config_from(parser.parse_args(["simulate"])).rendezvous == "published"
    with pytest.raises(SystemExit):
        parser.parse_args(["simulate", "--rendezvous", "gossip"])
    # Without repairs, as before: nodes come back only when the operator is paged.
    assert config_from(parser.parse_args(["simulate", "--repair-h", "inf"])).repair_h == math.inf
    with pytest.raises(ValueError, match="--repair-h"):
        config_from(parser.parse_args(["simulate", "--repair-h", "0"]))
    # The product's default hang timeout, instead of the simulated spec's 300 s.
    assert config_from(parser.parse_args(["simulate", "--no-hand-back"])).hand_back is False
    default_hang = config_from(parser.parse_args(["simulate", "--hang-timeout-s", "60"]))
    assert default_hang.hang_timeout_s == 60.0
    assert default_hang.costs(hang_timeout_s=60.0).detection_s("hang") == 60.5


def test_a_fault_after_the_first_step_is_reported_after_it() -> None:
    """The first step is reported before a later fault, so the workflow sends the new
    generation its tuned interval; a fault during start-up is reported at once."""
    assert not fault_reported_first(fault_at=500.0, first_step_at=100.0)
    assert fault_reported_first(fault_at=50.0, first_step_at=100.0)
    assert fault_reported_first(fault_at=500.0, first_step_at=None)


async def test_a_broken_node_passes_probation_only_once_repaired_and_probation_is_free() -> None:
    """Probation rounds run beside the job: they neither move its clock nor count as
    its preflight; a node fails them until its repair is done."""
    config = SimConfig.quick()
    trace = make_trace(TraceConfig(nodes=4, horizon_s=DAY_S, profile=llama3_profile(8)))

    class Clock(SimCluster):
        at = 0.0

        async def now(self) -> float:
            return self.at

    cluster = Clock(None, trace, config.costs(), DAY_S, 1800.0, repair_s=3600.0)  # type: ignore[arg-type]
    cluster._break("n1", 100.0)
    request = PreflightActivityRequest(
        access=NodeAccess(nodes=[NodeSpec(name="n1")]),
        checks=PreflightSpec(health_command=PROBATION_COMMAND),
        interpreter=PROBATION_COMMAND[0],
        workdir="/tmp",
        disk_path="/tmp",
    )
    for at, healthy in ((200.0, False), (3700.0, True)):
        cluster.at = at
        report = await SimCluster.preflight.__wrapped__(cluster, request)  # type: ignore[attr-defined]
        assert report.nodes[0].ok is healthy
    assert cluster.ledger.phases == {}


def test_every_calibrated_cost_is_the_measured_median_it_names() -> None:
    """The mapping measured figure -> simulator parameter is the file's, number for number."""
    repo = Path(__file__).resolve().parents[2]
    summary = json.loads((repo / CALIBRATION_FILE).read_text())["summary"]["node_loss"]
    medians = summary.get("lazarus", summary)
    for name, calibrated in CALIBRATION.items():
        total = 0.0
        for metric in calibrated.measured:
            sign = -1.0 if metric.startswith("-") else 1.0
            total += sign * medians[metric.lstrip("-")]["stats"]["median"]
        assert calibrated.seconds == pytest.approx(total, abs=0.001), name
        assert calibrated.feeds, name


def test_the_test_server_is_found_wherever_the_current_directory_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30: a worktree without its own .venv found no server."""
    monkeypatch.chdir(tmp_path)
    found = find_test_server()
    assert found is not None and found.name == TEST_SERVER_NAME and found.is_absolute()
