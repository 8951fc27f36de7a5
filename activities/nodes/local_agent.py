"""The local agent: ranks on the controller's own machine, started through the
Python rank wrapper and watched through /proc and the run directory directly."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from activities.nodes.agent import (
    NodeAgent,
    NodeStatus,
    NodeStopResult,
    PreflightRequest,
    PreflightResult,
    RankLaunch,
    RankRecord,
    StartedRank,
)
from activities.procfs import group_members, read_stat, signal_group
from activities.rundir import GenerationDir, generations, read_json, write_json_atomic

PID_FILE_WAIT_S = 30.0


class RankStartFailed(Exception):
    """The rank's program could not be started at all (not a crash: a bad command)."""


class LocalAgent(NodeAgent):
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

    def _start(self, gen: GenerationDir, launch: RankLaunch) -> StartedRank:
        gen.exit_file(launch.rank).unlink(missing_ok=True)
        wrapper = [
            sys.executable,
            "-m",
            "activities.rank_wrapper",
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

    def stop(self, run_root: str, keep_generation: int | None, grace_s: float) -> NodeStopResult:
        from activities.launcher import generation_lock

        targets = [g for g in generations(run_root) if g.generation != keep_generation]
        groups: dict[int, list[int]] = {}
        for gen in targets:
            with generation_lock(gen):  # wait out a launch in progress, then fence it
                if not gen.stopped_file.exists():
                    write_json_atomic(gen.stopped_file, {"reason": "stopping", "at": time.time()})
                groups[gen.generation] = _live_groups(gen)
        signalled = [pgid for pgids in groups.values() for pgid in pgids]
        for pgid in signalled:
            signal_group(pgid, signal.SIGTERM)
            signal_group(pgid, signal.SIGCONT)  # a stopped rank cannot act on SIGTERM
        deadline = time.monotonic() + grace_s
        remaining = list(signalled)
        while remaining and time.monotonic() < deadline:
            time.sleep(0.05)
            remaining = [pgid for pgid in remaining if group_members(pgid)]
        needed_kill = list(remaining)
        for pgid in needed_kill:
            signal_group(pgid, signal.SIGKILL)
        kill_deadline = time.monotonic() + 10.0
        while remaining and time.monotonic() < kill_deadline:
            time.sleep(0.02)
            remaining = [pgid for pgid in remaining if group_members(pgid)]
        if remaining:
            raise RuntimeError(f"process groups {remaining} survived SIGKILL")
        stepped = [s for g in targets if groups[g.generation] and (s := _last_step(g)) is not None]
        return NodeStopResult(
            node=self.node.name,
            reachable=True,
            signalled_groups=len(signalled),
            killed_groups=len(needed_kill),
            last_step=max(stepped) if stepped else None,
            generations=[g.generation for g in targets if groups[g.generation]],
        )

    def log_tail(self, gen_dir: str, rank: int, max_bytes: int = 65536) -> str:
        path = GenerationDir(Path(gen_dir)).log_file(rank)
        try:
            with open(path, "rb") as handle:
                handle.seek(0, 2)
                handle.seek(max(0, handle.tell() - max_bytes))
                return handle.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def preflight(self, request: PreflightRequest) -> PreflightResult:
        from activities.nodes.local_checks import run_local_preflight

        return run_local_preflight(self.node.name, request)

    def write_file(self, path: str, content: str) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(content)
        tmp.replace(target)


def _started(
    gen: GenerationDir, rank: int, record: dict[str, object], adopted: bool
) -> StartedRank:
    return StartedRank(
        rank=rank,
        pid=int(str(record["pid"])),
        pgid=int(str(record["pgid"])),
        start_ticks=int(str(record["start_ticks"])),
        log_file=str(gen.log_file(rank)),
        adopted=adopted,
    )


def _live_groups(gen: GenerationDir) -> list[int]:
    found: set[int] = set()
    for pid_file in gen.path.glob("rank-*.pid"):
        record = read_json(pid_file)
        if record is not None and group_members(int(record["pgid"])):
            found.add(int(record["pgid"]))
    return sorted(found)


def _last_step(gen: GenerationDir) -> int | None:
    steps = [
        int(record["step"])
        for hb in gen.path.glob("rank-*.heartbeat.json")
        if (record := read_json(hb)) is not None and "step" in record
    ]
    return max(steps) if steps else None
