"""Preemption on Slurm: the allocation's holder script, and the notice that the
allocation is going away.

The holder (:func:`holder_script`, submitted by
:mod:`activities.nodes.slurm.submit`) turns Slurm's USR1 into a file on the
shared filesystem; :func:`preemption_notice` reads it, and asks Slurm whether the
allocation still runs when the job's shared steps answer does not show it running.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from pathlib import Path

from activities.nodes.slurm.commands import RUNNING, SlurmCommandFailed, job_state
from activities.nodes.slurm.rounds import SlurmRounds, Steps
from lazarus.domain.checkpoint_layout import TEMP_SUFFIX
from lazarus.domain.spec import PREEMPT_MARKER_PREFIX, SlurmSpec


def holder_script(run_dir: str | Path) -> str:
    """The allocation's holder (``sbatch --signal=B:USR1@<s> --wrap``): it sleeps, and
    when Slurm sends USR1 (preemption, or the time limit ``<s>`` seconds away) writes
    the notice file with the time, atomically. Why a file: Slurm signals the batch
    shell only, and the controller may run anywhere; the run directory is on the
    shared filesystem, which supervision already reads every poll. POSIX sh: the
    ``wait`` returns at once when a trapped signal arrives, the loop waits again."""
    folder = shlex.quote(str(Path(run_dir)))
    return (
        f'marker={folder}/{PREEMPT_MARKER_PREFIX}"$SLURM_JOB_ID"; '  # SlurmSpec.preempt_marker
        f'trap \'date +%s > "$marker{TEMP_SUFFIX}" && mv "$marker{TEMP_SUFFIX}" "$marker"\' USR1; '
        "sleep 2147483647 & child=$!; "
        'while kill -0 "$child" 2>/dev/null; do wait "$child"; done'
    )


def runs(steps: Steps) -> bool:
    """Whether a steps answer shows its allocation running: it lists steps, every one
    RUNNING. Only a running allocation has running steps, so then its own state need
    not be asked."""
    if not steps:
        return False
    return all(state == RUNNING for _, state in steps.values())


def preemption_notice(
    slurm: SlurmSpec,
    marker: str | None,
    handled_at: float | None,
    rounds: SlurmRounds | None = None,
) -> tuple[float, str] | None:
    """Why the allocation is going away, with when (wall clock), or None. The holder's
    notice first (the ranks still run: a just-in-time checkpoint can save them), then
    the allocation itself no longer RUNNING (time limit without a signal, cancelled):
    the ranks are gone with it. A notice at or before ``handled_at`` was handled.
    Slurm unreachable is no evidence of anything: None.

    With ``rounds`` (supervision's shared answers) the allocation's state is asked
    only when the shared steps answer does not show it running (:func:`runs`: an
    allocation that ended lists no running step) or a poll just saw one of its ranks
    end (a ``scancel`` of the allocation SIGTERMs the ranks at once, before a shared
    steps answer shows it: then the state is asked afresh, and the preemption wins
    over the crashes). In steady state the check costs no Slurm command (issue 29:
    at most 1 a second per job). Without ``rounds``, it is asked every call."""
    if marker is not None:
        path = Path(marker)
        with contextlib.suppress(OSError):
            at = path.stat().st_mtime
            if handled_at is None or at > handled_at:
                return at, (
                    f"Slurm signalled the holder of job {slurm.allocation_id} (USR1: preemption, "
                    f"or the time limit is near): notice {path}"
                )
    try:
        if rounds is None:
            state = job_state(slurm.allocation_id)
        else:
            job = str(slurm.allocation_id)
            steps, asked = rounds.steps(job)
            ended = rounds.rank_ended_at(job)
            if runs(steps):
                if ended is None:
                    return None
                after = ended  # newer news than the steps answer's: asked after it
            else:
                after = asked if ended is None else max(asked, ended)
            state = rounds.job_state(slurm.allocation_id, asked_after=after)
    except SlurmCommandFailed:
        return None
    if state == RUNNING:
        return None
    state = state or "gone (squeue no longer lists it)"
    return time.time(), (
        f"Slurm job {slurm.allocation_id} is {state}: the allocation ended "
        "(time limit or preemption) with no notice seen"
    )
