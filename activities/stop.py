"""Stopping ranks: the compensation that always runs before a relaunch.

SIGTERM to each rank's whole process group (with SIGCONT, because a SIGSTOPped
rank cannot act on SIGTERM), a grace period, then SIGKILL. Idempotent: stopping
a generation that is already gone is a no-op, so a retry after a worker crash,
or a second ``cancel``, is always safe.
"""

from __future__ import annotations

import asyncio
import signal
import time

from temporalio import activity

from activities.contracts import StopRequest, StopResult
from activities.launcher import generation_lock
from activities.procfs import group_members, signal_group
from activities.rundir import GenerationDir, generations, read_json, write_json_atomic


def _last_step(gen: GenerationDir) -> int | None:
    steps = [
        int(record["step"])
        for hb in gen.path.glob("rank-*.heartbeat.json")
        if (record := read_json(hb)) is not None and "step" in record
    ]
    return max(steps) if steps else None


def _settled_live_groups(gen: GenerationDir) -> list[int]:
    """Wait out a launch in progress, and fence the generation against a late one."""
    with generation_lock(gen):
        if not gen.stopped_file.exists():
            write_json_atomic(gen.stopped_file, {"reason": "stopping", "at": time.time()})
        return _live_groups(gen)


def _live_groups(gen: GenerationDir) -> list[int]:
    groups: set[int] = set()
    for pid_file in gen.path.glob("rank-*.pid"):
        record = read_json(pid_file)
        if record is not None and group_members(int(record["pgid"])):
            groups.add(int(record["pgid"]))
    return sorted(groups)


async def stop_generations(request: StopRequest, heartbeat: bool = False) -> StopResult:
    targets = [g for g in generations(request.run_root) if g.generation != request.keep_generation]
    groups = {g.generation: await asyncio.to_thread(_settled_live_groups, g) for g in targets}
    signalled = [pgid for pgids in groups.values() for pgid in pgids]
    for pgid in signalled:
        signal_group(pgid, signal.SIGTERM)
        signal_group(pgid, signal.SIGCONT)
    deadline = time.monotonic() + request.grace_s
    remaining = list(signalled)
    while remaining and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        remaining = [pgid for pgid in remaining if group_members(pgid)]
        if heartbeat:
            activity.heartbeat(f"{len(remaining)} process groups still running")
    needed_kill = list(remaining)
    for pgid in needed_kill:
        signal_group(pgid, signal.SIGKILL)
    # SIGKILL is not instant: wait until the kernel has really taken them down, so the
    # next generation never overlaps this one.
    kill_deadline = time.monotonic() + 10.0
    while remaining and time.monotonic() < kill_deadline:
        await asyncio.sleep(0.02)
        remaining = [pgid for pgid in remaining if group_members(pgid)]
    if remaining:
        raise RuntimeError(f"process groups {remaining} survived SIGKILL; will retry")
    for gen in targets:
        if groups[gen.generation]:
            write_json_atomic(gen.stopped_file, {"reason": request.reason, "at": time.time()})
    stepped = [s for g in targets if groups[g.generation] and (s := _last_step(g)) is not None]
    return StopResult(
        last_step=max(stepped) if stepped else None,
        generations=[g.generation for g in targets if groups[g.generation]],
        signalled_groups=len(signalled),
        killed_groups=len(needed_kill),
    )


@activity.defn(name="stop")
async def stop(request: StopRequest) -> StopResult:
    """Stop every generation of the job except ``keep_generation``."""
    return await stop_generations(request, heartbeat=True)
