"""Every metric a benchmark scenario reports: one name, one unit, one meaning.

The recovery and comparison benchmarks used to share names for different
things (``detection_s`` was the incident's own detection time in one and the
time from the injected fault in the other). Here every name has exactly one
definition; a scenario may only report names in :data:`METRICS` (a unit test
runs every scenario's metric names through :func:`lookup`), and the README's
metric section is this module in prose.

Times named ``..._from_injection_s`` or ``..._outside_s`` start at the moment the
bench injected the fault (its own clock); plain ``detection_s`` and
``recovery_s`` are the controller's incident figures, which start at the fault
as the controller dates it (a crash: when the rank's wrapper saw it die; a hang:
the rank's last progress, before the bench's SIGSTOP).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lazarus.domain.recovery_timeline import PHASES

Value = float | int | bool | None
"""What one run reports for one metric (None: not measured in this run)."""


@dataclass(frozen=True)
class MetricDef:
    name: str
    """The metric's name; ``<node>`` / ``<job>`` stand for a host or job label."""
    unit: str
    """``s``, ``ms``, ``steps``, ``count``, ``bool``, ``ratio``, ``steps/s``, ..."""
    meaning: str


_DEFS: tuple[MetricDef, ...] = (
    # ----------------------------------------------------------------- any finished job
    MetricDef(
        "completed", "bool", "the job ended successfully (Lazarus: SUCCEEDED; torchrun: exit 0)"
    ),
    MetricDef(
        "weights_ok", "bool", "its final weights equal a plain fault-free run's, bit for bit"
    ),
    MetricDef("generations", "count", "rank generations launched (1: never relaunched)"),
    MetricDef("incidents", "count", "incidents the controller recorded"),
    MetricDef("max_live_ranks", "count", "most rank processes alive at once, all generations"),
    MetricDef("duplicate_ranks", "bool", "more rank processes alive at once than the world size"),
    MetricDef("history_events", "events", "workflow history events, across continue-as-new"),
    MetricDef("workflow_runs", "count", "workflow runs in the continue-as-new chain"),
    MetricDef("history_events_per_generation", "events", "history_events / generations"),
    MetricDef("job_elapsed_s", "s", "the workflow's own start-to-finish time (its status)"),
    MetricDef("wall_s", "s", "the bench's launch of the job to its end, by the bench's clock"),
    MetricDef("wall_vs_clean", "ratio", "wall_s over the same system's fault-free median"),
    MetricDef("steps_per_s", "steps/s", "training rate over steps 1/6 to 5/6 of the job"),
    MetricDef("launch_to_first_step_s", "s", "the bench's launch to the job's first step"),
    # ----------------------------------------------------------------- an injected fault
    MetricDef("fault_step", "steps", "the step the job had reported when the fault was injected"),
    MetricDef(
        "detected",
        "bool",
        "the controller noticed the fault (an incident, or torchrun's agent said so)",
    ),
    MetricDef("named_rank_ok", "bool", "the incident names the rank the fault hit"),
    MetricDef(
        "detection_s",
        "s",
        "the controller's incident: detected_at - fault_at, with fault_at as the "
        "controller dates the fault (crash: the wrapper saw the rank die; hang: the "
        "rank's last progress; node loss: the node's last good poll)",
    ),
    MetricDef(
        "detection_from_injection_s",
        "s",
        "the bench injected the fault (signal sent, slowdown began) to the controller "
        "noticing it (Lazarus: the incident's or straggler record's detected_at; "
        "torchrun: the agent's first line saying a worker failed)",
    ),
    MetricDef(
        "detection_by_samples_s",
        "s",
        "straggler: the straggler record's own detection_s (from its first slow sample)",
    ),
    MetricDef(
        "detection_from_kill_s", "s", "node_loss: the incident's detected_at minus the host kill"
    ),
    MetricDef("recovered", "bool", "a later generation completed a step after the fault"),
    MetricDef(
        "recovery_s",
        "s",
        "the controller's incident: fault_at (as in detection_s) to the first step of "
        "the new generation, as the supervisor saw it",
    ),
    MetricDef(
        "recovery_outside_s",
        "s",
        "the injected fault to the first step completed by a later generation, by the "
        "rank's own record (Lazarus: heartbeat file time; torchrun: its log line)",
    ),
    MetricDef(
        "survivors_first_step_s",
        "s",
        "torchft: the injected fault to the survivors' first committed step (they train "
        "on without the failed group; recovery_outside_s is when it is back: the job at "
        "full world size). For every other system the first step of any kind after a "
        "fault is recovery_outside_s",
    ),
    MetricDef(
        "state_loaded_outside_s",
        "s",
        "the injected fault to the moment the last rank of the new generation holds its "
        "state (the timeline's checkpoint_loaded, the latest rank's): training resumes, "
        "its first step begins; recovery_outside_s adds that step",
    ),
    MetricDef(
        "recovery_outside_seen_s",
        "s",
        "as recovery_outside_s, to when the bench read that heartbeat (<= 50 ms later)",
    ),
    MetricDef(
        "recovery_from_kill_s", "s", "node_loss: the incident's first-step time minus the host kill"
    ),
    MetricDef(
        "steps_lost",
        "steps",
        "steps done before a fault and done again after it: the highest step reached "
        "before the next generation minus the step it resumed from, summed over the "
        "job's recoveries (from the rank logs where the bench reads them: crash, hang, "
        "pause; else the controller's incidents or planned stops)",
    ),
    MetricDef("resumed_from_step", "steps", "the checkpoint step the next generation resumed from"),
    MetricDef(
        "stopped_after_s",
        "s",
        "the injected fault to the controller's stop of the old generation (incident)",
    ),
    MetricDef(
        "relaunched_after_s",
        "s",
        "the injected fault to the new generation's launch (incident; torchrun: its ranks seen)",
    ),
    MetricDef(
        "relaunch_to_first_step_s",
        "s",
        "the new generation's launch to its first step (start-up: python, torch, rendezvous)",
    ),
    MetricDef("hang_timeout_s", "s", "the spec's health.hang_timeout_s"),
    # ----------------------------------------------------------------- controller crash
    MetricDef("worker_down_s", "s", "Lazarus: the worker's SIGKILL to its restart"),
    MetricDef(
        "steps_while_worker_down", "steps", "steps the job made while the controller was dead"
    ),
    MetricDef(
        "ranks_alive_after_kill",
        "count",
        "torchrun: rank processes still alive after the agent was killed",
    ),
    MetricDef(
        "training_survived",
        "bool",
        "completed with the right weights despite the controller's death",
    ),
    MetricDef(
        "supervised_after", "bool", "a controller watched the job to its end after the crash"
    ),
    # ----------------------------------------------------------------- worker takeover
    MetricDef(
        "supervisor_heartbeat_timeout_s", "s", "the spec's health.supervisor_heartbeat_timeout_s"
    ),
    MetricDef(
        "takeover_s",
        "s",
        "SIGKILL of the worker running supervise to a surviving worker's attempt starting",
    ),
    MetricDef(
        "takeover_first_heartbeat_s",
        "s",
        "SIGKILL of the worker running supervise to the survivor's first heartbeat (server)",
    ),
    MetricDef(
        "heartbeat_interval_s",
        "s",
        "median gap between supervise heartbeats the server recorded (one job's load)",
    ),
    MetricDef("heartbeats_per_min", "count", "60 / heartbeat_interval_s: heartbeat calls per job"),
    # ----------------------------------------------------------------- pause
    MetricDef("pause_to_paused_s", "s", "the pause signal to the job's PAUSED phase"),
    MetricDef("pause_to_ranks_stopped_s", "s", "the pause signal to no rank process alive"),
    MetricDef(
        "resume_to_first_step_s", "s", "the resume signal to the next generation's first step"
    ),
    MetricDef("jit_checkpoint_ok", "bool", "the pause saved a just-in-time checkpoint"),
    MetricDef("jit_checkpoint_s", "s", "the planned stop's own checkpoint time"),
    MetricDef(
        "signal_to_checkpoint_s", "s", "the pause signal to the JIT checkpoint's COMMITTED marker"
    ),
    # ----------------------------------------------------------------- straggler
    MetricDef(
        "before_steps_per_s",
        "steps/s",
        "training rate before the slow stretch (from 1/5 of its start)",
    ),
    MetricDef("stretch_s", "s", "time the job took over the slow stretch (by the high-water mark)"),
    MetricDef("stretch_steps_per_s", "steps/s", "training rate over the slow stretch"),
    MetricDef("straggler_detected", "bool", "the controller recorded a straggler"),
    MetricDef("found_ok", "bool", "the first straggler recorded is the slowed node"),
    MetricDef("slowdown_injected", "x", "the slow node's step-time factor (--slow-factor)"),
    MetricDef("slowdown_measured", "x", "the slowdown the straggler record measured"),
    MetricDef("slowdown_factor", "x", "the spec's straggler.slowdown_factor threshold"),
    MetricDef("window_s", "s", "the spec's straggler.window_s"),
    MetricDef("swapped", "bool", "the job ended on the spare node (the straggler was replaced)"),
    # ----------------------------------------------------------------- schedule
    MetricDef("ettr", "ratio", "the controller's effective training time ratio"),
    MetricDef("mttr_s", "s", "the controller's mean time to recovery"),
    MetricDef("stragglers_swapped", "count", "straggler records whose action was replace_node"),
    MetricDef("unhandled", "bool", "the job did not end SUCCEEDED"),
    # ----------------------------------------------------------------- multi-node
    MetricDef("node_timeout_s", "s", "the spec's node_timeout_s"),
    MetricDef("ssh_connect_timeout_s", "s", "the spec's ssh.connect_timeout_s"),
    MetricDef("ssh_command_timeout_s", "s", "the spec's ssh.command_timeout_s"),
    MetricDef("poll_interval_s", "s", "the spec's health.poll_interval_s"),
    MetricDef("node_lost_ok", "bool", "the first incident is node_lost naming the killed host"),
    MetricDef(
        "spare_used",
        "bool",
        "the spare is active and the killed host is not (torchrun: the standby agent's "
        "host runs ranks of the restarted generation)",
    ),
    MetricDef(
        "rejoin_used",
        "bool",
        "multi-node: the spec took rejoin in place on ssh nodes (False: refused, the "
        "run restarted whole generations; the reason is in details.setup)",
    ),
    MetricDef("stopped_after_kill_s", "s", "the host kill to the old generation's stop (incident)"),
    MetricDef("relaunched_after_kill_s", "s", "the host kill to the relaunch (incident)"),
    MetricDef(
        "stopped_after_kill_outside_s", "s", "the host kill to stopped.json of the old generation"
    ),
    MetricDef(
        "launched_after_kill_outside_s", "s", "the host kill to launch.json of the new generation"
    ),
    MetricDef("nodes", "count", "test hosts polled"),
    MetricDef("polls_per_node", "count", "warm polls per node"),
    MetricDef("polls_ok", "bool", "every poll reached its node and saw its rank alive"),
    MetricDef(
        "first_poll_with_connect_ms", "ms", "a fresh connection's first poll (median over nodes)"
    ),
    MetricDef("<node>_median_ms", "ms", "a warm poll of that node, median"),
    MetricDef("<node>_p95_ms", "ms", "a warm poll of that node, 95th percentile"),
    MetricDef("reported_round_trip_median_ms", "ms", "the agent's own round_trip_s, median"),
    MetricDef("all_sequential_median_ms", "ms", "one poll of every node one after another, median"),
    MetricDef("all_concurrent_median_ms", "ms", "one poll of every node at once (on_each), median"),
    MetricDef("all_concurrent_p95_ms", "ms", "one poll of every node at once, 95th percentile"),
    MetricDef(
        "back_to_back_median_ms",
        "ms",
        "a node polled again as soon as the last poll returned, median",
    ),
    MetricDef("back_to_back_p95_ms", "ms", "as back_to_back_median_ms, 95th percentile"),
    MetricDef("idle_cpu_ms_per_s", "ms/s", "the worker's CPU time per second with no job"),
    MetricDef("<job>_completed", "bool", "controller_cpu: that job completed"),
    MetricDef("<job>_weights_ok", "bool", "controller_cpu: that job's weights match the reference"),
    MetricDef("<job>_window_s", "s", "controller_cpu: the CPU sampling window (steps 1/6 to 5/6)"),
    MetricDef(
        "<job>_cpu_ms_per_s", "ms/s", "controller_cpu: the worker's CPU time per second of that job"
    ),
    MetricDef(
        "<job>_cpu_s_per_hour", "s/h", "controller_cpu: the same, CPU seconds per training hour"
    ),
    MetricDef("ssh4_over_local1", "ratio", "ssh4_cpu_ms_per_s / local1_cpu_ms_per_s"),
    # ----------------------------------------------------------------- Slurm
    MetricDef("slurmd_timeout_s", "s", "the test Slurm's SlurmdTimeout (scontrol show config)"),
    MetricDef(
        "job_left_running_after_kill_s",
        "s",
        "plain Slurm: the node kill to the job first seen not RUNNING (polled every 0.2 s)",
    ),
    MetricDef(
        "requeued_after_kill_s",
        "s",
        "plain Slurm: the node kill to the job's restart count first seen above 0",
    ),
    MetricDef(
        "running_again_after_kill_s",
        "s",
        "plain Slurm: the node kill to the requeued job seen RUNNING again",
    ),
    MetricDef(
        "ended_after_kill_s",
        "s",
        "plain Slurm: the node kill to the job seen in a final state (COMPLETED, FAILED, "
        "NODE_FAIL...)",
    ),
    MetricDef(
        "node_not_responding_after_kill_s",
        "s",
        "Slurm: the node kill to the victim first shown not responding (``*``) or DOWN by "
        "scontrol (polled every 0.2 s)",
    ),
    MetricDef(
        "node_down_after_kill_s",
        "s",
        "Slurm: the node kill to the victim first shown DOWN by scontrol (polled every 0.2 s)",
    ),
    MetricDef("launch_to_end_s", "s", "plain Slurm: sbatch to the job seen in a final state"),
    MetricDef(
        "<job>_own_cpu_ms_per_s",
        "ms/s",
        "slurm_cpu: the worker's own CPU (every thread) per second of that job",
    ),
    MetricDef(
        "<job>_children_cpu_ms_per_s",
        "ms/s",
        "slurm_cpu: CPU of the Slurm commands the worker ran and reaped (squeue, scontrol, "
        "srun shims: cutime + cstime) per second of that job",
    ),
    MetricDef(
        "<job>_srun_client_cpu_ms_per_s",
        "ms/s",
        "slurm_cpu: the generation's detached srun client and its waiting helper, per second",
    ),
    MetricDef(
        "<job>_cpu_ms_per_s_per_node",
        "ms/s",
        "slurm_cpu: <job>_cpu_ms_per_s (worker and its reaped commands) over the nodes it "
        "supervises",
    ),
    MetricDef(
        "slurm_marginal_node_cpu_ms_per_s",
        "ms/s",
        "slurm_cpu: slurm3_cpu_ms_per_s - slurm2_cpu_ms_per_s: what one more node costs",
    ),
    # ----------------------------------------------------------------- summaries only
    MetricDef("failed_runs", "count", "runs that raised (summaries only)"),
    MetricDef("skipped_runs", "count", "runs skipped: prerequisites missing here (summaries only)"),
)

