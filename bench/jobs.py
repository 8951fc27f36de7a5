"""The job every benchmark runs: the example DDP script, its shape, spec and control.

Its reference weights (one plain fault-free run, compared bit for bit) are
:mod:`infra.reference_run`'s, which the tests use too.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from infra.reference_run import EXAMPLE as EXAMPLE
from infra.reference_run import REPO as REPO
from infra.reference_run import WORLD_SIZE as WORLD_SIZE
from lazarus.app.client import JobClient, JobHandle
from lazarus.domain.spec import JobSpec, parse_spec
from workflows.state import JobInput, JobStatus


@dataclass(frozen=True)
class JobShape:
    """How big the benchmark job is and how Lazarus watches it; recorded in every result."""

    steps: int = 120
    step_time_s: float = 0.1
    ckpt_every: int = 20
    fault_step: int = 50
    """Faults are injected once the job reports this step."""
    hang_timeout_s: float = 10.0
    worker_down_s: float = 3.0
    """How long the worker stays dead in the controller-crash scenarios and the soak."""
    pause_hold_s: float = 2.0
    """pause_resume: how long the job stays paused (the ``pause`` scenario: 0)."""
    straggler_steps: int = 240
    """straggler: the job's steps (it has one rank on each of 2 nodes, plus a spare)."""
    straggler_from_step: int = 50
    straggler_until_step: int = 200
    """straggler: node n2's rank is slow for steps [from, until)."""
    straggler_factor: float = 2.0
    """straggler: how much slower (``--slow-factor``)."""
    health: dict[str, float] = field(
        default_factory=lambda: {"startup_timeout_s": 120.0, "poll_interval_s": 0.5}
    )
    """Other ``health`` fields; everything not named keeps the spec's default."""
    recovery: dict[str, float] = field(default_factory=dict)
    """``recovery`` overrides; empty keeps the spec's defaults, as a user would."""
    job_timeout_s: float = 300.0
    """Give up on a job that has not finished after this long."""
    node_timeout_s: float = 5.0
    """Multi-node scenarios: a node unreachable this long is lost (``node_timeout_s``)."""
    ssh_connect_timeout_s: float = 2.0
    """Multi-node scenarios: ``ssh.connect_timeout_s``."""
    ssh_command_timeout_s: float = 2.0
    """Multi-node scenarios: ``ssh.command_timeout_s`` (a poll that takes longer fails)."""
    cpu_steps: int = 150
    """slurm_cpu: training steps of each supervised job."""
    idle_window_s: float = 10.0
    """slurm_cpu: how long the worker's CPU is sampled with no job at all."""
    state_mb: int = 0
    """Extra training state every rank carries (the example's ``--state-mb``): what
    ``bench state-scale`` sizes; 0 for every other benchmark."""

    @classmethod
    def quick(cls) -> JobShape:
        """A tiny job for smoke tests: seconds per scenario, numbers meaningless."""
        return cls(
            steps=30,
            step_time_s=0.05,
            ckpt_every=5,
            fault_step=12,
            # Not less: a loaded 2-core machine takes seconds to tear a finished rank
            # down, and a 3 s hang clock then relaunched finished jobs (defect 19).
            hang_timeout_s=8.0,
            worker_down_s=1.0,
            pause_hold_s=0.2,
            straggler_steps=40,
            straggler_from_step=10,
            straggler_until_step=30,
            health={"startup_timeout_s": 60.0, "poll_interval_s": 0.2},
            recovery={"backoff_initial_s": 0.2, "stop_grace_s": 2.0},
            job_timeout_s=120.0,
            cpu_steps=30,
            idle_window_s=2.0,
        )

    def health_section(self, **fields: float) -> dict[str, float]:
        """The spec's ``health`` for this job (:func:`build_spec`'s), ``fields`` over it."""
        return {"hang_timeout_s": self.hang_timeout_s, **self.health, **fields}

    def with_steps(self, steps: int) -> JobShape:
        """Scale the fault step with a new step count (about 5/12 of the way in),
        keeping at least one checkpoint before the fault."""
        fault_step = max(self.ckpt_every + 1, steps * self.fault_step // self.steps)
        if fault_step >= steps:
            raise ValueError(
                f"--steps {steps} is too few: the fault needs a checkpoint "
                f"(every {self.ckpt_every} steps) before it and steps after it"
            )
        return JobShape(**{**asdict(self), "steps": steps, "fault_step": fault_step})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class JobPaths:
    """Everything one benchmark job writes lives under ``root``."""

    root: Path

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def run_dir(self) -> Path:
        return self.root / "runs"

    @property
    def weights(self) -> Path:
        return self.root / "out" / "model.pt"


def flags(**values: object) -> list[str]:
    """``--name value`` per keyword, ``_`` as ``-`` (``ckpt_every=10``: ``--ckpt-every 10``)."""
    return [part for k, v in values.items() for part in (f"--{k.replace('_', '-')}", str(v))]


def build_spec(
    name: str,
    paths: JobPaths,
    shape: JobShape,
    *,
    nproc_per_node: int = WORLD_SIZE,
    steps: int | None = None,
    extra: Mapping[str, object] | None = None,
) -> JobSpec:
    """The example under Lazarus (by default 2 ranks on this machine), every path
    absolute and inside ``paths.root``. ``extra`` adds or replaces top-level spec
    fields (``nodes``, ``spares``, ``ssh``, ``env``...) for multi-node jobs."""
    paths.root.mkdir(parents=True, exist_ok=True)
    data: dict[str, object] = {
        "name": name,
        "command": [
            sys.executable,
            str(EXAMPLE),
            *flags(
                steps=shape.steps if steps is None else steps,
                step_time=shape.step_time_s,
                ckpt_every=shape.ckpt_every,
                out=paths.weights,
            ),
            *(flags(state_mb=shape.state_mb) if shape.state_mb else []),
        ],
        "workdir": str(paths.root),
        "nproc_per_node": nproc_per_node,
        "checkpoint_dir": str(paths.checkpoints),
        "run_dir": str(paths.run_dir),
        "health": shape.health_section(),
        "recovery": dict(shape.recovery),
        **(extra or {}),
    }
    return parse_spec(data, "<bench>").resolved(paths.root)


class JobControl:
    """One Lazarus job as the bench drives it, through :class:`lazarus.app.client.JobClient`
    (the supported Python API), so the bench exercises what users call.

    Two things the client deliberately does not offer stay here: ``terminate`` (a
    bench-only hard stop that skips the workflow's own cleanup) and ``handle``, the
    raw workflow handle the chaos matrix signals directly, in phases where the
    client would refuse to send anything."""

    def __init__(self, jobs: JobClient, job: JobHandle) -> None:
        self.jobs = jobs
        self.job = job

    @classmethod
    async def start(
        cls, client: Client, spec: JobSpec, task_queue: str, **input_fields: Any
    ) -> JobControl:
        """Start ``spec``'s workflow; ``input_fields`` set other :class:`JobInput` fields."""
        jobs = JobClient(client, task_queue=task_queue)
        return cls(jobs, await jobs.start(JobInput(spec=spec, **input_fields)))

    @property
    def handle(self) -> WorkflowHandle[Any, JobStatus]:
        return self.jobs.temporal.get_workflow_handle(self.job.workflow_id, result_type=JobStatus)

    @property
    def workflow_id(self) -> str:
        return self.job.workflow_id

    @property
    def first_run_id(self) -> str:
        if not self.job.run_id:
            raise RuntimeError(f"{self.job.workflow_id}: started without a run id")
        return self.job.run_id

    async def status(self) -> JobStatus:
        return await self.jobs.query(self.job)

    async def pause(self) -> None:
        await self.jobs.pause(self.job)

    async def resume(self) -> None:
        await self.jobs.resume(self.job)

    async def force_recover(self, reason: str) -> None:
        await self.jobs.recover(self.job, reason=reason)

    async def result(self) -> JobStatus:
        return await self.jobs.result(self.job)

    async def terminate(self, reason: str) -> None:
        await self.handle.terminate(reason)
