"""Stopping and fencing rank groups on this machine, start ticks checked: the local
agent's stop, the launcher's fencing net, and a node's carry of survivors.

The node side of an ssh node runs :func:`carry_here` on a recovery's critical path
(``python -m activities.nodes.carry``), so this module imports nothing heavier than
the node records: no job spec, no workflow contracts, no agent interface."""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import time

from activities.nodes.node_records import CarryRequest, CarryResult, NodeStopResult
from activities.nodes.procfs import live_groups, owned_group, read_stat, signal_group
from activities.nodes.rejoin import carry
from activities.nodes.rundir import GenerationDir, generation_lock, read_json, write_json_atomic
from lazarus.domain import chaos_points
from lazarus.domain.chaos_points import chaos_point
from lazarus.domain.checkpoint_layout import TEMP_SUFFIX
from lazarus.domain.process_groups import UnkillableGroup

log = logging.getLogger(__name__)

_PID_FILE = re.compile(r"^rank-(\d+)\.pid$")


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
