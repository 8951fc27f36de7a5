"""What every chaos cell must still hold after its fault, checked from the outside.

The controller's own report is not trusted: the census reads /proc through the
run directory's pid files in a background thread for the whole cell, and the
leftovers are looked for on disk and in /proc after the job ended.

The sixth invariant, "no snapshot of an abandoned timeline is ever resumed", needs
two facts the controller does not get to vouch for: which generation wrote each
memory snapshot (the census reads every committed snapshot's manifest in tmpfs
while the cell runs) and where each generation was told to resume (the launch
requests in the workflow's history: exactly what the ranks got as
``LAZARUS_RESUME_FROM``). :func:`abandoned_resumes` judges them.
"""

from __future__ import annotations

import fcntl
import json
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from activities.nodes.rundir import generations_below
from bench.measure import BackgroundSampler
from infra import chaos
from lazarus.domain.checkpoint_layout import MANIFEST, TEMP_SUFFIX, committed_steps
from lazarus.domain.memory_tier import MEMORY_ROOT, REPLICAS_DIR
from workflows.state import JobStatus, Phase

CENSUS_INTERVAL_S = 0.05
RANKS_GONE_WAIT_S = 20.0
"""After the job ended, its ranks, zygotes and standbys get this long to exit before
they count as left behind ("nothing of it alive 20 s later")."""
TEMP_PATTERNS = (f"*{TEMP_SUFFIX}", ".*.tmp")
"""The rank helper's checkpoint temp files and ``write_json_atomic``'s."""


@dataclass(frozen=True)
class WriterSeen:
    """A committed memory snapshot's manifest, as the census read it at ``at``."""

    at: float
    generation: int | None
    """The manifest's ``generation`` (None: it names none)."""


class GenerationCensus(BackgroundSampler):
    """Samples, every 50 ms, which generations have a live rank process: two at once
    is the split brain the launcher's fencing exists to prevent. With
    ``memory_job_dir`` (the job's directory in this user's tmpfs root), also which
    generation wrote each committed memory snapshot: the writer a resume is judged
    by, read from the files, not from the controller."""

    def __init__(
        self,
        job_run_root: Path,
        interval_s: float = CENSUS_INTERVAL_S,
        memory_job_dir: Path | None = None,
    ) -> None:
        super().__init__(interval_s, name="chaos-census")
        self.job_run_root = job_run_root
        self.memory_job_dir = memory_job_dir
        self.samples = 0
        self.max_live_ranks = 0
        self.overlaps: list[dict[str, int]] = []
        """Samples where more than one generation had live ranks: ranks per generation."""
        self.writers: dict[str, list[WriterSeen]] = {}
        """Per snapshot, by its logical path (``/dev/shm/lazarus/<job>/<run>/step-N``,
        as a launch names it): each change of its writing generation, oldest first."""
        self._read: dict[Path, tuple[int, int]] = {}

    def sample(self) -> None:
        live = live_ranks_by_generation(self.job_run_root)
        self.samples += 1
        self.max_live_ranks = max(self.max_live_ranks, sum(live.values()))
        if len(live) > 1 and len(self.overlaps) < 20:
            self.overlaps.append(live)
        for job_dir in self.memory_job_dirs():
            self._sample_memory(job_dir)

    def memory_job_dirs(self) -> list[Path]:
        """The job's directories in tmpfs the census reads, one per memory a node of
        the job has (this machine's: ``memory_job_dir``; none without the tier)."""
        return [self.memory_job_dir] if self.memory_job_dir is not None else []

    def _sample_memory(self, job_dir: Path) -> None:
        """Read each committed snapshot's manifest once per version of it (a re-save
        replaces the directory, so its manifest's inode or mtime changes)."""
        try:
            runs = [p for p in job_dir.iterdir() if p.is_dir() and not p.is_symlink()]
        except OSError:
            return
        now = time.time()
        for run in runs:
            try:
                steps = committed_steps(run)
            except OSError:
                continue
            for _, path in steps:
                manifest = path / MANIFEST
                try:
                    info = manifest.stat()
                    version = (info.st_ino, info.st_mtime_ns)
                    if self._read.get(manifest) == version:
                        continue
                    data = json.loads(manifest.read_text())
                except (OSError, ValueError):
                    continue
                self._read[manifest] = version
                written = data.get("generation") if isinstance(data, dict) else None
                generation = (
                    written if isinstance(written, int) and not isinstance(written, bool) else None
                )
                key = str(PurePosixPath(MEMORY_ROOT) / job_dir.name / run.name / path.name)
                seen = self.writers.setdefault(key, [])
                if not seen or seen[-1].generation != generation:
                    seen.append(WriterSeen(at=now, generation=generation))


@dataclass(frozen=True)
class Launch:
    """One launch the controller asked for, from the workflow's history."""

    generation: int
    resume_step: int
    """The step it resumed from (0: from scratch): the timeline cut it makes."""
    resume_path: str | None
    """``LAZARUS_RESUME_FROM`` of its ranks; None from scratch."""
    at: float
    """When the launch was scheduled (epoch s, the server's clock on this machine)."""


def is_memory_path(path: str) -> bool:
    """Whether a resume point is a memory-tier snapshot (a logical tmpfs path)."""
    return PurePosixPath(path).is_relative_to(MEMORY_ROOT)


