"""The local agent: ranks on the controller's own machine, started through the
Python rank wrapper and watched through /proc and the run directory directly."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Any

from activities.nodes.agent import (
    LogChunk,
    MemorySnapshot,
    NodeAgent,
    NodeStatus,
    PreflightRequest,
    PreflightResult,
    RankRecord,
    RankStartFailed,
    RestoreEnd,
)
from activities.nodes.exit_watch import ExitWatch, recorded_processes
from activities.nodes.fencing import carry_here, fence_this_machine, stop_ranks
from activities.nodes.node_records import (
    CarryRequest,
    CarryResult,
    NodeStopResult,
    RankLaunch,
    StartedRank,
    WarmStart,
)
from activities.nodes.procfs import read_stat
from activities.nodes.rundir import (
    GenerationDir,
    generations_below,
    read_json,
    runs,
)
from activities.nodes.search_path import resolve_program
from activities.nodes.secret_env import without_worker_secrets
from activities.nodes.warm_starts import stop_run_zygotes, warm_start_ranks
from lazarus.domain.checkpoint_layout import (
    MANIFEST,
    TEMP_SUFFIX,
    committed_steps,
    temp_path_for,
)
from lazarus.domain.memory_tier import MEMORY_ROOT, on_node, private_root
from lazarus.domain.process_groups import UnkillableGroup
from lazarus.domain.spec import JobSpec, NodeSpec
from lazarus.rank.hang_evidence import EvidenceTarget, HangEvidence, gather
from lazarus.rank.memory import secure

log = logging.getLogger(__name__)

RESTORE_START_S = 15.0
"""Beyond a restore's own bound: the interpreter's start on a loaded node."""

PID_FILE_WAIT_S = 30.0
_PID_FILE = re.compile(r"^rank-(\d+)\.pid$")


class LocalAgent(NodeAgent):
    shares_clock = True  # its ranks run on the controller's machine

    def __init__(self, node: NodeSpec, whole_machine: bool = False) -> None:
        super().__init__(node)
        self.whole_machine = whole_machine
        """Stop every rank on this machine, whichever logical node launched it (a stop
        that names no node). Otherwise ``stop`` touches only this node's ranks: several
        logical local nodes share one machine and one run directory."""
        self._exits = ExitWatch()
        """Pidfds of the ranks (and their recorders) that :meth:`poll` saw alive."""

    def start_ranks(self, gen_dir: str, ranks: list[RankLaunch]) -> list[StartedRank]:
        gen = GenerationDir(Path(gen_dir))
        gen.path.mkdir(parents=True, exist_ok=True)
        started: list[StartedRank] = []
        for launch in ranks:
            record = read_json(gen.pid_file(launch.rank))
            if record is not None:
                started.append(_started(gen, launch.rank, record, adopted=True))
            else:
                started.append(self._start(gen, launch))
        return started

    def start_ranks_warm(
        self, gen_dir: str, ranks: list[RankLaunch], warm: WarmStart
    ) -> list[StartedRank]:
        gen = GenerationDir(Path(gen_dir))
        answers = warm_start_ranks(
            gen, self.node.name, warm.run_root, warm.preload, warm.standby, ranks
        )
        started: list[StartedRank] = []
        for launch, answer in zip(ranks, answers, strict=True):
            if answer.cold_reason is not None:
                cold = self._start(gen, launch)
                started.append(cold.model_copy(update={"cold_reason": answer.cold_reason}))
            else:
                fields = answer.model_dump(exclude={"cold_reason"})
                started.append(StartedRank(**fields, log_file=str(gen.log_file(launch.rank))))
        return started

    def _start(self, gen: GenerationDir, launch: RankLaunch) -> StartedRank:
        gen.exit_file(launch.rank).unlink(missing_ok=True)
        wrapper = [
            sys.executable,
            "-m",
            "activities.nodes.rank_wrapper",
            "--rank",
            str(launch.rank),
            "--gen-dir",
            str(gen.path),
            "--",
            *launch.command,
        ]
        # The wrapper forks and its parent exits at once; run() reaps that parent only.
        subprocess.run(
            wrapper,
            cwd=launch.workdir,
            env=launch.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
            start_new_session=True,
            timeout=30,
        )
        deadline = time.monotonic() + PID_FILE_WAIT_S
        while time.monotonic() < deadline:
            record = read_json(gen.pid_file(launch.rank))
            if record is not None:
                return _started(gen, launch.rank, record, adopted=False)
            exit_record = read_json(gen.exit_file(launch.rank))
            if exit_record is not None and exit_record.get("error"):
                raise RankStartFailed(f"rank {launch.rank}: {exit_record['error']}")
            time.sleep(0.01)
        raise TimeoutError(f"rank {launch.rank}: no pid file within {PID_FILE_WAIT_S:.0f} s")

    def poll(self, gen_dir: str, ranks: list[int]) -> NodeStatus:
        started = time.monotonic()
        gen = GenerationDir(Path(gen_dir))
        records: list[RankRecord] = []
        for rank in ranks:
            pid_record = read_json(gen.pid_file(rank))
            pid = int(pid_record["pid"]) if pid_record else None
            # One read of /proc/PID/stat answers identity, liveness and state T at once.
            stat = read_stat(pid) if pid is not None else None
            alive = (
                stat is not None
                and pid_record is not None
                and stat.state not in ("Z", "X")
                and stat.start_ticks == int(pid_record["start_ticks"])
            )
            if alive and pid_record is not None:
                # Watch it from now on: its end wakes the supervisor (exit_fds).
                self._exits.track(recorded_processes(pid_record))
            records.append(
                RankRecord(
                    rank=rank,
                    pid=pid,
                    alive=alive,
                    stopped=alive and stat is not None and stat.state in ("T", "t"),
                    exit=read_json(gen.exit_file(rank)),
                    heartbeat=read_json(gen.heartbeat_file(rank)),
                )
            )
        return NodeStatus(
            node=self.node.name,
            reachable=True,
            ranks=records,
            observed_at=time.time(),
            round_trip_s=time.monotonic() - started,
        )

    def exit_fds(self) -> list[int]:
        return self._exits.fds()

    def exits_seen(self, fds: list[int]) -> None:
        self._exits.ended(fds)

    def close(self) -> None:
        self._exits.close()

    def stop(
        self,
        run_root: str,
        keep_generation: int | None,
        grace_s: float,
        kill_wait_s: float = 10.0,
    ) -> NodeStopResult:
        root = Path(run_root)
        # Given a job directory, the runs below it are stopped too (cleanup, fencing).
        targets = generations_below(root, keep_generation)
        return stop_ranks(
            targets,
            grace_s=grace_s,
            kill_wait_s=kill_wait_s,
            reporter=self.node.name,
            node=None if self.whole_machine else self.node.name,
        )

    def carry_survivors(self, request: CarryRequest) -> CarryResult:
        return carry_here(request)

    def fence_here(
        self,
        older: list[GenerationDir],
        others: list[GenerationDir],
        keep: frozenset[int],
        kill_wait_s: float,
        lock_timeout_s: float,
    ) -> list[UnkillableGroup]:
        return fence_this_machine(older, others, keep, kill_wait_s, lock_timeout_s)

    def fence_earlier_runs(self, runs: dict[str, list[str]], kill_wait_s: float) -> str | None:
        """Nothing more: earlier runs here are this machine's, fenced by
        :meth:`fence_here` and their zygotes by the launcher."""
        return None

    def prepare_launch(self, spec: JobSpec, carried: bool) -> str | None:
        """The run's checkpoint directory is this machine's: a rank killed between
        writing a file and renaming it left its temporary file, removed now (unless
        survivors were carried: one may still be writing); and the command's program
        must be found here."""
        if not carried:
            sweep_checkpoint_temps(Path(spec.checkpoint_dir))
        if resolve_program(spec) is None:
            return (
                f"command: cannot find program {spec.command[0]!r} (workdir {spec.workdir}); "
                "fix the spec's command or PATH"
            )
        return None

    def end_run(self, run_root: str, memory_dirs: list[str]) -> None:
        nodes = None if self.whole_machine else [self.node.name]
        for root in [Path(run_root), *runs(run_root)]:
            stop_run_zygotes(root, nodes)
        for memory_dir in memory_dirs:
            remove_memory_dir(memory_dir)

    def log_tail(self, gen_dir: str, rank: int, max_bytes: int = 65536) -> str:
        path = GenerationDir(Path(gen_dir)).log_file(rank)
        try:
            with open(path, "rb") as handle:
                handle.seek(0, 2)
                handle.seek(max(0, handle.tell() - max_bytes))
                return handle.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_read(self, gen_dir: str, rank: int, offset: int, max_bytes: int) -> LogChunk:
        path = GenerationDir(Path(gen_dir)).log_file(rank)
        try:
            with open(path, "rb") as handle:
                stat = os.fstat(handle.fileno())
                handle.seek(max(offset, 0))
                data = handle.read(max(max_bytes, 0))
        except FileNotFoundError:
            return LogChunk()
        return LogChunk(data=data, size=stat.st_size, mtime=stat.st_mtime)

    def preflight(self, request: PreflightRequest) -> PreflightResult:
        from activities.nodes.local.checks import run_local_preflight

        return run_local_preflight(self.node.name, request)

    def write_file(self, path: str, content: str) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path_for(target)
        tmp.write_text(content)
        tmp.replace(target)

    def memory_snapshots(self, root: str) -> list[MemorySnapshot]:
        return local_memory_snapshots(Path(root))

    def restore_end(self, end: RestoreEnd) -> dict[str, Any]:
        """A process of its own on this machine (the worker's interpreter, which has
        ``lazarus.rank``), so the state never passes through the worker's memory."""
        env = {**without_worker_secrets(os.environ), "PYTHONUNBUFFERED": "1"}
        try:
            done = subprocess.run(
                [sys.executable, "-m", "lazarus.rank.replica_restore", end.verb],
                input=end.request_json(),
                capture_output=True,
                text=True,
                env=env,
                timeout=end.timeout_s + RESTORE_START_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return {"error": f"replica restore ({end.verb}) outran {end.timeout_s:.0f} s"}
        return end.answer(done.stdout + done.stderr)

    def hang_evidence(self, gen_dir: str, targets: list[EvidenceTarget]) -> HangEvidence:
        """Read here, in the worker: the ranks are this machine's processes."""
        return gather(Path(gen_dir), targets, "the worker")


def sweep_checkpoint_temps(checkpoint_dir: Path) -> None:
    """A rank killed between writing a checkpoint file and renaming it (a manifest, a
    shard) leaves its temporary file. Every older generation was just fenced and the
    new one has not started, so no writer is alive: remove them before the ranks look.
    Local nodes only: their checkpoint directory is on this machine."""
    if not checkpoint_dir.is_dir():
        return
    for temp in checkpoint_dir.rglob(f"*{TEMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            temp.unlink()


def local_memory_snapshots(root: Path) -> list[MemorySnapshot]:
    """:meth:`NodeAgent.memory_snapshots` on this machine: facts only (manifest and
    file sizes), judged by the checkpoint search like a remote node's answer."""
    root = secure(Path(on_node(str(root), os.getuid())), create=False)
    found: list[MemorySnapshot] = []
    for step, path in committed_steps(root):
        if path.is_symlink():
            continue
        manifest = read_json(path / MANIFEST)
        sizes: dict[str, int] = {}
        for file in path.rglob("*"):
            with contextlib.suppress(OSError):
                if file.is_file():
                    sizes[file.relative_to(path).as_posix()] = file.stat().st_size
        found.append(MemorySnapshot(step=step, path=str(path), manifest=manifest, sizes=sizes))
    return found


def remove_memory_dir(path: str) -> None:
    """Remove a run's memory-tier directory, refusing anything outside the tier's
    root: it is deleted recursively. Safe to call twice, or from two logical nodes
    of one machine at once."""
    target = PurePosixPath(path)
    if (
        ".." in target.parts
        or not target.is_relative_to(MEMORY_ROOT)
        or target == PurePosixPath(MEMORY_ROOT)
    ):
        raise ValueError(f"refusing to remove {path!r}: not a run directory under {MEMORY_ROOT}")

    # The files are in this user's private root; one that is not safe (another
    # user's, or a symlink) is refused here rather than followed.
    target = PurePosixPath(secure(Path(on_node(path, os.getuid())), create=False))
    # Errors are judged by the result: another logical node may be removing it too.
    shutil.rmtree(target, ignore_errors=True)
    if os.path.lexists(target):
        raise OSError(f"cannot remove the memory tier {path}")
    # The job's directory goes too once its last run's is gone (another run of the
    # job may still use it: rmdir removes only an empty one).
    if target.parent != PurePosixPath(private_root(os.getuid())):
        with contextlib.suppress(OSError):
            os.rmdir(target.parent)


def _started(
    gen: GenerationDir, rank: int, record: dict[str, object], adopted: bool, warm: bool = False
) -> StartedRank:
    started_at = record.get("started_at")
    return StartedRank(
        rank=rank,
        pid=int(str(record["pid"])),
        pgid=int(str(record["pgid"])),
        start_ticks=int(str(record["start_ticks"])),
        log_file=str(gen.log_file(rank)),
        adopted=adopted,
        warm=warm,
        started_at=float(started_at) if isinstance(started_at, (int, float)) else None,
    )
