"""The recovery scenarios, registered by name in :data:`SCENARIOS`.

Each scenario starts one example job (see :mod:`bench.jobs`), does one thing to
it, waits for the result and returns an :class:`~bench.harness.Outcome`. To add
one, write ``async def my_scenario(ctx, repeat) -> Outcome`` and decorate it with
``@scenario("name", "one line saying what it does")``; ``python -m bench
recovery --scenarios name`` then runs it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import threading
import time
from collections.abc import Awaitable, Callable

from bench import multinode
from bench.harness import (
    BenchContext,
    Metric,
    Outcome,
    Reference,
    Scenario,
    SpecBuilder,
    default_references,
)
from bench.jobs import JobPaths, JobShape, build_spec
from bench.measure import RunMonitor, workflow_steps
from lazarus import chaos
from lazarus.activities.rundir import GenerationDir, read_json
from lazarus.domain.api import SIGNAL_PAUSE, SIGNAL_RESUME
from lazarus.domain.spec import JobSpec
from lazarus.workflows.state import Incident, JobStatus, Phase

ScenarioFn = Callable[[BenchContext, int], Awaitable[Outcome]]

SCENARIOS: dict[str, Scenario] = {}


def scenario(
    name: str,
    summary: str,
    unavailable: Callable[[], str | None] | None = None,
    references: Callable[[JobShape], list[Reference]] | None = None,
) -> Callable[[ScenarioFn], ScenarioFn]:
    """Register a scenario. ``unavailable`` says why it cannot run here (it is then
    skipped); ``references`` lists the (world size, steps) reference runs it needs
    (default: the 2-rank example at ``shape.steps``)."""

    def register(fn: ScenarioFn) -> ScenarioFn:
        if name in SCENARIOS:
            raise ValueError(f"scenario {name!r} is registered twice")
        SCENARIOS[name] = Scenario(
            name=name,
            summary=summary,
            run=fn,
            unavailable=unavailable,
            references=references or default_references,
        )
        return fn

    return register


def _only_incident(incidents: list[Incident]) -> Incident | None:
    return incidents[0] if incidents else None


@scenario("clean", "no fault: the baseline for history size and weights")
async def clean(ctx: BenchContext, repeat: int) -> Outcome:
    async with ctx.job("clean", repeat) as job:
        status = await job.result()
        return await job.common_outcome(status)


@scenario("crash", "SIGKILL rank 1 at the fault step; Lazarus relaunches from the checkpoint")
async def crash(ctx: BenchContext, repeat: int) -> Outcome:
    async with ctx.job("crash", repeat) as job:
        await job.reach_step(ctx.shape.fault_step)
        fault = chaos.signal_rank(job.run_root, rank=1, sig=signal.SIGKILL)
        status = await job.result()
        outcome = await job.common_outcome(status)
        incident = _only_incident(status.incidents)
        outcome.details["fault"] = dataclasses.asdict(fault)
        outcome.metrics |= {
            "fault_step": fault.step,
            "named_rank_ok": incident is not None and incident.rank == fault.rank,
            "detection_s": incident.detection_s if incident else None,
            "recovery_s": incident.recovery_s if incident else None,
            "steps_lost": incident.steps_lost if incident else None,
            "resumed_from_step": incident.resumed_from_step if incident else None,
        }
        outcome.metrics |= _outside_recovery(job.monitor, fault, incident)
        return outcome


@scenario("hang", "SIGSTOP rank 0 at the fault step; found by the hang timeout and relaunched")
async def hang(ctx: BenchContext, repeat: int) -> Outcome:
    async with ctx.job("hang", repeat) as job:
        await job.reach_step(ctx.shape.fault_step)
        fault = chaos.signal_rank(job.run_root, rank=0, sig=signal.SIGSTOP)
        status = await job.result()
        outcome = await job.common_outcome(status)
        incident = _only_incident(status.incidents)
        outcome.details["fault"] = dataclasses.asdict(fault)
        outcome.metrics |= {
            "fault_step": fault.step,
            "hang_timeout_s": job.spec.health.hang_timeout_s,
            "named_rank_ok": incident is not None and incident.rank == fault.rank,
            "detection_s": incident.detection_s if incident else None,
            "detection_from_injection_s": (incident.detected_at - fault.at) if incident else None,
            "recovery_s": incident.recovery_s if incident else None,
            "steps_lost": incident.steps_lost if incident else None,
        }
        outcome.metrics |= _outside_recovery(job.monitor, fault, incident)
        return outcome


@scenario(
    "worker_kill",
    "SIGKILL the controller worker at the fault step, restart it after a pause; "
    "ranks must not notice",
)
async def worker_kill(ctx: BenchContext, repeat: int) -> Outcome:
    stack = ctx.stack
    async with ctx.job("worker_kill", repeat) as job:
        fault_step = await job.reach_step(ctx.shape.fault_step)
        killed_at = time.time()
        stack.kill_worker(signal.SIGKILL)
        _, before = chaos.current_step(job.run_root)
        await asyncio.sleep(ctx.shape.worker_down_s)
        _, during = chaos.current_step(job.run_root)
        stack.start_worker()
        restarted_at = time.time()
        status = await job.result()
        outcome = await job.common_outcome(status)
        outcome.details |= {"worker_killed_at": killed_at, "worker_restarted_at": restarted_at}
        outcome.metrics |= {
            "fault_step": fault_step,
            "worker_down_s": restarted_at - killed_at,
            "steps_while_worker_down": (
                during - before if during is not None and before is not None else None
            ),
            "steps_lost": sum(i.steps_lost or 0 for i in status.incidents),
            "duplicate_ranks": job.monitor.max_live_ranks > job.spec.world_size,
        }
        return outcome


@scenario(
    "pause",
    "pause at the fault step (a just-in-time checkpoint, then stop), resume at once; "
    "reports the save latency and the steps the pause cost",
)
async def pause(ctx: BenchContext, repeat: int) -> Outcome:
    async with ctx.job("pause", repeat) as job:
        await job.reach_step(ctx.shape.fault_step)
        signalled_at = time.time()
        await job.handle.signal(SIGNAL_PAUSE)
        paused = await job.wait_phase(Phase.PAUSED)
        paused_at = time.time()
        await job.handle.signal(SIGNAL_RESUME)
        status = await job.result()
        outcome = await job.common_outcome(status)
        stop = paused.planned_stops[-1] if paused.planned_stops else None
        committed_at = None
        if stop is not None and stop.checkpoint_step is not None:
            marker = read_json(
                job.paths.checkpoints / f"step-{stop.checkpoint_step:08d}" / "COMMITTED"
            )
            committed_at = float(marker["committed_at"]) if marker else None
        outcome.metrics |= {
            "jit_checkpoint_ok": stop is not None and stop.checkpoint_step is not None,
            "signal_to_checkpoint_s": (
                committed_at - signalled_at if committed_at is not None else None
            ),
            "jit_checkpoint_s": stop.checkpoint_s if stop else None,
            "signal_to_paused_s": paused_at - signalled_at,
            "steps_lost": stop.steps_lost if stop else None,
        }
        return outcome


# --------------------------------------------------------------------------- playbooks
#
# Two logical local nodes of one rank each and a spare: the straggler is a node, and
# moving the job off it cures it, as it would a throttled machine.

STRAGGLER_STEPS_FACTOR = 2
"""The straggler job runs twice the shape's steps, so that a swap pays off."""
STRAGGLER_SLOWDOWN = 2.0