def abandoned_resumes(
    launches: list[Launch], writers: dict[str, list[WriterSeen]]
) -> tuple[list[str], list[str]]:
    """The sixth invariant: resumes of a memory snapshot off the job's timeline, and
    the resumes that could not be judged (their snapshot was never seen committed).

    Every launch of generation ``g`` from step ``r`` cuts the timeline at ``(g, r)``:
    a snapshot of step ``s`` written by generation ``w`` is abandoned once some later
    launch ``c`` (``w < c``) resumed below it (``r_c < s``). Generation ``g``
    resuming such a snapshot (``c < g``) brings back a training the job left: a
    rollback undone, or copies of two trainings mixed. The writer is the snapshot's
    manifest as last read before the launch was asked for. A generation launched
    twice (a retried choice) counts with its last request."""
    by_generation = {launch.generation: launch for launch in launches}
    ordered = sorted(by_generation.values(), key=lambda launch: launch.generation)
    violations: list[str] = []
    unjudged: list[str] = []
    for launch in ordered:
        path = launch.resume_path
        if path is None or not is_memory_path(path):
            continue
        seen = [w for w in writers.get(path, []) if w.at <= launch.at]
        if not seen:
            unjudged.append(
                f"generation {launch.generation} resumed {path}, never seen committed before"
            )
            continue
        writer = seen[-1].generation
        written_by = writer if writer is not None else 0
        for cut in ordered:
            if (
                written_by < cut.generation < launch.generation
                and launch.resume_step > cut.resume_step
            ):
                violations.append(
                    f"generation {launch.generation} resumed {path} (step {launch.resume_step}, "
                    f"written by generation {writer}), abandoned when generation "
                    f"{cut.generation} resumed from step {cut.resume_step}"
                )
                break
    return violations, unjudged


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
    unjudged: list[str] = field(default_factory=list)
    """Resumes the timeline check could not judge (reported, not counted as held or failed)."""

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


def memory_left(job_dir: Path) -> list[str]:
    """Step directories of the job still in tmpfs, its own snapshots and the replicas
    it holds for a buddy (a finished run removes its whole directory)."""
    if not job_dir.is_dir():
        return []
    found = [*job_dir.glob("*/step-*"), *job_dir.glob(f"*/{REPLICAS_DIR}/*/step-*")]
    return sorted(str(p) for p in found)


def temp_files(*roots: Path) -> list[str]:
    found: list[str] = []
    for root in roots:
        if root.is_dir():
            for pattern in TEMP_PATTERNS:
                found.extend(str(p) for p in root.rglob(pattern))
    return sorted(found)


def processes_mentioning(text: str) -> list[str]:
    """Processes whose command line contains ``text`` (the job's directory): a rank,
    its wrapper, a zygote or an idle standby (a fork of the zygote, with its command
    line), whether or not a pid file still names it."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(f"{cmdline.parent.name}: {args.strip()[:200]}")
    return found


def wait_ranks_gone(
    job_run_root: Path, timeout_s: float = RANKS_GONE_WAIT_S, job_dir: Path | None = None
) -> tuple[dict[str, int], list[str]]:
    """Live ranks, and (with ``job_dir``) any process naming the job's directory,
    once they had ``timeout_s`` to exit (a finished job's ranks exit by themselves;
    a deadline on their exit, not a speed)."""
    deadline = time.monotonic() + timeout_s

    def left() -> tuple[dict[str, int], list[str]]:
        return (
            live_ranks_by_generation(job_run_root),
            processes_mentioning(str(job_dir)) if job_dir is not None else [],
        )

    live, helpers = left()
    while (live or helpers) and time.monotonic() < deadline:
        time.sleep(0.1)
        live, helpers = left()
    return live, helpers


def judge(
    status: JobStatus,
    expected: tuple[Phase, ...],
    weights_ok: bool | None,
    census: GenerationCensus,
    world_size: int,
    ckpt_every: int,
    job_run_root: Path,
    checkpoint_dir: Path,
    *,
    launches: list[Launch] | None = None,
    job_dir: Path | None = None,
) -> Verdict:
    """Every invariant of the matrix for one finished job. ``weights_ok`` None skips
    the weights (a job that rightly ends NEEDS_OPERATOR has no final weights).
    ``launches`` (from the history) judges the timeline against the census's
    snapshot writers; ``job_dir`` (everything the job wrote) finds helpers left
    alive and memory snapshots left in tmpfs."""
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
    abandoned, unjudged = abandoned_resumes(launches or [], census.writers)
    verdict.unjudged.extend(unjudged)
    verdict.check(
        "no_abandoned_timeline_resumed",
        not abandoned,
        f"a memory snapshot of an abandoned timeline was resumed: {abandoned}",
    )
    live, helpers = wait_ranks_gone(job_run_root, job_dir=job_dir)
    verdict.check("no_process_left", not live, f"ranks still alive per generation: {live}")
    verdict.check(
        "no_helper_left",
        not helpers,
        f"processes of the job (zygotes, standbys, wrappers) alive {RANKS_GONE_WAIT_S:.0f} s "
        f"after it ended: {helpers[:5]}",
    )
    memory_dirs = census.memory_job_dirs()
    if memory_dirs and status.phase in (Phase.SUCCEEDED, Phase.CANCELLED):
        snapshots = [found for job_dir in memory_dirs for found in memory_left(job_dir)]
        verdict.check(
            "no_snapshot_left",
            not snapshots,
            f"memory snapshots left in tmpfs after the run ended: {snapshots[:5]}",
        )
    locks = held_locks(job_run_root)
    verdict.check("no_lock_left", not locks, f"locks still held: {locks}")
    temps = temp_files(job_run_root, checkpoint_dir)
    verdict.check("no_temp_file_left", not temps, f"temporary files left: {temps[:5]}")
    return verdict
