"""The multi-node scenarios: real SSH nodes in network namespaces (see
:mod:`bench.multinode`), Lazarus only; skipped, with the reason in the results,
where they cannot run (no root, no ``ip`` or ``sshd``).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from dataclasses import dataclass, field, replace

from activities.nodes.rundir import GenerationDir, read_json
from bench import multinode
from bench.harness import RANK_ENV, BenchContext, LazarusRun, Metric, SpecBuilder
from bench.jobs import JobPaths
from bench.measure import workflow_timeline
from bench.registry import runs, scenario
from bench.scenarios import phase_metrics, rank_fault, since
from bench.systems import REJOIN_TIMEOUT_S, Measured
from infra import chaos
from infra.testhosts import TestHosts
from lazarus.domain.spec import JobSpec, SpecError

NOT_MEASURED_NODE_LOSS = (
    "not measured on this 3 x 1 layout: torchrun's elastic answer (c10d rendezvous, a "
    "standby agent on the spare) is measured side by side with Lazarus on 2 hosts x 2 "
    "ranks in multinode_node_loss"
)
NODE_LOSS_VICTIM = "h2"
NODE_LOSS_WORLD_SIZE = 3


NODE_LOSS = scenario(
    "node_loss",
    f"""3 ssh nodes + 1 spare (network namespaces); kill host {NODE_LOSS_VICTIM} at the fault step.

    1. start 4 test hosts h1..h4 (network namespaces, each with its own sshd);
       launch the example on h1..h3, one rank each, h4 the spare;
    2. once the job reports ``shape.fault_step``: ``kill_host("{NODE_LOSS_VICTIM}")``
       (link down, then SIGKILL everything in its namespace);
    3. Lazarus (with the system's warm start and memory tier, and rejoin where the
       system asks for it and the spec takes it on ssh nodes; every host has its
       own /dev/shm, so {NODE_LOSS_VICTIM}'s snapshots die with it): polls of
       {NODE_LOSS_VICTIM} fail until ``node_timeout_s``, a node_lost incident opens,
       the survivors are stopped and the job relaunches on h1, h3 and the spare h4
       from the newest checkpoint every one of them holds;
    4. wait for the end; weights against a 3-rank reference; every activity and
       timer around the kill goes to ``details.timeline``.
    """,
    not_possible={"torchrun": NOT_MEASURED_NODE_LOSS},
    unavailable=multinode.netns_unavailable_reason,
    references=lambda shape: [(NODE_LOSS_WORLD_SIZE, shape.steps)],
)


NODE_LOSS_REPLICAS = scenario(
    "node_loss_replicas",
    f"""``node_loss`` with memory-tier replicas (``checkpoints.memory_replicas``).

    1. as ``node_loss``, with each node also pushing its committed snapshot to the
       next node (a ring): {NODE_LOSS_VICTIM}'s buddy h3 holds its slot's replicas;
    2. once the job reports ``shape.fault_step``: ``kill_host("{NODE_LOSS_VICTIM}")``;
    3. the search finds {NODE_LOSS_VICTIM}'s step in h3's replicas, copies it onto the
       spare h4, and every rank resumes from that memory step instead of the last
       disk checkpoint;
    4. wait for the end; weights against a 3-rank reference. Compare ``steps_lost``
       with ``node_loss``'s.
    """,
    not_possible={"torchrun": NOT_MEASURED_NODE_LOSS},
    unavailable=multinode.netns_unavailable_reason,
    references=lambda shape: [(NODE_LOSS_WORLD_SIZE, shape.steps)],
)


@dataclass(frozen=True)
class Layout:
    """Where a multi-node job runs on the test hosts, and which host dies."""

    label: str
    nodes: int
    spares: int
    nproc_per_node: int
    victim: str
    replicas: bool = False
    """Memory-tier replicas on (``checkpoints.memory_replicas``)."""
    comparable: bool = False
    """The comparable command line (the one torchrun runs: ``--pg-timeout-s``,
    ``OMP_NUM_THREADS=1``), for the side-by-side scenarios; False: the example as
    :func:`bench.jobs.build_spec` runs it."""

    @property
    def hosts(self) -> int:
        return self.nodes + self.spares

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node


NODE_LOSS_LAYOUT = Layout("node_loss", nodes=3, spares=1, nproc_per_node=1, victim=NODE_LOSS_VICTIM)
NODE_LOSS_REPLICAS_LAYOUT = replace(NODE_LOSS_LAYOUT, replicas=True)


@dataclass
class SshSetup:
    """What the spec of a run on ssh nodes ended up with: the system's setup as ssh
    nodes take it, and whether rejoin in place was asked for, taken or refused."""

    rejoin_asked: bool
    fields: dict[str, object] = field(default_factory=dict)
    rejoin_used: bool = False
    rejoin_refused: str | None = None
    """The spec's reason for refusing rejoin on these nodes (then the run goes on
    without it, a whole-generation restart)."""

    def details(self) -> dict[str, object]:
        return {
            "fields": {k: v for k, v in self.fields.items() if k != "command"},
            "rejoin_asked": self.rejoin_asked,
            "rejoin_used": self.rejoin_used,
            "rejoin_refused": self.rejoin_refused,
        }


def ssh_builder(
    ctx: BenchContext, hosts: TestHosts, layout: Layout, rejoin: bool
) -> tuple[SpecBuilder, SshSetup]:
    """A spec builder for ``layout`` on ``hosts`` under the system's setup (warm
    start, memory tier): every test host has its own /dev/shm, so the memory tier of
    a killed host dies with it and is measured, not flattered.

    ``rejoin``: ask for rejoin in place too. Whether the spec takes it on ssh nodes
    is the spec's to say (it refused until rejoin reached ssh nodes): the builder
    tries, and on a refusal naming ``rejoin`` builds the same spec without it. The
    returned :class:`SshSetup` records which, once the job is built."""
    shape = ctx.shape
    chosen = SshSetup(rejoin_asked=rejoin)
    base = ctx.setup.spec_fields(shape, ctx.config.warm_preload)
    base.pop("rejoin", None)
    checkpoints = base.get("checkpoints")
    if layout.replicas and isinstance(checkpoints, dict):
        base["checkpoints"] = {**checkpoints, "memory_replicas": True}

    def build(name: str, paths: JobPaths) -> JobSpec:
        for with_rejoin in (True, False) if rejoin else (False,):
            fields = dict(base)
            args: list[str] = []
            if with_rejoin:
                fields["rejoin"] = {"timeout_s": REJOIN_TIMEOUT_S}
                args = ["--resilient"]
            if layout.comparable:
                fields["command"] = [sys.executable, *ctx.example_args(paths, extra=args)]
                fields["env"] = dict(RANK_ENV)
            try:
                spec = multinode.ssh_spec(
                    name,
                    paths,
                    shape,
                    hosts,
                    nodes=layout.nodes,
                    spares=layout.spares,
                    setup=fields,
                    nproc_per_node=layout.nproc_per_node,
                )
            except SpecError as exc:
                if not with_rejoin or "rejoin" not in str(exc):
                    raise
                chosen.rejoin_refused = str(exc)
                continue
            if args and not layout.comparable:
                spec = spec.model_copy(update={"command": [*spec.command, *args]})
            chosen.fields, chosen.rejoin_used = fields, with_rejoin
            return spec
        raise AssertionError("unreachable: the last attempt has no rejoin")

    return build, chosen


@runs(NODE_LOSS, "lazarus")
async def node_loss(ctx: BenchContext, repeat: int) -> Measured:
    return await run_node_loss(ctx, repeat, NODE_LOSS_LAYOUT, rejoin=ctx.setup.rejoin)


@runs(NODE_LOSS_REPLICAS, "lazarus")
async def node_loss_replicas(ctx: BenchContext, repeat: int) -> Measured:
    return await run_node_loss(ctx, repeat, NODE_LOSS_REPLICAS_LAYOUT, rejoin=ctx.setup.rejoin)


async def run_rank_crash(
    ctx: BenchContext, repeat: int, layout: Layout, rank: int, rejoin: bool
) -> Measured:
    """The Lazarus side of a rank crash on ssh nodes: the job on ``layout``'s hosts,
    SIGKILL of ``rank`` at the fault step (:func:`bench.scenarios.rank_fault`)."""
    async with multinode.hosts_for_run(ctx, layout.label, repeat, count=layout.hosts) as hosts:
        build, setup = ssh_builder(ctx, hosts, layout, rejoin)
        started = time.time()
        async with ctx.job(layout.label, repeat, build) as job:
            outcome = await rank_fault(ctx, LazarusRun(job, started), rank, signal.SIGKILL)
    outcome.metrics["rejoin_used"] = setup.rejoin_used
    outcome.details |= {"setup": setup.details(), "rig": multinode.rig_details(hosts)}
    return outcome


async def run_node_loss(ctx: BenchContext, repeat: int, layout: Layout, rejoin: bool) -> Measured:
    """The Lazarus side of a node loss: the job on ``layout.nodes`` hosts and its
    spares, ``kill_host(layout.victim)`` at the fault step, and where the seconds went."""
    shape = ctx.shape
    victim = layout.victim
    async with multinode.hosts_for_run(ctx, layout.label, repeat, count=layout.hosts) as hosts:
        build, setup = ssh_builder(ctx, hosts, layout, rejoin)
        async with ctx.job(layout.label, repeat, build) as job:
            await job.reach_step(shape.fault_step)
            generation, step = chaos.current_step(job.run_root)
            killed_at = time.time()
            await asyncio.to_thread(hosts.kill_host, victim)
            kill_took = time.time() - killed_at
            status = await job.result()
            outcome = await job.common_outcome(status)
            activities = await workflow_timeline(
                ctx.client, job.control.workflow_id, job.control.first_run_id, killed_at
            )
    spares = {h.name for h in hosts.hosts[layout.nodes :]}
    lost = [i for i in status.incidents if i.kind == "node_lost"]
    incident = lost[0] if lost else None
    # Where the seconds went, from the run directory: the old generation stopped,
    # the new one launched (its first step is recovery_outside_s).
    run_root = chaos.run_root_of(job.run_root)
    stopped_at = _stopped_at(GenerationDir.of(run_root, generation))
    launch = read_json(GenerationDir.of(run_root, generation + 1).launch_file)
    launched_at = float(launch["launched_at"]) if launch else None
    outside: dict[str, float | None] = dict.fromkeys(
        ("recovery_outside_s", "recovery_outside_seen_s", "relaunch_to_first_step_s")
    )
    if incident is not None:
        first = job.monitor.first_progress(incident.generation + 1, incident.resumed_from_step or 0)
        if first is not None:
            outside = {
                "recovery_outside_s": first.written_at - killed_at,
                "recovery_outside_seen_s": first.seen_at - killed_at,
                # The restart cost: the new ranks start python and torch, rendezvous, load.
                "relaunch_to_first_step_s": (
                    first.written_at - incident.relaunched_at
                    if incident.relaunched_at is not None
                    else None
                ),
            }
    outcome.details |= {
        "fault": {
            "host": victim,
            "at": killed_at,
            "generation": generation,
            "step": step,
            "kill_took_s": kill_took,
        },
        "nodes": status.nodes.model_dump(mode="json"),
        "spec": _multinode_settings(job.spec),
        "setup": setup.details(),
        "rig": multinode.rig_details(hosts),
        "timeline": activities,  # activities and timers from 5 s before the kill
    }
    outcome.metrics |= {
        "fault_step": step,
        **_multinode_settings(job.spec),
        "rejoin_used": setup.rejoin_used,
        # The first incident is the loss of the killed host, named as such (`incidents`
        # says whether anything else happened later).
        "node_lost_ok": (
            incident is not None and incident is status.incidents[0] and incident.node == victim
        ),
        "spare_used": (
            bool(spares & set(status.nodes.active)) and victim not in status.nodes.active
        ),
        "detected": incident is not None,
        "recovered": outside["recovery_outside_s"] is not None,
        "detection_s": incident.detection_s if incident else None,
        "detection_from_kill_s": (incident.detected_at - killed_at) if incident else None,
        "detection_from_injection_s": (incident.detected_at - killed_at) if incident else None,
        "recovery_s": incident.recovery_s if incident else None,
        "recovery_from_kill_s": (
            incident.fault_at + incident.recovery_s - killed_at
            if incident is not None and incident.recovery_s is not None
            else None
        ),
        # The recovery's phases, by the controller (incident) and from the run directory.
        "stopped_after_kill_s": since(killed_at, incident.stopped_at if incident else None),
        "relaunched_after_kill_s": since(killed_at, incident.relaunched_at if incident else None),
        "stopped_after_kill_outside_s": since(killed_at, stopped_at),
        "launched_after_kill_outside_s": since(killed_at, launched_at),
        **outside,
        "steps_lost": incident.steps_lost if incident else None,
        "resumed_from_step": incident.resumed_from_step if incident else None,
        **phase_metrics(incident.timeline if incident else None),
    }
    return outcome


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
