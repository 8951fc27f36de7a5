"""Growing a running Slurm allocation by a node (``slurm.grow``): a lost node had no
spare left, and the job would rather wait for Slurm than shrink or stop.

How: Slurm's job expansion (it needs ``SchedulerParameters=permit_job_expansion``
in ``slurm.conf``, an admin's choice):

1. ``salloc --no-shell -N<k> --dependency=expand:J -x <every node the job knows>``
   asks for ``k`` new nodes that may join job ``J``; ``--immediate=<wait_s>`` bounds
   how long it may wait in the queue. ``--no-shell`` leaves the new job without a
   step, which step 2 needs;
2. ``scontrol update jobid=N NumNodes=0`` hands its nodes to ``J``, and ``scancel N``
   ends the now empty job;
3. ``scontrol update jobid=J NumNodes=ALL`` refreshes ``J``'s size (Slurm may answer
   "try again" without an accounting database; the nodes already moved);
4. the grown nodes are those ``squeue`` lists for ``J`` outside the known ones.

A retry of the activity first looks at ``J``: nodes it has beyond the known ones
are an earlier attempt's, and are returned as they are. A leftover request of an
earlier attempt is cancelled before a new one: only this user's jobs with the
request's name, which carries the workflow run's key and the generation
(:attr:`~lazarus.domain.contracts.GrowAllocationRequest.request_name`), and never a
job the workflow recorded as its own allocation (issue 26: another user's job of
the same name, or another run's, is not ours to cancel). Any
refusal (expansion not permitted, no node free within ``wait_s``) is
:class:`GrowRefused`, one line with Slurm's words; the workflow then shrinks or
asks a person.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from activities.nodes.agent import AllocationRefused
from activities.nodes.slurm.commands import (
    RUNNING,
    SlurmCommandFailed,
    allocation,
    one_line,
    run_slurm,
)
from activities.nodes.slurm.submit import cancel, own_jobs_named
from lazarus.domain.contracts import AllocationGranted, GrowAllocationRequest

_GRANTED = re.compile(r"Granted job allocation (\d+)")
MERGE_WAIT_S = 30.0
"""How long the merged nodes may take to show in ``squeue`` for the grown job."""


class GrowRefused(AllocationRefused):
    """Slurm would not add a node to the allocation; the message says why."""


def _salloc_error(text: str) -> str:
    return one_line(text.replace("salloc: error:", "")) or "no reason given"


def _new_nodes(job_id: int, known: list[str]) -> list[str]:
    found = allocation(job_id)
    if found is None or found.state != RUNNING:
        state = found.state if found else "gone"
        raise GrowRefused(f"Slurm job {job_id} is {state}: there is no allocation to grow")
    return [n for n in found.nodes if n not in known]


def grow(request: GrowAllocationRequest, progress: Callable[[str], None]) -> AllocationGranted:
    """Add ``request.count`` nodes to the running allocation; the new nodes."""
    job_id = request.slurm.allocation_id
    started = time.monotonic()
    try:
        already = _new_nodes(job_id, request.known_nodes)
        if len(already) >= request.count:
            progress(f"Slurm job {job_id} already has {', '.join(already)}")
            return AllocationGranted(job_id=job_id, nodes=already[: request.count])
        name = request.request_name
        for leftover in own_jobs_named(name, exclude=[job_id, *request.known_job_ids]):
            progress(f"cancelling Slurm job {leftover.job_id}, an earlier attempt's request")
            cancel(leftover.job_id)
        wait_s = request.slurm.wait_s
        argv = [
            "salloc",
            "--no-shell",
            f"--immediate={wait_s}",
            f"--job-name={name}",
            "-N",
            str(request.count),
            f"--dependency=expand:{job_id}",
        ]
        excluded = sorted({*request.known_nodes, *request.exclude})
        if excluded:
            argv.append(f"--exclude={','.join(excluded)}")
        progress(f"asking Slurm for {request.count} more node(s) for job {job_id}")
        done = run_slurm(argv, timeout_s=wait_s + 60)
        granted = _GRANTED.search(done.stderr + done.stdout)
        if done.returncode != 0 or granted is None:
            raise GrowRefused(f"Slurm refuses to grow job {job_id}: {_salloc_error(done.stderr)}")
        extra = int(granted.group(1))
        merged = run_slurm(["scontrol", "update", f"jobid={extra}", "NumNodes=0"])
        cancel(extra)
        if merged.returncode != 0:
            raise GrowRefused(
                f"Slurm would not merge job {extra} into job {job_id}: "
                f"{one_line(merged.stderr or merged.stdout)}"
            )
        run_slurm(["scontrol", "update", f"jobid={job_id}", "NumNodes=ALL"])
        deadline = time.monotonic() + MERGE_WAIT_S
        while len(grown := _new_nodes(job_id, request.known_nodes)) < request.count:
            if time.monotonic() > deadline:
                raise GrowRefused(f"job {job_id} did not show its new node(s) in squeue")
            time.sleep(0.5)
    except SlurmCommandFailed as exc:
        raise GrowRefused(f"cannot ask Slurm to grow job {job_id}: {exc}") from None
    progress(f"Slurm job {job_id} grew by {', '.join(grown)}")
    return AllocationGranted(
        job_id=job_id,
        nodes=grown[: request.count],
        waited_s=round(time.monotonic() - started, 3),
    )
