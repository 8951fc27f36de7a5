"""The local agent: ranks on the controller's own machine, started through the
Python rank wrapper and watched through /proc and the run directory directly."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Any

from activities.nodes.agent import (
    CarryRequest,
    CarryResult,
    LogChunk,
    MemorySnapshot,
    NodeAgent,
    NodeStatus,
    NodeStopResult,
    PreflightRequest,
    PreflightResult,
    RankLaunch,
    RankRecord,
    RankStartFailed,
    RestoreEnd,
    StartedRank,
    WarmStart,
)
from activities.nodes.exit_watch import ExitWatch, recorded_processes
from activities.nodes.procfs import live_groups, owned_group, read_stat, signal_group
from activities.nodes.rejoin import carry
from activities.nodes.rundir import (
    GenerationDir,
    generation_lock,
    generations_below,
    read_json,
    runs,
    write_json_atomic,
)
from activities.nodes.search_path import resolve_program
from activities.nodes.secret_env import without_worker_secrets
from activities.nodes.warm import stop_run_zygotes, warm_start_ranks
from lazarus.domain import chaos_points
from lazarus.domain.chaos_points import chaos_point
from lazarus.domain.checkpoint_layout import (
    MANIFEST,
    TEMP_SUFFIX,
    committed_steps,
    temp_path_for,
)
from lazarus.domain.contracts import UnkillableGroup
from lazarus.domain.memory_tier import MEMORY_ROOT, on_node, private_root
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


def stop_ranks(
    gens: list[GenerationDir],
    *,
    grace_s: float,
    kill_wait_s: float,
    reporter: str,
    node: str | None = None,
    lock_timeout_s: float | None = None,
    keep_groups: frozenset[int] = frozenset(),
) -> NodeStopResult:
    """Stop the rank groups of these generations on this machine: SIGTERM+SIGCONT, the
    grace period, SIGKILL, then at most ``kill_wait_s`` for the groups to die.

    ``node`` limits it to the ranks that logical node launched (and the generations it
    took part in); None takes every rank. A group is signalled only when its pid file's
    start ticks prove it ours (:func:`owned_group`); a signal refused with EPERM means
    the pgid is someone else's now, so it counts as gone. A group that outlives the
    SIGKILL wait is reported in ``unkillable`` instead of failing the stop: a process in
    uninterruptible sleep may never die, and a stop retried forever blocks cancel too.
    Shared by ``LocalAgent.stop`` and the launcher's fencing.

    ``keep_groups``: groups of ranks that rejoin the next generation in their own
    process (``rejoin``): the launcher's fencing leaves them, and the temporary files
    of a generation they still belong to.
    """
    groups: dict[GenerationDir, list[int]] = {}
    for gen in gens:
        # Wait out a launch in progress, then fence it (bounded where a caller asks).
        with generation_lock(gen, lock_timeout_s):
            if node is not None and not _took_part(gen, node):
                continue
            if not gen.stopped_file.exists():
                write_json_atomic(gen.stopped_file, {"reason": "stopping", "at": time.time()})
            groups[gen] = [g for g in _owned_groups(gen, node) if g not in keep_groups]
    alive = live_groups(pgid for pgids in groups.values() for pgid in pgids)
    signalled = [pgid for pgid in sorted(alive) if signal_group(pgid, signal.SIGTERM)]
    for pgid in signalled:
        signal_group(pgid, signal.SIGCONT)  # a stopped rank cannot act on SIGTERM
    chaos_point(chaos_points.STOP_AFTER_SIGTERM, when=bool(signalled))
    remaining = _wait_for_exit(signalled, grace_s, interval_s=0.05)
    needed_kill = [pgid for pgid in sorted(remaining) if signal_group(pgid, signal.SIGKILL)]
    # SIGKILL is not instant: wait until the kernel has really taken them down, so the
    # next generation never overlaps this one; but not forever.
    survivors = _wait_for_exit(needed_kill, kill_wait_s, interval_s=0.02)
    stopped = [g for g, pgids in groups.items() if any(p in alive for p in pgids)]
    stepped = [s for g in stopped if (s := last_step(g)) is not None]
    for gen in groups:
        if not keep_groups.intersection(_owned_groups(gen, None)):
            _sweep_temp_files(gen)
    return NodeStopResult(
        node=reporter,
        reachable=True,
        signalled_groups=len(signalled),
        killed_groups=len(needed_kill),
        last_step=max(stepped) if stepped else None,
        generations=sorted({g.generation for g in stopped}),
        unkillable=[
            _unkillable(reporter, pgid, pids, kill_wait_s)
            for pgid, pids in sorted(survivors.items())
        ],
    )


def fence_this_machine(
    older: list[GenerationDir],
    others: list[GenerationDir],
    keep: frozenset[int],
    kill_wait_s: float,
    lock_timeout_s: float,
) -> list[UnkillableGroup]:
    """:meth:`NodeAgent.fence_here` on this machine's run directory: every rank of
    ``older`` but the groups ``keep``, and every rank of ``others``, stopped with no
    grace (start ticks checked). Returns the groups of ``older`` that would not die;
    those of other runs are logged."""

    def fence(gens: list[GenerationDir], spared: frozenset[int]) -> list[UnkillableGroup]:
        if not gens:
            return []
        result = stop_ranks(
            gens,
            grace_s=0.0,
            kill_wait_s=kill_wait_s,
            reporter="local",
            lock_timeout_s=lock_timeout_s,
            keep_groups=spared,
        )
        for group in result.unkillable:
            log.warning("fencing: %s", group.reason)
        return result.unkillable

    stuck = fence(older, keep)
    fence(others, frozenset())
    return stuck


def carry_here(request: CarryRequest) -> CarryResult:
    """Carry survivors on this machine (:func:`activities.nodes.rejoin.carry`): the
    local agent's, and the ssh node's through ``python -m activities.nodes.carry``.
    The rest of the older generations is fenced at once (no grace: the generation
    has failed), sparing the survivors' groups."""

    def fence(
        older: list[GenerationDir], carrying: CarryRequest, keep: frozenset[int]
    ) -> NodeStopResult:
        return stop_ranks(
            older,
            grace_s=0.0,
            kill_wait_s=carrying.kill_wait_s,
            reporter=carrying.node or "local",
            node=carrying.node,
            lock_timeout_s=carrying.lock_timeout_s,
            keep_groups=keep,
        )

    return carry(request, fence)