def _straggler_steps(shape: JobShape) -> int:
    return shape.steps * STRAGGLER_STEPS_FACTOR


def _two_local_nodes(shape: JobShape, steps: int, *slow_args: str) -> SpecBuilder:
    def build(name: str, paths: JobPaths) -> JobSpec:
        spec = build_spec(
            name,
            paths,
            shape,
            nproc_per_node=1,
            steps=steps,
            extra={
                "nodes": [{"name": "a"}, {"name": "b"}],
                "spares": [{"name": "s0"}],
                "total_steps": steps,
                # What one of our recoveries costs here (see the crash scenario), so the
                # cost model weighs a real number rather than the conservative default.
                "straggler": {"default_restart_cost_s": 5.0},
            },
        )
        return spec.model_copy(update={"command": [*spec.command, *slow_args]})

    return build


@scenario(
    "straggler",
    f"node b's rank becomes {STRAGGLER_SLOWDOWN:g}x slower from the fault step (2 local "
    "nodes + 1 spare, spec defaults for detection); found, checkpointed, swapped",
    references=lambda shape: [(2, _straggler_steps(shape))],
)
async def straggler(ctx: BenchContext, repeat: int) -> Outcome:
    shape = ctx.shape
    steps = _straggler_steps(shape)
    slow = ("--slow-node", "b", "--slow-factor", str(STRAGGLER_SLOWDOWN))
    build = _two_local_nodes(shape, steps, *slow, "--slow-from-step", str(shape.fault_step))
    async with ctx.job("straggler", repeat, build, steps=steps) as job:
        await job.reach_step(shape.fault_step)
        slow_from = time.time()  # the next step of node b is the first slow one
        status = await job.result()
        outcome = await job.common_outcome(status)
        found = status.stragglers[0] if status.stragglers else None
        incident = next((i for i in status.incidents if i.kind == "straggler"), None)
        outcome.metrics |= {
            "slowdown_injected": STRAGGLER_SLOWDOWN,
            "window_s": job.spec.straggler.window_s,
            "slowdown_factor": job.spec.straggler.slowdown_factor,
            "found_ok": found is not None and found.node == "b",
            "slowdown_measured": found.slowdown if found else None,
            "detection_s": (found.detected_at - slow_from) if found else None,
            "detection_by_samples_s": found.detection_s if found else None,
            "swapped": found is not None and found.action == "replace_node",
            "recovery_s": incident.recovery_s if incident else None,
            "steps_lost": incident.steps_lost if incident else None,
        }
        return outcome


