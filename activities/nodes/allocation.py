"""The batch allocation a job's nodes live in, as code outside ``nodes/`` sees it.

Nodes a scheduler hands out live in an allocation that must be checked before a
start, submitted (or resubmitted when the scheduler takes it away), grown, and
given back. Slurm is the only such scheduler today; this module is the one door to
it, so the transport's modules (``slurm_*``) stay behind ``nodes/`` like the agents
(:mod:`activities.nodes.factory`). A refusal is always an
:class:`~activities.nodes.agent.AllocationRefused`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from activities.nodes.slurm import commands as slurm_commands
from activities.nodes.slurm import container as slurm_container
from activities.nodes.slurm import grow as slurm_grow
from activities.nodes.slurm import submit as slurm_submit
from lazarus.domain.contracts import (
    AllocationGranted,
    GrowAllocationRequest,
    SubmitAllocationRequest,
)
from lazarus.domain.spec import JobSpec

Progress = Callable[[str], None]
"""Told one line at a time what the wait is at (queued, submitted, running)."""


def start_problems(spec: JobSpec) -> list[str]:
    """Why the job's allocation cannot be used, one line naming the spec field; empty
    when it can. A ``slurm.container`` with pyxis needs ``srun --container-image``.
    Submit mode asks Slurm whether it would take the holder
    (``sbatch --test-only``: nothing submitted); an existing allocation must be
    running and hold the spec's nodes. No allocation: nothing to check."""
    if spec.slurm is None:
        return []
    container = spec.slurm.container
    if container is not None and container.runtime == "pyxis":
        problem = slurm_container.pyxis_problem()  # srun --help, asked on this machine
        if problem is not None:
            return [problem]
    if spec.slurm.submits:
        return slurm_submit.submit_problems(spec)
    return slurm_commands.allocation_problems(spec.slurm, spec.nodes, spec.spares)


def submit(
    request: SubmitAllocationRequest,
    progress: Progress,
    cancelled: threading.Event | None = None,
) -> AllocationGranted:
    """The job's first allocation, or the successor of an ending one (released first):
    submit it and wait for it to run; a retry adopts what an earlier attempt
    submitted, and a wait called off (``cancelled``) gives back what it submitted."""
    return slurm_submit.resubmit(request, progress, cancelled)


def cancel_submitted(request: SubmitAllocationRequest) -> list[int]:
    """Give back what ``request`` submitted (found by its holder's name, this user's
    jobs only); the ids cancelled."""
    return slurm_submit.cancel_submitted(request)


def grow(request: GrowAllocationRequest, progress: Progress) -> AllocationGranted:
    """Add nodes to the running allocation (Slurm job expansion); a retry adopts
    what an earlier attempt got."""
    return slurm_grow.grow(request, progress)
