"""``python -m bench simulate``: the real ``JobWorkflow`` through weeks of failures at scale.

Each configuration runs the unchanged workflow on Temporal's time-skipping test server
against :class:`workers.simulate.cluster.SimCluster`, which meets one seeded failure trace
(:mod:`workers.simulate.model`): Llama 3's rate and classes by default, lemon nodes at a much
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

import asyncio
import math
import time
import uuid
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import Any

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.fleet import fleet_hand_back, fleet_lease, fleet_release, fleet_report
from lazarus.domain.api import (
    FLEET_WORKFLOW_TYPE,
    WORKFLOW_TYPE,
    fleet_workflow_id,
)
from lazarus.domain.checkpoint_interval import daly_interval_s, expected_goodput_loss
from lazarus.domain.fleet import ProbationSpec
from lazarus.domain.spec import JobSpec, parse_spec
from workers.simulate.clock import REPORT_S
from workers.simulate.cluster import PROBATION_COMMAND, SimCluster
from workers.simulate.fleet import FLEET_NAME, FleetPlan, fleet_figures, fleet_plan
from workers.simulate.model import (
    CALIBRATION,
    CALIBRATION_FILE,
    DAY_S,
    LLAMA3_CHECKPOINT_S,
    MEMORY_CALIBRATION,
    PROFILES,
    ClusterTrace,
    CostModel,
    FailureProfile,
    TraceConfig,
    make_trace,
    memory_interval_steps,
    memory_snapshot_s,
)
from workers.simulate.watch import (
    TEST_SERVER_DIST,
    TEST_SERVER_NAME,
    find_test_server,
    history_figures,
    register_search_attributes,
    report_progress,
    until_done_or_overrun,
)
from workflows.fleet import FleetWorkflow
from workflows.job import JobWorkflow
from workflows.state import JobInput, JobStatus

HOOK = ["sim-operator"]
SIMULATED_TASK_TIMEOUT = timedelta(seconds=120)
"""Each simulated workflow's task timeout (Temporal's default is 10 s). One task of a
2,048-node job takes 14 s of real time on a busy 2-core machine; past 10 s the server
expires it and schedules it again, which takes as long, and the simulated clock stops
(seed 3 of the 54-day trace stalled so twice). Simulated time does not pass while a
task runs, so a longer bound changes no figure."""
"""The escalation hook's command: the simulated operator (never run as a program)."""


REJOIN_TIMEOUT_S = 300.0
"""The rejoin rows' ``rejoin.timeout_s``. The default, 60 s, is shorter than the
rendezvous alone at 16,384 GPUs (61 s, :attr:`workers.simulate.model.CostModel.rendezvous_s`),
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
    (:data:`workers.simulate.model.LLAMA3_CHECKPOINT_S`); the figures before it used 20 s."""
    rendezvous: str = "published"
    """How the rendezvous grows with the job
    (:attr:`workers.simulate.model.CostModel.rendezvous`)."""
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
                    task_timeout=SIMULATED_TASK_TIMEOUT,
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
                task_timeout=SIMULATED_TASK_TIMEOUT,
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