SCHEDULE_STEPS = 300


@scenario(
    "schedule",
    f"a scripted fault schedule on one {SCHEDULE_STEPS}-step job: rank crash at 20%, "
    "rank hang at 40%, worker SIGKILL at 60%, straggler node from 75%; reports ETTR",
    references=lambda shape: [(2, SCHEDULE_STEPS)],
)
async def schedule(ctx: BenchContext, repeat: int) -> Outcome:
    shape = ctx.shape
    steps = SCHEDULE_STEPS
    at = {name: int(steps * f) for name, f in (("crash", 0.2), ("hang", 0.4), ("worker", 0.6))}
    slow_from = int(steps * 0.75)
    build = _two_local_nodes(
        shape, steps, "--slow-node", "b", "--slow-factor", "2", "--slow-from-step", str(slow_from)
    )
    async with ctx.job("schedule", repeat, build, steps=steps) as job:
        await job.reach_step(at["crash"])
        chaos.signal_rank(job.run_root, rank=1, sig=signal.SIGKILL)
        await job.reach_step(at["hang"], min_generation=2)
        chaos.signal_rank(job.run_root, rank=0, sig=signal.SIGSTOP)
        await job.reach_step(at["worker"], min_generation=3)
        ctx.stack.kill_worker(signal.SIGKILL)
        await asyncio.sleep(shape.worker_down_s)
        ctx.stack.start_worker()
        status = await job.result()
        outcome = await job.common_outcome(status)
        outcome.details["incidents"] = [
            i.model_dump(mode="json", by_alias=True) for i in status.incidents
        ]
        outcome.metrics |= {
            "ettr": status.ettr,
            "mttr_s": status.mttr_s,
            "incidents": len(status.incidents),
            "stragglers_swapped": sum(1 for s in status.stragglers if s.action == "replace_node"),
            "steps_lost": status.steps_lost,
            "elapsed_s": status.elapsed_s,
            "unhandled": status.phase.value != "SUCCEEDED",
        }
        return outcome


