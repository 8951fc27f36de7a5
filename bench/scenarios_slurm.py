"""The Slurm scenarios: a real Slurm on this machine (:class:`infra.slurm.TestSlurm`,
slurmctld plus slurmd n1..n3), Lazarus against plain Slurm; skipped, with the reason in
the results, without root, slurm-wlm or munge.

A fresh cluster per run: the node kill takes a slurmd down and Lazarus drains the node.
The worker is restarted with the cluster's ``SLURM_CONF`` before the job starts, so the
restart is in no figure. Plain Slurm runs the same command line under ``sbatch --requeue
-N 2`` (``srun`` with the variables torchrun would set); each rank also gets
``LAZARUS_HEARTBEAT_FILE`` only so that the bench dates the requeued job's first step by
the rank's own clock, as it dates Lazarus's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from activities.nodes.procfs import read_stat
from activities.nodes.rundir import GenerationDir, read_json
from bench.costs import table
from bench.harness import RANK_ENV, BenchContext, Metric, wait_until
from bench.jobs import JobPaths, build_spec
from bench.measure import max_logged_step, steady_window, workflow_timeline
from bench.multinode import cpu_sample
from bench.registry import runs, scenario
from bench.scenarios import phase_metrics, since
from bench.systems import Measured
from infra import chaos
from infra.reference_run import weights_match
from infra.slurm import TestSlurm, unavailable_reason
from lazarus.domain.ports import free_port
from lazarus.domain.recovery_timeline import RecoveryTimeline, latest_marks
from lazarus.domain.spec import JobSpec

VICTIM_RANK = 1
"""The rank whose node dies (rank 1: never the batch host of the plain-Slurm job)."""
SPARE = "n3"
CPU_NODE_COUNTS = (2, 3)
REQUEUE_WAIT_S = 240.0
"""How long plain Slurm gets, from the kill, to train a step of the requeued job."""
STATE_POLL_S = 0.2
"""How often the bench asks Slurm about the plain job and the victim node."""
SLURM_SETTINGS = (
    "SlurmdTimeout",
    "AuthInfo",
    "JobRequeue",
    "KillWait",
    "MessageTimeout",
    "ReturnToService",
    "BatchStartTimeout",
    "KillOnBadExit",
    "InactiveLimit",
    "MinJobAge",
    "SchedulerType",
)
"""``scontrol show config`` values that govern what Slurm does about a dead node."""
TERMINAL = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL"}
)


def _unavailable() -> str | None:
    reason = unavailable_reason()
    return f"real Slurm unavailable: {reason}" if reason else None


# --------------------------------------------------------------------------- the rig


@contextlib.asynccontextmanager
async def slurm_for_run(ctx: BenchContext) -> AsyncIterator[TestSlurm]:
    """A fresh test Slurm for one run, and the worker restarted to reach it; stopped
    and removed on exit whatever happened (registered with the context too)."""
    cluster = TestSlurm(cred_expire_s=ctx.config.slurm_cred_expire_s)
    ctx.resources.append(cluster)
    previous = os.environ.get("SLURM_CONF")
    try:
        await asyncio.to_thread(cluster.start)
        os.environ["SLURM_CONF"] = str(cluster.conf)
        if ctx.stack.worker_running:
            ctx.stack.kill_worker(signal.SIGKILL)
        ctx.stack.start_worker()  # it copies os.environ: SLURM_CONF included
        yield cluster
    finally:
        try:
            await asyncio.to_thread(cluster.stop)
        finally:
            cluster.remove()
            if previous is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = previous


def slurm_settings(cluster: TestSlurm) -> dict[str, str]:
    """The settings of :data:`SLURM_SETTINGS` as ``scontrol show config`` prints them."""
    found = _pairs(cluster.command("scontrol", "show", "config").stdout.splitlines())
    return {key: value for key, value in found.items() if key in SLURM_SETTINGS}


def _pairs(words: Iterable[str]) -> dict[str, str]:
    """``key=value`` words (or lines) as a dict; the rest left out."""
    split = (word.partition("=") for word in words)
    return {key.strip(): value.strip() for key, sep, value in split if sep}


# --------------------------------------------------------------------------- node loss


NODE_LOSS = scenario(
    "slurm_node_loss",
    """2 Slurm nodes + 1 spare; kill node n2 (its slurmd and its step processes) at the fault step.

    1. start a fresh test Slurm (slurmctld, slurmd n1..n3 on this host); restart the
       worker with its ``SLURM_CONF``;
    2. Lazarus: a holder allocation of n1..n3 (``sbatch --no-kill --no-requeue``), the
       example on n1, n2 (one rank each) with n3 the spare, each generation one job
       step; plain Slurm: ``sbatch --requeue -N 2`` running ``srun`` of the same
       command line (torchrun's variables from Slurm's, the same checkpoint dir);
    3. once the job reports ``shape.fault_step``: kill the node of rank 1 (SIGKILL its
       slurmd, the step's ``slurmstepd`` there and the tasks under it);
    4. Lazarus: the incident (detection, phases, first step on the spare); plain
       Slurm: the node's state, the job's state and restart count every 0.2 s, and
       the first step of the requeued job from its heartbeat files, or the time the
       job ended if Slurm ends it;
    5. wait for the end; weights against a 2-rank reference.
    """,
    unavailable=_unavailable,
)


def _lazarus_spec(
    ctx: BenchContext,
    name: str,
    paths: JobPaths,
    allocation: int,
    nodes: list[str],
    steps: int | None = None,
    spare: bool = True,
) -> JobSpec:
    """The example on ``nodes`` (one rank each, with :data:`SPARE` the spare if ``spare``),
    with the comparable command line, in the holder allocation."""
    host = os.uname().nodename.split(".")[0]
    return build_spec(
        name,
        paths,
        ctx.shape,
        nproc_per_node=1,
        steps=steps,
        extra={
            "command": [sys.executable, *ctx.example_args(paths, steps)],
            "env": dict(RANK_ENV),
            "nodes": [{"name": n, "launcher": "slurm", "host": host} for n in nodes],
            "spares": ([{"name": SPARE, "launcher": "slurm", "host": host}] if spare else []),
            # The tasks' node-side Python (issue 39: python3 on the node's PATH by
            # default): this venv's, on this one-host cluster.
            "slurm": {"job_id": allocation, "python": sys.executable},
            # The memory tier with buddy replicas, as on ssh nodes: a lost node's step
            # comes from its buddy's replica, streamed onto the spare, not from disk.
            "checkpoints": {
                "memory_every_steps": 1,
                "every_steps": ctx.shape.ckpt_every,
                "memory_replicas": spare,
            },
        },
    )


@runs(NODE_LOSS, "lazarus")
async def node_loss_lazarus(ctx: BenchContext, repeat: int) -> Measured:
    async with slurm_for_run(ctx) as cluster:
        allocation = await asyncio.to_thread(cluster.allocate, 3)
        slurm = slurm_settings(cluster)

        def build(name: str, paths: JobPaths) -> JobSpec:
            return _lazarus_spec(ctx, name, paths, allocation, ["n1", "n2"])

        async with ctx.job("slurm_node_loss", repeat, build) as job:
            await job.reach_step(ctx.shape.fault_step)
            generation, step = chaos.current_step(job.run_root)
            gen = GenerationDir.of(chaos.run_root_of(job.run_root), generation)
            record = read_json(gen.pid_file(VICTIM_RANK)) or {}
            victim = str(record.get("slurm_node", "n2"))
            killed_at = time.time()  # the node dies as the Slurm tests kill it
            pids = await asyncio.to_thread(cluster.kill_node, victim)
            watch = _Watch(killed_at)
            watcher = asyncio.ensure_future(_watch_node(cluster, victim, watch))
            try:
                status = await job.result()
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            outcome = await job.common_outcome(status)
            activities = await workflow_timeline(
                ctx.client, job.control.workflow_id, job.control.first_run_id, killed_at
            )
            logged = max_logged_step(sorted(gen.path.glob("rank-*.log")))
        ctx.run_roots.pop(job.spec.job_id, None)  # stopped above; the cluster goes next
    incident = status.incidents[0] if status.incidents else None
    timeline = incident.timeline if incident else None
    outcome.metrics |= {
        "fault_step": step,
        "poll_interval_s": job.spec.health.poll_interval_s,
        "node_timeout_s": job.spec.node_timeout_s,
        **watch.node_metrics(slurm),
        "detected": incident is not None,
        "detection_s": incident.detection_s if incident else None,
        "detection_from_kill_s": (incident.detected_at - killed_at) if incident else None,
        "stopped_after_kill_s": since(killed_at, incident.stopped_at if incident else None),
        "relaunched_after_kill_s": since(killed_at, incident.relaunched_at if incident else None),
        "recovered": bool(incident and incident.first_step_at),
        "recovery_from_kill_s": since(killed_at, incident.first_step_at if incident else None),
        "steps_lost": (
            logged - incident.resumed_from_step
            if incident is not None and logged is not None and incident.resumed_from_step
            else (incident.steps_lost if incident else None)
        ),
        "resumed_from_step": incident.resumed_from_step if incident else None,
        "spare_used": SPARE in status.nodes.active and victim not in status.nodes.active,
        **phase_metrics(timeline),
    }
    outcome.details |= {
        "fault": {"node": victim, "at": killed_at, "generation": generation, "step": step},
        "killed_pids": pids,
        "cluster_root": str(cluster.root),
        "nodes": status.nodes.model_dump(mode="json"),
        "settings": {
            "poll_interval_s": job.spec.health.poll_interval_s,
            "node_timeout_s": job.spec.node_timeout_s,
            "stop_grace_s": job.spec.recovery.stop_grace_s,
            "slurm": slurm,
        },
        "incident_kinds": [i.kind for i in status.incidents],
        "phases": [d.model_dump() for d in timeline.durations()] if timeline else [],
        "timeline": activities,  # activities and timers from 5 s before the kill
    }
    return outcome


@dataclass
class _Watch:
    """What the bench saw of the plain Slurm job and the victim node after the kill."""

    killed_at: float
    not_responding_at: float | None = None
    """The victim first shown ``*`` (a ping failed) or DOWN."""
    node_down_at: float | None = None
    """The victim first shown DOWN (SlurmdTimeout passed without an answer)."""
    left_running_at: float | None = None
    requeued_at: float | None = None
    running_again_at: float | None = None
    ended_at: float | None = None
    end_state: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    last: tuple[str, str, str] | None = None

    def node_metrics(self, slurm: dict[str, str]) -> dict[str, Metric]:
        """Slurm's node timeout and when the victim showed not responding, then DOWN."""
        return {
            "slurmd_timeout_s": float(slurm.get("SlurmdTimeout", "nan").split()[0]),
            "node_not_responding_after_kill_s": since(self.killed_at, self.not_responding_at),
            "node_down_after_kill_s": since(self.killed_at, self.node_down_at),
        }

    def see_node(self, at: float, node: set[str]) -> None:
        if self.not_responding_at is None and node & {"DOWN", "NOT_RESPONDING"}:
            self.not_responding_at = at
        if self.node_down_at is None and "DOWN" in node:
            self.node_down_at = at

    def see(self, at: float, node: set[str], job: dict[str, str]) -> None:
        state = job.get("JobState", "?")
        restarts = job.get("Restarts", "0")
        key = ("+".join(sorted(node)), state, restarts)
        if key != self.last:
            self.last = key
            self.events.append(
                {
                    "after_kill_s": round(at - self.killed_at, 3),
                    "node": key[0],
                    "job": state,
                    "restarts": restarts,
                    "reason": job.get("Reason"),
                    "nodes": job.get("NodeList"),
                }
            )
        self.see_node(at, node)
        if self.left_running_at is None and state != "RUNNING":
            self.left_running_at = at
        if self.requeued_at is None and restarts not in ("", "0"):
            self.requeued_at = at
        if self.requeued_at is not None and self.running_again_at is None and state == "RUNNING":
            self.running_again_at = at
        if state in TERMINAL and self.ended_at is None:
            self.ended_at, self.end_state = at, state


async def _watch_node(cluster: TestSlurm, node: str, watch: _Watch) -> None:
    """Record when Slurm shows ``node`` not responding and DOWN; cancelled when done."""
    while watch.node_down_at is None:
        words = await asyncio.to_thread(_node_words, cluster, node)
        watch.see_node(time.time(), words)
        await asyncio.sleep(STATE_POLL_S)


def _job_fields(cluster: TestSlurm, job_id: int) -> dict[str, str]:
    out = cluster.command("scontrol", "show", "job", "-o", str(job_id)).stdout
    head, _, _ = out.partition(" Command=")
    return _pairs(head.split())


def _node_words(cluster: TestSlurm, node: str) -> set[str]:
    out = cluster.command("scontrol", "show", "node", "-o", node).stdout
    match = re.search(r"\bState=(\S+)", out)
    raw = [w for w in (match.group(1) if match else "").split("+") if w]
    words = {w.rstrip("*") for w in raw}
    if any(w.endswith("*") for w in raw):
        words.add("NOT_RESPONDING")
    return words


def requeue_script(ctx: BenchContext, paths: JobPaths, port: int) -> str:
    """The batch script: ``srun`` of the example, each task given what torchrun would
    set, its output and heartbeat per rank and requeue (``SLURM_RESTART_COUNT``)."""
    command = shlex.join([sys.executable, *ctx.example_args(paths)])
    logs = shlex.quote(str(paths.root / "plain"))
    task = (
        "r=${SLURM_RESTART_COUNT:-0}; "
        "export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS "
        "LOCAL_WORLD_SIZE=1 GROUP_RANK=$SLURM_NODEID; "
        f"export LAZARUS_HEARTBEAT_FILE={logs}/hb-r$r-rank$RANK.json; "
        f"exec {command} > {logs}/rank-r$r-$RANK.log 2>&1"
    )
    return "\n".join(
        [
            "#!/bin/sh",
            'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
            'export MASTER_ADDR=$(scontrol show node -o "$first" '
            "| sed 's/.*NodeAddr=\\([^ ]*\\).*/\\1/')",
            f"export MASTER_PORT=$(({port} + ${{SLURM_RESTART_COUNT:-0}}))",
            *(f"export {k}={shlex.quote(v)}" for k, v in RANK_ENV.items()),
            f"mkdir -p {logs}",
            f"exec srun --kill-on-bad-exit=0 --cpu-bind=none sh -c {shlex.quote(task)}",
            "",
        ]
    )


def _first_steps(folder: Path, restart: int) -> tuple[dict[str, float], int | None]:
    """The latest rank's phase marks of requeue ``restart`` and its lowest step seen."""
    per_rank: dict[int, dict[str, float]] = {}
    steps: list[int] = []
    for path in folder.glob(f"hb-r{restart}-rank*.json"):
        beat = read_json(path)
        if beat is None:
            continue
        rank = int(path.stem.rsplit("rank", 1)[1])
        per_rank[rank] = {k: float(v) for k, v in (beat.get("phases") or {}).items()}
        steps.append(int(beat.get("step", 0)))
    return latest_marks(per_rank), (min(steps) if steps else None)


def _resumed_from(folder: Path, restart: int) -> int | None:
    for log in sorted(folder.glob(f"rank-r{restart}-*.log")):
        match = re.search(r"resumed from step (\d+)", log.read_text(errors="replace"))
        if match:
            return int(match.group(1))
    return None


@runs(NODE_LOSS, "slurm_requeue")
async def node_loss_requeue(ctx: BenchContext, repeat: int) -> Measured:
    paths = ctx._paths("slurm", "requeue", repeat)
    folder = paths.root / "plain"
    script = paths.root / "job.sh"
    async with slurm_for_run(ctx) as cluster:
        slurm = slurm_settings(cluster)
        script.write_text(requeue_script(ctx, paths, free_port()))
        launched_at = time.time()
        done = cluster.command(
            "sbatch",
            "--parsable",
            "--requeue",
            "-N",
            "2",
            "--ntasks-per-node=1",
            "--job-name=plain-requeue",
            "--open-mode=append",
            f"--output={paths.root}/batch-%j.out",
            str(script),
        )
        if done.returncode != 0:
            raise RuntimeError(f"sbatch failed: {done.stderr.strip()}")
        job_id = int(done.stdout.strip().split(";")[0])
        fault_step = await _wait_step(folder, ctx.shape.fault_step, ctx.shape.job_timeout_s)
        fields = await asyncio.to_thread(_job_fields, cluster, job_id)
        nodes = cluster.command("scontrol", "show", "hostnames", fields.get("NodeList", ""))
        victim = nodes.stdout.split()[VICTIM_RANK]
        killed_at = time.time()
        pids = await asyncio.to_thread(cluster.kill_node, victim)
        watch = _Watch(killed_at)
        first_step_at: float | None = None
        marks: dict[str, float] = {}
        deadline = killed_at + REQUEUE_WAIT_S
        while time.time() < deadline:
            now = time.time()
            node = await asyncio.to_thread(_node_words, cluster, victim)
            job = await asyncio.to_thread(_job_fields, cluster, job_id)
            watch.see(now, node, job)
            if first_step_at is None and watch.requeued_at is not None:
                marks, _ = _first_steps(folder, int(job.get("Restarts", "1") or 1))
                first_step_at = marks.get("first_step")
            if watch.ended_at is not None and (first_step_at is not None or not job):
                break
            if watch.ended_at is not None and watch.requeued_at is None:
                break  # Slurm ended the job instead of requeueing it
            await asyncio.sleep(STATE_POLL_S)
        restart = int(watch.last[2]) if watch.last and watch.last[2].isdigit() else 0
        logged = max_logged_step(sorted(folder.glob("rank-r0-*.log")))
        resumed = _resumed_from(folder, restart) if restart else None
        final = await asyncio.to_thread(_job_fields, cluster, job_id)
    reference = await ctx.reference_weights(2, ctx.shape.steps)
    completed = watch.end_state == "COMPLETED"
    weights_ok = completed and await asyncio.to_thread(weights_match, paths.weights, reference)
    timeline = RecoveryTimeline(
        fault_at=killed_at,
        detected_at=watch.not_responding_at,
        decided_at=watch.requeued_at,
        launch_requested_at=watch.running_again_at,
    ).with_rank_marks(marks)
    recovered = first_step_at is not None
    note = None
    if not recovered:
        note = (
            f"Slurm ended the job ({watch.end_state}) "
            f"{since(killed_at, watch.ended_at) or 0.0:.1f} s after the kill, no requeue"
            if watch.ended_at is not None
            else f"no step of a requeued job within {REQUEUE_WAIT_S:.0f} s of the kill"
        )
    return Measured(
        metrics={
            "fault_step": fault_step,
            **watch.node_metrics(slurm),
            "detected": watch.not_responding_at is not None,
            "detection_from_kill_s": since(killed_at, watch.not_responding_at),
            "job_left_running_after_kill_s": since(killed_at, watch.left_running_at),
            "requeued_after_kill_s": since(killed_at, watch.requeued_at),
            "running_again_after_kill_s": since(killed_at, watch.running_again_at),
            "recovered": recovered,
            "recovery_from_kill_s": since(killed_at, first_step_at),
            "ended_after_kill_s": since(killed_at, watch.ended_at),
            "steps_lost": logged - resumed if logged is not None and resumed is not None else None,
            "resumed_from_step": resumed,
            "completed": completed,
            "weights_ok": weights_ok,
            "launch_to_end_s": since(launched_at, watch.ended_at),
            **phase_metrics(timeline),
        },
        details={
            "job_id": job_id,
            "cluster_root": str(cluster.root),
            "end_state": watch.end_state,
            "fault": {"node": victim, "at": killed_at, "step": fault_step},
            "killed_pids": pids,
            "settings": {
                "sbatch": "--requeue -N 2 --ntasks-per-node=1 --open-mode=append",
                "srun": "--kill-on-bad-exit=0 --cpu-bind=none",
                "slurm": slurm,
            },
            "events": watch.events,
            "final_job": {
                k: final.get(k)
                for k in ("JobState", "Reason", "Restarts", "ExitCode", "NodeList", "Requeue")
            },
            "phases": [d.model_dump() for d in timeline.durations()],
            "script": script.read_text(),
        },
        note=note,
    )


async def _wait_step(folder: Path, step: int, timeout_s: float) -> int:
    """Wait until every rank of the first run reports ``step`` (heartbeat files)."""
    if not await wait_until(lambda: (_first_steps(folder, 0)[1] or 0) >= step, timeout_s):
        raise TimeoutError(f"{folder}: the plain Slurm job never reached step {step}")
    return _first_steps(folder, 0)[1] or step


# --------------------------------------------------------------------------- controller CPU


CPU = scenario(
    "slurm_cpu",
    """The worker's CPU per supervised Slurm node, fault-free, with 2 and with 3 nodes.

    1. start a fresh test Slurm and a holder allocation of n1..n3; restart the worker
       with its ``SLURM_CONF``;
    2. sample the worker's CPU time with no job over ``shape.idle_window_s``;
    3. run the example on n1, n2 (one rank each) for ``shape.cpu_steps`` steps; sample
       the worker's CPU (its threads, and the Slurm commands it ran and reaped:
       ``/proc/<pid>/stat`` utime, stime, cutime, cstime) from 1/6 to 5/6 of its
       steps, and the generation's detached ``srun`` client and its helper;
    4. the same on n1, n2, n3.
    """,
    unavailable=_unavailable,
    references=lambda shape: [(n, shape.cpu_steps) for n in CPU_NODE_COUNTS],
    not_possible={
        "slurm_requeue": "plain Slurm has no per-job controller: its daemons (slurmctld, "
        "slurmd) run whatever the jobs, so there is no per-node supervision cost to compare"
    },
)


def _srun_records(gen: GenerationDir) -> list[dict[str, Any]]:
    """The pid records of the generation's detached ``srun`` clients (one per node)."""
    return [r for p in sorted(gen.path.glob("slurm-srun-*.pid")) if (r := read_json(p))]


def _srun_cpu(gen: GenerationDir) -> float:
    """CPU seconds so far of the generation's detached ``srun`` clients and their
    helpers (the ``slurm_task srun`` processes that wait for them): not the worker's
    children."""
    total = 0.0
    for record in _srun_records(gen):
        pid = int(record["pid"])
        stat = read_stat(pid)
        for one in (pid, stat.ppid if stat else None):
            if one is not None and one > 1:
                with contextlib.suppress(OSError):
                    total += cpu_sample(one).cpu_s
    return total


@runs(CPU, "lazarus")
async def cpu_lazarus(ctx: BenchContext, repeat: int) -> Measured:
    shape = ctx.shape
    outcome = Measured(metrics={"poll_interval_s": shape.health.get("poll_interval_s")})
    async with slurm_for_run(ctx) as cluster:
        allocation = await asyncio.to_thread(cluster.allocate, 3)
        outcome.details["slurm"] = slurm_settings(cluster)
        outcome.details["cluster_root"] = str(cluster.root)
        pid = ctx.stack.worker_pid
        first = cpu_sample(pid)
        await asyncio.sleep(shape.idle_window_s)
        last = cpu_sample(pid)
        outcome.metrics["idle_cpu_ms_per_s"] = (
            1000.0 * (last.cpu_s + last.children_s - first.cpu_s - first.children_s)
        ) / (last.at - first.at)
        steps = shape.cpu_steps
        low, high = steady_window(steps)
        for count in CPU_NODE_COUNTS:
            nodes, prefix = ["n1", "n2", "n3"][:count], f"slurm{count}"

            def build(name: str, paths: JobPaths, nodes: list[str] = nodes) -> JobSpec:
                return _lazarus_spec(ctx, name, paths, allocation, nodes, steps, spare=False)

            async with ctx.job(f"slurm_cpu_{count}", repeat, build, steps=steps) as job:
                await job.reach_step(low)
                pid, gen = ctx.stack.worker_pid, _current_generation(job.run_root)
                first, srun_first = cpu_sample(pid), _srun_cpu(gen)
                await job.reach_step(high)
                last, srun_last = cpu_sample(pid), _srun_cpu(gen)
                common = await job.common_outcome(await job.result())
            ctx.run_roots.pop(job.spec.job_id, None)
            window = last.at - first.at
            own = (last.cpu_s - first.cpu_s) / window
            children = (last.children_s - first.children_s) / window
            srun = (srun_last - srun_first) / window
            outcome.metrics |= {
                f"{prefix}_completed": common.metrics["completed"],
                f"{prefix}_weights_ok": common.metrics["weights_ok"],
                f"{prefix}_window_s": window,
                f"{prefix}_cpu_ms_per_s": (own + children) * 1000.0,
                f"{prefix}_own_cpu_ms_per_s": own * 1000.0,
                f"{prefix}_children_cpu_ms_per_s": children * 1000.0,
                f"{prefix}_srun_client_cpu_ms_per_s": srun * 1000.0,
                f"{prefix}_cpu_ms_per_s_per_node": (own + children) * 1000.0 / count,
                f"{prefix}_cpu_s_per_hour": (own + children) * 3600.0,
            }
            outcome.details[prefix] = {
                **common.details,
                "nodes": [n.name for n in job.spec.nodes],
                "window": {"from": first.__dict__, "to": last.__dict__},
                "srun_clients": _srun_records(gen),
                "srun_client_cpu_s": {"from": srun_first, "to": srun_last},
            }
    two, three = (
        outcome.metrics.get("slurm2_cpu_ms_per_s"),
        outcome.metrics.get("slurm3_cpu_ms_per_s"),
    )
    if isinstance(two, float) and isinstance(three, float):
        outcome.metrics["slurm_marginal_node_cpu_ms_per_s"] = three - two
    return outcome


def _current_generation(run_root: Path) -> GenerationDir:
    generation, _ = chaos.current_step(run_root)
    return GenerationDir.of(chaos.run_root_of(run_root), max(generation, 1))


__all__ = ["CPU", "NODE_LOSS", "requeue_script", "slurm_for_run"]


# --------------------------------------------------------------------------- report

HEADLINE = (
    "detected",
    "detection_from_kill_s",
    "recovered",
    "recovery_from_kill_s",
    "steps_lost",
    "resumed_from_step",
    "spare_used",
    "completed",
    "weights_ok",
    "slurmd_timeout_s",
)
CPU_HEADLINE = (
    "poll_interval_s",
    "idle_cpu_ms_per_s",
    *(
        f"slurm{n}_{suffix}"
        for n in CPU_NODE_COUNTS
        for suffix in (
            "cpu_ms_per_s",
            "own_cpu_ms_per_s",
            "children_cpu_ms_per_s",
            "cpu_ms_per_s_per_node",
            "srun_client_cpu_ms_per_s",
            "weights_ok",
        )
    ),
    "slurm_marginal_node_cpu_ms_per_s",
)


def markdown(stats: Any) -> str:
    """``python -m bench slurm``'s tables: node loss side by side (Lazarus, plain
    Slurm), the phases of each, and the controller CPU per node."""
    from bench import report
    from bench.systems import LABELS, SLURM_SYSTEMS

    parts: list[str] = []
    per_system = stats.get(NODE_LOSS.name, {})
    systems = [s for s in SLURM_SYSTEMS if s in per_system]
    if systems:
        rows = [
            [metric, *map(report.render_cell, cells)]
            for metric in HEADLINE
            if any(cells := [per_system[s].get(metric) or per_system[s].get("*") for s in systems])
        ]
        lines = table(["metric", *(LABELS[s] for s in systems)], rows)
        notes = [
            f"{LABELS[s]}: {c.note}"
            for s in systems
            if (c := per_system[s].get("failed_runs")) is not None and c.note
        ]
        parts.append("\n".join([f"{NODE_LOSS.name}: median (min-max)", "", *lines, *notes]))
        # Plain Slurm's "detected" is the node seen DOWN, its "decision" the requeue, its
        # "launch requested" the job RUNNING again; its rank phases are its ranks' marks.
        phases = report.phase_table(stats, NODE_LOSS.name, SLURM_SYSTEMS)
        if phases is not None:
            parts.append(phases)
    cpu = stats.get(CPU.name, {}).get("lazarus")
    if cpu:
        lines = table(
            ["metric", "median (min-max)"],
            [[m, report.render_cell(cpu.get(m))] for m in CPU_HEADLINE if m in cpu],
        )
        parts.append("\n".join([f"{CPU.name}: Lazarus worker CPU", "", *lines]))
    return "\n\n".join(parts)
