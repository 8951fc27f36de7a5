"""``python -m bench scale``: how far one controller goes, over 100 to 2,000 simulated nodes.

The nodes are :mod:`activities.nodes.simulated.agent` nodes (each call sleeps
``--round-trip-ms``), so what is measured is the controller alone: the real
``supervise`` activity, run by a real worker against a real Temporal dev server, driven
by a probe workflow that calls it as ``JobWorkflow`` does in a healthy generation. Per
node count: the worker's CPU per wall second (total and per node) over a fault-free
window; crash and silent-node detection latency, p50 and p99, from the bench's
injection to the failed ``SuperviseOutcome`` in the workflow (``*_e2e_*``) and to the
supervisor's observation (``*_detect_*``); history events and bytes per progress report
and events per hour. Figures and reading: docs/results/2026-12-scale-one-controller.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.nodes.simulated.agent import SimulatedCluster, simulate
from activities.supervise import supervise
from bench import costs
from bench.costs import progress, results_path, write_results
from bench.harness import wait_until
from lazarus.app.devserver import DevServer
from lazarus.domain.contracts import NodeAccess, SuperviseOutcome, SuperviseRequest
from lazarus.domain.spec import HealthSpec, NodeSpec

DEFAULT_NODES = (100, 500, 1000, 2000)
DEFAULT_REPORT_INTERVAL_S = HealthSpec().report_interval_s
TRIAL_TIMEOUT_S = 60.0
"""A fault not detected this long after injection fails the trial (and is reported)."""


# --------------------------------------------------------------------------- the probe


class ProbeResult(BaseModel):
    outcome: SuperviseOutcome
    received_at: float
    """Workflow time of the task that received the outcome (the server's clock)."""
    reports: int
    """Progress reports before it (each one supervise activity)."""


@workflow.defn(name="lazarus-scale-probe")
class ScaleProbe:
    """Supervision as ``JobWorkflow`` runs it in a healthy generation: the supervise
    activity again after every progress report, until anything else comes back."""

    @workflow.run
    async def run(self, request: SuperviseRequest) -> ProbeResult:
        reports = 0
        while True:
            outcome = await workflow.execute_activity(
                supervise,
                request,
                start_to_close_timeout=timedelta(seconds=request.report_after_s + 600),
                heartbeat_timeout=timedelta(seconds=request.health.supervisor_heartbeat_timeout_s),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
            if outcome.kind != "progress":
                return ProbeResult(
                    outcome=outcome, received_at=workflow.now().timestamp(), reports=reports
                )
            reports += 1


# --------------------------------------------------------------------------- the bench


@dataclass(frozen=True)
class ScaleConfig:
    nodes: tuple[int, ...] = DEFAULT_NODES
    ranks_per_node: int = 8
    seconds_per_step: float = 1.0
    """Each simulated rank's step time: a rank whose heartbeat did not change since
    the last poll costs the supervisor almost nothing."""
    trials: int = 20
    """Faults of each kind per node count."""
    poll_interval_s: float = HealthSpec().poll_interval_s
    node_timeout_s: float = 1.0
    round_trip_ms: float = 1.0
    silent_poll_s: float = 0.5
    steady_s: float = 20.0
    report_interval_s: float = 5.0
    seed: int = 1


TUNABLE = tuple(f.name for f in fields(ScaleConfig) if f.name not in ("nodes", "poll_interval_s"))
"""The :class:`ScaleConfig` fields ``python -m bench scale`` takes as flags."""
HELP = {"trials": "faults of each kind per node count"}


@dataclass
class SizeResult:
    nodes: int
    ranks: int
    cpu_cores: float
    cpu_ms_per_s_per_node: float
    idle_cpu_cores: float
    crash_e2e_s: list[float] = field(default_factory=list)
    crash_detect_s: list[float] = field(default_factory=list)
    silent_e2e_s: list[float] = field(default_factory=list)
    silent_detect_s: list[float] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    """Trials whose fault was not reported as expected, with what came back."""
    history_events_per_report: float = 0.0
    history_bytes_per_report: float = 0.0
    history_events_per_hour: float = 0.0
    history_events_per_hour_default: float = 0.0
    poll_round_s: float = 0.0
    """Wall seconds per poll round in the steady window (polls of node 0)."""

    def figures(self) -> dict[str, float | int | None]:
        return {
            "nodes": self.nodes,
            "ranks": self.ranks,
            "cpu_cores": round(self.cpu_cores, 3),
            "cpu_ms_per_s_per_node": round(self.cpu_ms_per_s_per_node, 4),
            "idle_cpu_cores": round(self.idle_cpu_cores, 3),
            "poll_round_s": round(self.poll_round_s, 3),
            "crash_e2e_p50_s": percentile(self.crash_e2e_s, 50),
            "crash_e2e_p99_s": percentile(self.crash_e2e_s, 99),
            "crash_detect_p50_s": percentile(self.crash_detect_s, 50),
            "crash_detect_p99_s": percentile(self.crash_detect_s, 99),
            "silent_e2e_p50_s": percentile(self.silent_e2e_s, 50),
            "silent_e2e_p99_s": percentile(self.silent_e2e_s, 99),
            "silent_detect_p50_s": percentile(self.silent_detect_s, 50),
            "silent_detect_p99_s": percentile(self.silent_detect_s, 99),
            "history_events_per_report": round(self.history_events_per_report, 2),
            "history_bytes_per_report": round(self.history_bytes_per_report),
            "history_events_per_hour": round(self.history_events_per_hour),
            "history_events_per_hour_default": round(self.history_events_per_hour_default),
            "missed": len(self.missed),
        }


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile (p99 of 20 samples is the largest): None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, int(-(-pct * len(ordered) // 100)) - 1))
    return round(ordered[index], 3)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Size:
    """One node count: its cluster, its nodes, and a fresh generation per probe."""

    def __init__(self, config: ScaleConfig, count: int, run_root: Path) -> None:
        self.config = config
        self.names = [f"sim-{i:05d}" for i in range(count)]
        self.nodes = [NodeSpec(name=name) for name in self.names]
        self.cluster = SimulatedCluster(
            self.names,
            seconds_per_step=config.seconds_per_step,
            round_trip_s=config.round_trip_ms / 1000,
            silent_poll_s=config.silent_poll_s,
        )
        self.run_root = run_root / f"n{count}"
        self.generation = 0

    def launch(self, report_after_s: float) -> SuperviseRequest:
        """A new generation on every node (what a launch leaves behind)."""
        self.generation += 1
        gen_dir = self.run_root / f"gen-{self.generation:05d}"
        gen_dir.mkdir(parents=True)
        (gen_dir / "launch.json").write_text(json.dumps({"launched_at": time.time()}))
        per_node = self.config.ranks_per_node
        for index, name in enumerate(self.names):
            ranks = list(range(index * per_node, (index + 1) * per_node))
            self.cluster.start(str(gen_dir), name, ranks)
        return SuperviseRequest(
            job_id=f"scale-{len(self.names)}",
            generation=self.generation,
            run_dir=str(gen_dir),
            world_size=len(self.names) * per_node,
            nproc_per_node=per_node,
            health=HealthSpec(poll_interval_s=self.config.poll_interval_s),
            report_after_s=report_after_s,
            access=NodeAccess(nodes=self.nodes),
            node_timeout_s=self.config.node_timeout_s,
        )

    def total_polls(self) -> int:
        return sum(self.cluster.polls(name) for name in self.names)


async def _start_probe(
    client: Client, queue: str, request: SuperviseRequest
) -> WorkflowHandle[ScaleProbe, ProbeResult]:
    return await client.start_workflow(
        ScaleProbe.run, request, id=f"scale-probe-{uuid.uuid4().hex[:10]}", task_queue=queue
    )


async def _history(client: Client, workflow_id: str) -> tuple[int, int, int]:
    """(events, bytes, supervise activities scheduled) of one probe run."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    scheduled = sum(
        1 for e in history.events if e.HasField("activity_task_scheduled_event_attributes")
    )
    size = sum(e.ByteSize() for e in history.events)
    return len(history.events), size, scheduled


async def _steady(client: Client, queue: str, size: _Size, result: SizeResult) -> None:
    """No fault for ``steady_s``: CPU, poll rate and history per report; a crash ends it."""
    config = size.config
    request = size.launch(report_after_s=config.report_interval_s)
    handle = await _start_probe(client, queue, request)
    count = len(size.names)
    if not await wait_until(lambda: size.total_polls() >= 2 * count, TRIAL_TIMEOUT_S, 0.02):
        raise RuntimeError(f"{count} nodes: supervision did not poll every node twice in time")
    polls0, wall0, cpu0 = size.cluster.polls(size.names[0]), time.monotonic(), _cpu_s()
    await asyncio.sleep(config.steady_s)
    wall, cpu = time.monotonic() - wall0, _cpu_s() - cpu0
    rounds = size.cluster.polls(size.names[0]) - polls0
    result.cpu_cores = cpu / wall
    result.cpu_ms_per_s_per_node = 1000 * result.cpu_cores / count
    result.poll_round_s = wall / rounds if rounds else float("inf")
    size.cluster.crash(request.run_dir, size.names[0], 0)
    probe: ProbeResult = await asyncio.wait_for(handle.result(), TRIAL_TIMEOUT_S)
    events, nbytes, activities = await _history(client, handle.id)
    # Per report: what one more supervise activity (and its workflow task) adds.
    # Fixed: the start and its workflow task (4 events) and the completion (1).
    start_events = 5
    reports = max(1, activities)
    per_report = result.history_events_per_report = (events - start_events) / reports
    result.history_bytes_per_report = nbytes / reports
    result.history_events_per_hour = per_report * 3600 / config.report_interval_s
    result.history_events_per_hour_default = per_report * 3600 / DEFAULT_REPORT_INTERVAL_S
    progress(
        f"  steady: {result.cpu_cores:.3f} cores, round {result.poll_round_s:.3f} s, "
        f"{probe.reports} reports, {result.history_events_per_report:.1f} events/report"
    )
    size.cluster.forget(request.run_dir)


async def _trial(
    client: Client, queue: str, size: _Size, kind: str, rng: random.Random, result: SizeResult
) -> None:
    """One fault on a random node of a fresh generation, injected at a random moment
    of the poll cycle once every node was polled twice."""
    request = size.launch(report_after_s=3600.0)
    handle = await _start_probe(client, queue, request)
    count = len(size.names)
    polls = size.total_polls()
    if not await wait_until(lambda: size.total_polls() >= polls + 2 * count, TRIAL_TIMEOUT_S, 0.02):
        raise RuntimeError(f"{count} nodes: supervision did not poll every node twice in time")
    await asyncio.sleep(rng.uniform(0, size.config.poll_interval_s))
    victim = rng.randrange(count)
    node = size.names[victim]
    if kind == "crash":
        rank = victim * size.config.ranks_per_node
        injected = size.cluster.crash(request.run_dir, node, rank)
        expected = "crash"
    else:
        injected = size.cluster.silence(node)
        expected = "node_lost"
    try:
        probe: ProbeResult = await asyncio.wait_for(handle.result(), TRIAL_TIMEOUT_S)
    finally:
        size.cluster.heal(node)
    failure = probe.outcome.failure
    if failure is None or failure.kind != expected or failure.node != node:
        seen = "no failure" if failure is None else f"{failure.kind} on {failure.node}"
        result.missed.append(f"{kind} on {node}: got {probe.outcome.kind}, {seen}")
    else:
        e2e = probe.received_at - injected
        detect = failure.detected_at - injected
        (result.crash_e2e_s if kind == "crash" else result.silent_e2e_s).append(e2e)
        (result.crash_detect_s if kind == "crash" else result.silent_detect_s).append(detect)
    size.cluster.forget(request.run_dir)


async def _measure_size(
    client: Client, queue: str, config: ScaleConfig, count: int, work: Path
) -> SizeResult:
    size = _Size(config, count, work)
    with simulate(size.cluster):
        cpu0, wall0 = _cpu_s(), time.monotonic()
        await asyncio.sleep(2.0)
        idle = (_cpu_s() - cpu0) / (time.monotonic() - wall0)
        result = SizeResult(
            nodes=count,
            ranks=count * config.ranks_per_node,
            cpu_cores=0.0,
            cpu_ms_per_s_per_node=0.0,
            idle_cpu_cores=idle,
        )
        await _steady(client, queue, size, result)
        rng = random.Random(config.seed * 100_003 + count)
        for trial in range(config.trials):
            for kind in ("crash", "silent"):
                await _trial(client, queue, size, kind, rng, result)
            progress(f"  trial {trial + 1}/{config.trials} done")
    return result


async def measure(config: ScaleConfig, work: Path) -> list[SizeResult]:
    """Every node count, one dev server and one worker for all of them."""
    with DevServer(work / "temporal", headless=True) as server:
        client = await Client.connect(server.address, data_converter=pydantic_data_converter)
        queue = f"scale-{uuid.uuid4().hex[:8]}"
        worker = Worker(
            client,
            task_queue=queue,
            workflows=[ScaleProbe],
            activities=[supervise],
            workflow_runner=UnsandboxedWorkflowRunner(),
            max_concurrent_activities=8,
        )
        results: list[SizeResult] = []
        async with worker:
            for count in config.nodes:
                progress(f"{count} nodes x {config.ranks_per_node} ranks")
                results.append(await _measure_size(client, queue, config, count, work))
        return results


# --------------------------------------------------------------------------- the command


def add_command(commands: Any) -> None:
    parser = costs.add_parser(
        "scale",
        commands,
        __doc__,
        help="one worker supervising one job on 100-2,000 simulated nodes: CPU per node, "
        "crash and silent-node detection latency, history per hour",
        nodes=DEFAULT_NODES,
    )
    defaults = ScaleConfig()
    for name in TUNABLE:  # one flag per field, its type and default the field's
        default = getattr(defaults, name)
        flag, hint = f"--{name.replace('_', '-')}", HELP.get(name)
        parser.add_argument(flag, type=type(default), default=default, help=hint)
    parser.add_argument(
        "--quick", action="store_true", help="50 nodes, 2 trials, 5 s steady: checks the bench"
    )


def config_from(args: argparse.Namespace) -> ScaleConfig:
    if args.quick:
        return ScaleConfig(nodes=(50,), ranks_per_node=args.ranks_per_node, trials=2, steady_s=5.0)
    return ScaleConfig(nodes=args.nodes, **{name: getattr(args, name) for name in TUNABLE})


def markdown(figures: list[dict[str, float | int | None]]) -> str:
    def cell(value: float | int | None) -> str:
        return "-" if value is None else f"{value:g}"

    lines = [
        "| nodes | ranks | CPU (cores) | CPU per node (ms/s) | crash p50 / p99 (s) "
        "| silent p50 / p99 (s) | history events/h (5 s / 300 s reports) | missed |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for f in figures:
        lines.append(
            f"| {f['nodes']} | {f['ranks']} | {cell(f['cpu_cores'])} "
            f"| {cell(f['cpu_ms_per_s_per_node'])} "
            f"| {cell(f['crash_e2e_p50_s'])} / {cell(f['crash_e2e_p99_s'])} "
            f"| {cell(f['silent_e2e_p50_s'])} / {cell(f['silent_e2e_p99_s'])} "
            f"| {cell(f['history_events_per_hour'])} / "
            f"{cell(f['history_events_per_hour_default'])} | {f['missed']} |"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    config = config_from(args)
    with tempfile.TemporaryDirectory(prefix="lazarus-scale-") as work:
        results = asyncio.run(measure(config, Path(work)))
    figures = [r.figures() for r in results]
    payload = {
        "benchmark": "scale",
        "config": asdict(config),
        "figures": figures,
        "raw": [asdict(r) for r in results],
        "host_cpus": os.cpu_count(),
    }
    write_results(results_path("scale", args.json_out), payload, markdown(figures))
    missed = sum(len(r.missed) for r in results)
    if missed:
        for r in results:
            for line in r.missed:
                print(f"missed ({r.nodes} nodes): {line}", file=sys.stderr)
    return 1 if missed else 0