def _outside_recovery(
    monitor: RunMonitor, fault: chaos.InjectedFault, incident: Incident | None
) -> dict[str, float | None]:
    """Fault injection to the first heartbeat of the next generation past its resume
    step, from the run directory alone: by the rank's own clock, and when we saw it."""
    resumed = 0
    if incident is not None and incident.resumed_from_step is not None:
        resumed = incident.resumed_from_step
    first = monitor.first_progress(fault.generation + 1, resumed)
    return {
        "recovery_outside_s": first.written_at - fault.at if first else None,
        "recovery_outside_seen_s": first.seen_at - fault.at if first else None,
    }


# --------------------------------------------------------------------------- multi-node
#
# Real SSH nodes: network namespaces with their own sshd (see bench.multinode);
# skipped, with the reason in the results, where they cannot run.

NODE_LOSS_VICTIM = "h2"
NODE_LOSS_WORLD_SIZE = 3
CPU_WORLD_SIZE = 4


@scenario(
    "node_loss",
    f"3 ssh nodes + 1 spare (network namespaces); kill host {NODE_LOSS_VICTIM} at the fault "
    "step; the job finishes on the spare",
    unavailable=multinode.netns_unavailable_reason,
    references=lambda shape: [(NODE_LOSS_WORLD_SIZE, shape.steps)],
)
async def node_loss(ctx: BenchContext, repeat: int) -> Outcome:
    shape = ctx.shape
    async with multinode.hosts_for_run(ctx, "node_loss", repeat, count=4) as hosts:

        def build(name: str, paths: JobPaths) -> JobSpec:
            return multinode.ssh_spec(name, paths, shape, hosts, nodes=3, spares=1)

        async with ctx.job("node_loss", repeat, build) as job:
            await job.reach_step(shape.fault_step)
            generation, step = chaos.current_step(job.run_root)
            killed_at = time.time()
            await asyncio.to_thread(hosts.kill_host, NODE_LOSS_VICTIM)
            kill_took = time.time() - killed_at
            status = await job.result()
            outcome = await job.common_outcome(status)
            assert job.handle.first_execution_run_id is not None
            steps = await workflow_steps(
                ctx.client, job.handle.id, job.handle.first_execution_run_id
            )
    lost = [i for i in status.incidents if i.kind == "node_lost"]
    incident = lost[0] if lost else None
    # Where the seconds went, from the run directory: the old generation stopped,
    # the new one launched (its first step is recovery_outside_s).
    run_root = chaos.run_root_of(job.run_root)
    stopped_at = _stopped_at(GenerationDir.of(run_root, generation))
    launch = read_json(GenerationDir.of(run_root, generation + 1).launch_file)
    launched_at = float(launch["launched_at"]) if launch else None
    outside: dict[str, float | None] = {
        "recovery_outside_s": None,
        "recovery_outside_seen_s": None,
    }
    if incident is not None:
        first = job.monitor.first_progress(incident.generation + 1, incident.resumed_from_step or 0)
        if first is not None:
            outside = {
                "recovery_outside_s": first.written_at - killed_at,
                "recovery_outside_seen_s": first.seen_at - killed_at,
            }
    outcome.details |= {
        "fault": {
            "host": NODE_LOSS_VICTIM,
            "at": killed_at,
            "generation": generation,
            "step": step,
            "kill_took_s": kill_took,
        },
        "nodes": status.nodes.model_dump(mode="json"),
        "spec": _multinode_settings(job.spec),
        "rig": multinode.rig_details(hosts),
        # Activities and timers from 5 s before the kill, in seconds from the kill.
        "timeline": [
            {
                "name": st.name,
                "from_s": round(st.started_at - killed_at, 3),
                "to_s": round(st.ended_at - killed_at, 3) if st.ended_at else None,
                "outcome": st.outcome,
            }
            for st in steps
            if (st.ended_at or st.started_at) >= killed_at - 5
        ],
    }
    outcome.metrics |= {
        "fault_step": step,
        **_multinode_settings(job.spec),
        # The first incident is the loss of the killed host, named as such (`incidents`
        # says whether anything else happened later).
        "node_lost_ok": (
            incident is not None
            and incident is status.incidents[0]
            and incident.node == NODE_LOSS_VICTIM
        ),
        "spare_used": ("h4" in status.nodes.active and NODE_LOSS_VICTIM not in status.nodes.active),
        "detection_s": incident.detection_s if incident else None,
        "detection_from_kill_s": (incident.detected_at - killed_at) if incident else None,
        "recovery_s": incident.recovery_s if incident else None,
        "recovery_from_kill_s": (
            incident.fault_at + incident.recovery_s - killed_at
            if incident is not None and incident.recovery_s is not None
            else None
        ),
        # The recovery's phases, by the controller (incident) and from the run directory.
        "stopped_after_kill_s": _since(killed_at, incident.stopped_at if incident else None),
        "relaunched_after_kill_s": _since(killed_at, incident.relaunched_at if incident else None),
        "stopped_after_kill_outside_s": _since(killed_at, stopped_at),
        "launched_after_kill_outside_s": _since(killed_at, launched_at),
        **outside,
        "steps_lost": incident.steps_lost if incident else None,
        "resumed_from_step": incident.resumed_from_step if incident else None,
    }
    return outcome