PHASE_METRICS: tuple[tuple[str, str], ...] = tuple(
    (f"phase_{field.removesuffix('_at')}_s", label) for field, label in PHASES[1:]
)
"""``(metric, phase label)`` for each recovery phase after the fault, in the order a
recovery reaches them (:data:`lazarus.domain.recovery_timeline.PHASES`)."""

_DEFS += tuple(
    MetricDef(
        name,
        "s",
        f"crash, hang, node_loss: the recovery's phase '{label}': seconds from the previous "
        "phase reached "
        "(Lazarus: the incident's timeline, fault as the controller dates it, rank phases "
        "from the rank helper's marks; torchrun: the bench's injection, the agent's first "
        "line saying a worker failed, the restarted ranks' process start, their first step)",
    )
    for name, label in PHASE_METRICS
)

METRICS: dict[str, MetricDef] = {m.name: m for m in _DEFS}
_PLACEHOLDER = re.compile(r"<(node|job)>")
_PATTERNS: list[tuple[re.Pattern[str], MetricDef]] = [
    (re.compile("^" + _PLACEHOLDER.sub("[a-z]+[0-9]+", m.name) + "$"), m)
    for m in _DEFS
    if _PLACEHOLDER.search(m.name)
]


def lookup(name: str) -> MetricDef:
    """The definition of ``name``; ``KeyError`` naming it when it has none."""
    if name in METRICS:
        return METRICS[name]
    for pattern, definition in _PATTERNS:
        if pattern.match(name):
            return definition
    raise KeyError(f"metric {name!r} is not in bench.metrics.METRICS: define it there first")


def markdown() -> str:
    """The dictionary as a markdown table (for the README)."""
    lines = ["| metric | unit | meaning |", "|---|---|---|"]
    lines += [f"| `{m.name}` | {m.unit} | {m.meaning} |" for m in _DEFS]
    return "\n".join(lines)
