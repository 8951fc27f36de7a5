"""What every chaos cell must still hold after its fault, checked from the outside.

The controller's own report is not trusted: the census reads /proc through the
run directory's pid files in a background thread for the whole cell, and the
leftovers are looked for on disk and in /proc after the job ended.
"""

from __future__ import annotations

import fcntl
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.measure import BackgroundSampler
from lazarus import chaos
from lazarus.activities.nodes.rundir import generations_below
from lazarus.domain.checkpoint_layout import TEMP_SUFFIX
from lazarus.workflows.state import JobStatus, Phase

CENSUS_INTERVAL_S = 0.05
RANKS_GONE_WAIT_S = 15.0
"""After the job ended, its ranks get this long to exit before they count as left behind."""
TEMP_PATTERNS = (f"*{TEMP_SUFFIX}", ".*.tmp")
"""The rank helper's checkpoint temp files and ``write_json_atomic``'s."""


class GenerationCensus(BackgroundSampler):
    """Samples, every 50 ms, which generations have a live rank process: two at once
    is the split brain the launcher's fencing exists to prevent."""

    def __init__(self, job_run_root: Path, interval_s: float = CENSUS_INTERVAL_S) -> None:
        super().__init__(interval_s, name="chaos-census")
        self.job_run_root = job_run_root
        self.samples = 0
        self.max_live_ranks = 0
        self.overlaps: list[dict[str, int]] = []
        """Samples where more than one generation had live ranks: ranks per generation."""

    def sample(self) -> None:
        live = live_ranks_by_generation(self.job_run_root)
        self.samples += 1
        self.max_live_ranks = max(self.max_live_ranks, sum(live.values()))
        if len(live) > 1 and len(self.overlaps) < 20:
            self.overlaps.append(live)


def live_ranks_by_generation(job_run_root: Path) -> dict[str, int]:
    """Live rank processes per generation folder (relative to the job directory),
    across every run of the job: two starts' generations overlapping count too."""
    return {
        str(path.relative_to(job_run_root)): len(pids)
        for path, pids in chaos.live_ranks_by_generation(job_run_root).items()
    }


@dataclass
class Verdict:
    """Each invariant's result; ``violations`` says, in words, what did not hold."""

    checks: dict[str, bool] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def check(self, name: str, held: bool, why: str) -> None:
        self.checks[name] = held
        if not held:
            self.violations.append(f"{name}: {why}")

    @property
    def held(self) -> bool:
        return not self.violations


def held_locks(job_run_root: Path) -> list[str]:
    """Generation lock files somebody still holds (a non-blocking flock fails)."""
    held: list[str] = []
    for gen in generations_below(job_run_root):
        if not gen.lock_file.exists():
            continue
        with open(gen.lock_file, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(str(gen.lock_file))
            else:
                fcntl.flock(handle, fcntl.LOCK_UN)
    return held


def temp_files(*roots: Path) -> list[str]:
    found: list[str] = []
    for root in roots:
        if root.is_dir():
            for pattern in TEMP_PATTERNS:
                found.extend(str(p) for p in root.rglob(pattern))
    return sorted(found)


def wait_ranks_gone(job_run_root: Path, timeout_s: float = RANKS_GONE_WAIT_S) -> dict[str, int]:
    """Live ranks once they had ``timeout_s`` to exit (a finished job's ranks exit
    by themselves; a deadline on their exit, not a speed)."""
    deadline = time.monotonic() + timeout_s
    live = live_ranks_by_generation(job_run_root)
    while live and time.monotonic() < deadline:
        time.sleep(0.1)
        live = live_ranks_by_generation(job_run_root)
    return live


def judge(
    status: JobStatus,
    expected: tuple[Phase, ...],
    weights_ok: bool | None,
    census: GenerationCensus,
    world_size: int,
    ckpt_every: int,
    job_run_root: Path,
    checkpoint_dir: Path,
) -> Verdict:
    """Every invariant of the matrix for one finished job. ``weights_ok`` None skips
    the weights (a job that rightly ends NEEDS_OPERATOR has no final weights)."""
    verdict = Verdict()
    verdict.check(
        "outcome",
        status.phase in expected,
        f"ended {status.phase.value}, expected {' or '.join(p.value for p in expected)}",
    )
    if weights_ok is not None:
        verdict.check("weights", weights_ok, "final weights differ from the fault-free run")
    verdict.check(
        "one_generation_alive",
        not census.overlaps and census.max_live_ranks <= world_size,
        f"ranks of several generations alive at once: {census.overlaps[:3]} "
        f"(max {census.max_live_ranks} live ranks, world size {world_size})",
    )
    # The bound is the checkpoint interval since the newest checkpoint that could be
    # trusted: an incident that had to skip a corrupt one says what that cost
    # (``fallback_steps``), and only that much more is allowed.
    lost = [
        (i.id, i.kind, i.steps_lost, i.fallback_steps)
        for i in status.incidents
        if (i.steps_lost or 0) > ckpt_every + (i.fallback_steps or 0)
    ]
    verdict.check(
        "steps_lost_bounded",
        not lost,
        f"incidents lost more than the checkpoint interval ({ckpt_every}) plus what "
        f"skipping untrusted checkpoints cost (id, kind, lost, fallback): {lost}",
    )
    planned = [(s.reason, s.steps_lost) for s in status.planned_stops if s.steps_lost]
    verdict.check("planned_stops_lossless", not planned, f"planned stops lost steps: {planned}")
    live = wait_ranks_gone(job_run_root)
    verdict.check("no_process_left", not live, f"ranks still alive per generation: {live}")
    locks = held_locks(job_run_root)
    verdict.check("no_lock_left", not locks, f"locks still held: {locks}")
    temps = temp_files(job_run_root, checkpoint_dir)
    verdict.check("no_temp_file_left", not temps, f"temporary files left: {temps[:5]}")
    return verdict