def _since(start: float, at: float | None) -> float | None:
    return at - start if at is not None else None


def _stopped_at(gen: GenerationDir) -> float | None:
    """When the stop of a generation finished (its ``stopped.json``, rewritten at the end)."""
    record = read_json(gen.stopped_file)
    if record is not None and record.get("reason") == "stopped" and "at" in record:
        return float(record["at"])
    try:
        return gen.stopped_file.stat().st_mtime
    except OSError:
        return None


def _multinode_settings(spec: JobSpec) -> dict[str, Metric]:
    return {
        "node_timeout_s": spec.node_timeout_s,
        "ssh_connect_timeout_s": spec.ssh.connect_timeout_s,
        "ssh_command_timeout_s": spec.ssh.command_timeout_s,
        "poll_interval_s": spec.health.poll_interval_s,
    }


@scenario(
    "ssh_poll",
    "the supervision round trip over SSH: SSHAgent.poll of an idle rank on each of 4 "
    "hosts on a reused connection, node by node and all 4 at once, every poll interval",
    unavailable=multinode.netns_unavailable_reason,
    references=lambda shape: [],
)
async def ssh_poll(ctx: BenchContext, repeat: int) -> Outcome:
    async with multinode.hosts_for_run(ctx, "ssh_poll", repeat, count=4) as hosts:
        run_root = ctx.workdir / "polls" / f"ssh-poll-{repeat}" / "runs" / "bench-ssh-poll"
        cancel = threading.Event()  # so that Ctrl-C does not wait for every poll to fail
        try:
            polls = await asyncio.to_thread(
                multinode.measure_polls, hosts, ctx.shape, run_root, cancel
            )
        finally:
            cancel.set()
    return Outcome(
        metrics={
            "nodes": len(polls.per_node),
            "poll_interval_s": polls.interval_s,
            "ssh_command_timeout_s": ctx.shape.ssh_command_timeout_s,
            **polls.metrics(),
        },
        details={
            "seconds": {
                "first": polls.first,
                "per_node": polls.per_node,
                "concurrent": polls.concurrent,
                "sequential": polls.sequential,
                "back_to_back": polls.back_to_back,
            },
            "failures": polls.failures[:20],
            "rig": multinode.rig_details(hosts),
        },
    )