def _sweep_temp_files(gen: GenerationDir) -> None:
    """A rank killed in the middle of an atomic write (heartbeat, exit record) leaves
    its temporary file behind; once no rank of the generation is alive, nobody will
    rename it, so the stop that killed them removes it."""
    if live_groups(_owned_groups(gen, None)):
        return  # another logical node's ranks may still be writing here
    for temp in gen.path.glob(f"*{TEMP_SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()


def _wait_for_exit(pgids: list[int], timeout_s: float, interval_s: float) -> dict[int, list[int]]:
    """The groups among ``pgids`` still alive after waiting at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    remaining = live_groups(pgids)
    while remaining and time.monotonic() < deadline:
        time.sleep(interval_s)
        remaining = live_groups(remaining)
    return remaining


def _unkillable(node: str, pgid: int, pids: list[int], waited_s: float) -> UnkillableGroup:
    states = ", ".join(
        f"{pid} ({stat.state})" if (stat := read_stat(pid)) is not None else str(pid)
        for pid in sorted(pids)
    )
    return UnkillableGroup(
        node=node,
        pgid=pgid,
        pids=sorted(pids),
        reason=(
            f"process group {pgid} on node {node} still alive {waited_s:g} s after SIGKILL: "
            f"pids {states}; a process in uninterruptible sleep (state D: a GPU after an "
            "Xid, a hung filesystem) dies only when the kernel lets it go"
        ),
    )


def _rank_nodes(gen: GenerationDir) -> dict[int, str] | None:
    """Which logical node launched each rank: from ``launch.json``, else from the plan
    (written before any rank starts); None when neither says (then every rank counts)."""
    launched = read_json(gen.launch_file)
    if launched is not None and isinstance(launched.get("ranks"), list):
        return {int(r["rank"]): str(r.get("node", "local")) for r in launched["ranks"]}
    plan = read_json(gen.plan_file)
    if plan is None or not isinstance(plan.get("nodes"), list):
        return None
    per_node = plan.get("nproc_per_node")
    if not isinstance(per_node, int) or per_node < 1:
        return None
    return {
        index * per_node + local: str(name)
        for index, name in enumerate(plan["nodes"])
        for local in range(per_node)
    }


def _took_part(gen: GenerationDir, node: str) -> bool:
    nodes = _rank_nodes(gen)
    if nodes is not None:
        return node in nodes.values()
    plan = read_json(gen.plan_file)
    return plan is None or not isinstance(plan.get("nodes"), list) or node in plan["nodes"]


def _owned_groups(gen: GenerationDir, node: str | None) -> list[int]:
    """The groups of this generation's pid files that are provably ours (and, with
    ``node``, launched by that node)."""
    nodes = _rank_nodes(gen) if node is not None else None
    found: set[int] = set()
    for pid_file in gen.path.glob("rank-*.pid"):
        rank = _PID_FILE.match(pid_file.name)
        if rank is None:
            continue
        if nodes is not None and nodes.get(int(rank.group(1)), node) != node:
            continue
        record = read_json(pid_file)
        if record is not None and (pgid := owned_group(record)) is not None:
            found.add(pgid)
    return sorted(found)


def last_step(gen: GenerationDir) -> int | None:
    steps = [
        int(record["step"])
        for hb in gen.path.glob("rank-*.heartbeat.json")
        if (record := read_json(hb)) is not None and "step" in record
    ]
    return max(steps) if steps else None