@scenario(
    "controller_cpu",
    f"the worker's CPU time while it supervises {CPU_WORLD_SIZE} ssh nodes (1 rank each), "
    f"against the same {CPU_WORLD_SIZE} ranks on 1 local node, and idle",
    unavailable=multinode.netns_unavailable_reason,
    references=lambda shape: [(CPU_WORLD_SIZE, shape.cpu_steps)],
)
async def controller_cpu(ctx: BenchContext, repeat: int) -> Outcome:
    shape = ctx.shape
    outcome = Outcome(metrics={"poll_interval_s": shape.health.get("poll_interval_s")})
    # With no job at all: what the worker costs just by being connected.
    pid = ctx.stack.worker_pid
    first = multinode.cpu_sample(pid)
    await asyncio.sleep(shape.idle_window_s)
    idle = multinode.cpu_rate(first, multinode.cpu_sample(pid))
    outcome.metrics["idle_cpu_ms_per_s"] = idle * 1000.0

    def local(name: str, paths: JobPaths) -> JobSpec:
        return build_spec(name, paths, shape, nproc_per_node=CPU_WORLD_SIZE, steps=shape.cpu_steps)

    await _supervision_cpu(ctx, "cpu_local", repeat, local, "local1", outcome)
    async with multinode.hosts_for_run(
        ctx, "controller_cpu", repeat, count=CPU_WORLD_SIZE
    ) as hosts:

        def ssh(name: str, paths: JobPaths) -> JobSpec:
            return multinode.ssh_spec(
                name, paths, shape, hosts, nodes=CPU_WORLD_SIZE, steps=shape.cpu_steps
            )

        await _supervision_cpu(ctx, "cpu_ssh", repeat, ssh, "ssh4", outcome)
        outcome.details["rig"] = multinode.rig_details(hosts)
    local_rate = outcome.metrics.get("local1_cpu_ms_per_s")
    ssh_rate = outcome.metrics.get("ssh4_cpu_ms_per_s")
    outcome.metrics["ssh4_over_local1"] = (
        ssh_rate / local_rate
        if isinstance(ssh_rate, float) and isinstance(local_rate, float) and local_rate > 0
        else None
    )
    return outcome


async def _supervision_cpu(
    ctx: BenchContext,
    label: str,
    repeat: int,
    build: SpecBuilder,
    prefix: str,
    outcome: Outcome,
) -> None:
    """Run one job to the end; sample the worker's CPU time over its steady middle
    (from 1/6 to 5/6 of its steps: after start-up and rendezvous, before the end)."""
    steps = ctx.shape.cpu_steps
    async with ctx.job(label, repeat, build, steps=steps) as job:
        await job.reach_step(max(1, steps // 6))
        first = multinode.cpu_sample(ctx.stack.worker_pid)
        await job.reach_step(steps * 5 // 6)
        last = multinode.cpu_sample(ctx.stack.worker_pid)
        status: JobStatus = await job.result()
        common = await job.common_outcome(status)
    rate = multinode.cpu_rate(first, last)
    outcome.metrics |= {
        f"{prefix}_completed": common.metrics["completed"],
        f"{prefix}_weights_ok": common.metrics["weights_ok"],
        f"{prefix}_window_s": last.at - first.at,
        f"{prefix}_cpu_ms_per_s": rate * 1000.0,
        f"{prefix}_cpu_s_per_hour": rate * 3600.0,
    }
    outcome.details[prefix] = {
        **common.details,
        "world_size": job.spec.world_size,
        "nodes": [n.name for n in job.spec.nodes],
        "window": {"from_cpu_s": first.cpu_s, "to_cpu_s": last.cpu_s},
    }
