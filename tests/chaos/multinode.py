"""The cross-node rows of the chaos matrix (issue 28): rejoin in place across ssh nodes
and memory-tier replicas, on real SSH test hosts (:mod:`bench.multinode`: one network
namespace per host, its own sshd and its own ``/dev/shm``).

Each cell starts fresh hosts for its job and is judged like every other cell
(:func:`tests.chaos.invariants.judge`), the census reading every host's tmpfs through
its ``/proc/<pid>/root`` (:class:`HostsCensus`). Phases are reached as in the rest of
the matrix, through a chaos point or an observed state, never after a sleep:

* ``ssh_rejoin``: rank 1 (alone on h2) is SIGKILLed; the recovery's launch is held at
  ``launch.before_launch_json`` (in the worker), where h1's agent has carried rank 0
  through the shim (its pid file in the new generation is a link) and the new rank 1
  is started on h2. Then the fault: the new rank 1 SIGKILLed, or the worker.
* ``replicated``: three nodes of one rank push their committed snapshots around a
  ring (h1 -> h2 -> h3 -> h1); the phase is reached once the buddies are seen holding
  committed replicas in their own tmpfs. Then the fault: a node and its buddy lost
  at once (the lost node's step exists nowhere: the search must fall back to disk
  for every node, never mix memory and disk or two timelines), or a replica torn
  while its buddy receives it (held at ``replica.before_commit``, a data file cut
  short, the node it protects then lost): the buddy's verification must refuse it,
  and the job resume from an older verified tier.

Where the hosts cannot run (no root, no ``ip`` or ``sshd``) these cells are skipped
with that reason (:func:`bench.multinode.netns_unavailable_reason`).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from bench import multinode
from bench.jobs import JobPaths, JobShape
from infra import chaos
from infra.testhosts import TestHosts
from lazarus.domain import chaos_points as points
from lazarus.domain.chaos_points import CHAOS_DIR_ENV
from lazarus.domain.checkpoint_layout import COMMIT_MARKER, MANIFEST, TEMP_SUFFIX, parse_step_dir
from lazarus.domain.memory_tier import MEMORY_ROOT, REPLICAS_DIR, on_node
from lazarus.domain.spec import JobSpec
from tests.chaos.cell import (
    REJOIN,
    Cell,
    CellRun,
    SshLayout,
    held_at,
    kill_worker,
    restart_worker,
    signal_newest,
)
from tests.chaos.invariants import GenerationCensus, Launch, is_memory_path

FAULTS: dict[str, str] = {
    "node_and_buddy_lost": "a node and its replica buddy lost at once",
    "replica_torn": "a replica torn mid-copy, then the node it protects lost",
}
PHASES: dict[str, str] = {
    "ssh_rejoin": "cross-node rejoin: survivor carried on its host, new rank started, "
    "launch unrecorded",
    "replicated": "training on ssh nodes with memory replicas held by buddies",
}
HANG_TIMEOUT_S = 20.0
"""As tests/netns/test_ssh_rejoin.py's: a rank on a test host of a loaded 2-core machine
took more than the matrix's 8 s to exit after its last step (seen at load 22: a
false hang, and a relaunch at the last step), and exits are seen over ssh."""
PROTECTED = "h2"
"""The node whose snapshots the replica cells destroy (slot 1): its buddy is h3."""
BUDDY = "h3"
BUDDY_OF = {"h3": 1, "h1": 2}
"""Where the ring's replicas live once it pushes: h3 holds slot 1's (h2's), h1 slot
2's (h3's). The replica cells' phase: both seen committed."""
REPLICA_RANK = 2
"""The rank on the buddy h3 (one rank per node): its receiver logs a refusal."""


def absent_reason(fault: str, phase: str) -> str | None:
    """Why a pair with a cross-node fault or phase is not a cell; None for the other
    pairs (:func:`tests.chaos.matrix.absent_reason` says why those are not)."""
    if fault in FAULTS and phase != "replicated":
        return (
            "a fault of memory replicas on ssh nodes: it exists only while buddies hold "
            "replicas (replicated)"
        )
    if phase == "replicated":
        return (
            "training with memory replicas on ssh nodes: its rows are the ways a lost "
            "node's copies can fail; a plain node loss there is the benchmark's "
            "node_loss_replicas and tests/netns/test_ssh_memory_replicas.py, and the "
            "other faults take the path they take in steady training"
        )
    if phase == "ssh_rejoin":
        return (
            "a rejoin across ssh nodes: its rows are a rank and the worker killed mid-rejoin "
            "(issue 28); the other faults take the path they take in the local rejoin "
            "phase"
        )
    return None


# --------------------------------------------------------------------------- the job


def spec_builder(
    cell: Cell, shape: JobShape, hosts: TestHosts, chaos_dir: Path
) -> Callable[[str, JobPaths], JobSpec]:
    """The example on ``cell.ssh``'s layout of ``hosts``, one rank per node, with the
    cell's rejoin and memory tier."""
    layout = cell.ssh
    assert layout is not None, f"{cell.key} is not an ssh cell"

    def build(name: str, paths: JobPaths) -> JobSpec:
        setup: dict[str, object] = {"health": {**shape.health, "hang_timeout_s": HANG_TIMEOUT_S}}
        if cell.memory:
            setup["checkpoints"] = {
                "memory_every_steps": 1,
                "memory_replicas": layout.replicas,
            }
        if cell.rejoin:
            setup["rejoin"] = dict(REJOIN)
        spec = multinode.ssh_spec(
            name, paths, shape, hosts, nodes=layout.nodes, spares=layout.spares, setup=setup
        )
        command = list(spec.command)
        if cell.rejoin:
            command.append("--resilient")
        if layout.points_in_ranks:
            program = shutil.which("env") or "/usr/bin/env"
            command = [program, f"{CHAOS_DIR_ENV}={chaos_dir}", *command]
        return spec.model_copy(update={"command": command})

    return build


class HostsCensus(GenerationCensus):
    """The census of a job on SSH test hosts: ranks through the pid files (the hosts
    share this machine's pid space and filesystem), memory snapshots in every host's
    own tmpfs, read through ``/proc/<pid>/root`` while the host is up."""

    def __init__(self, job_run_root: Path, hosts: TestHosts, job_id: str) -> None:
        super().__init__(job_run_root)
        self.hosts = hosts
        self.job_dir = job_memory_dir(hosts, job_id)

    def memory_job_dirs(self) -> list[Path]:
        return [
            root / self.job_dir
            for host in self.hosts.hosts
            if (root := self.hosts.root_path(host.name)) is not None
        ]


def job_memory_dir(hosts: TestHosts, job_id: str) -> str:
    """The job's directory in a host's tmpfs (every run's snapshots and replicas),
    relative to the host's root: the private root of the user its ranks run as."""
    uid = pwd.getpwnam(hosts.user).pw_uid
    return on_node(f"{MEMORY_ROOT}/{job_id}", uid).lstrip("/")


def host_memory_dir(hosts: TestHosts, name: str, job_id: str) -> Path | None:
    """The job's directory in host ``name``'s tmpfs, as this namespace reaches it;
    None while the host is down."""
    root = hosts.root_path(name)
    return None if root is None else root / job_memory_dir(hosts, job_id)


def _hosts(run: CellRun) -> TestHosts:
    assert run.hosts is not None, "an ssh cell without its hosts"
    return run.hosts


def _replicas(run: CellRun, holder: str, slot: int) -> list[Path]:
    """The step directories ``holder`` holds of slot ``slot``, committed or not."""
    directory = host_memory_dir(_hosts(run), holder, run.job.spec.job_id)
    if directory is None:
        return []
    return sorted(directory.glob(f"*/{REPLICAS_DIR}/slot-{slot}/step-*"))


async def _observed(run: CellRun, what: str, found: Callable[[], list[Path]]) -> list[Path]:
    """Wait until ``found()`` lists something (a state seen in the hosts' tmpfs: a
    deadline on progress, not a delay)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + run.ctx.shape.job_timeout_s
    while not (result := found()):
        if loop.time() > deadline:
            raise TimeoutError(f"never saw {what}")
        await asyncio.sleep(0.05)
    return result


def _committed_replicas(run: CellRun, holder: str, slot: int) -> list[Path]:
    return [p for p in _replicas(run, holder, slot) if (p / COMMIT_MARKER).exists()]


async def _replicas_up(run: CellRun) -> None:
    """The replica cells' phase: each buddy of :data:`BUDDY_OF` holds a committed
    replica of its slot (the ring pushes)."""
    for holder, slot in BUDDY_OF.items():
        await _observed(
            run,
            f"a committed replica of slot {slot} on {holder}",
            partial(_committed_replicas, run, holder, slot),
        )
    run.notes["replicas_seen"] = {
        holder: [p.name for p in _committed_replicas(run, holder, slot)]
        for holder, slot in BUDDY_OF.items()
    }


def _first_launch_after(launches: list[Launch], at: float) -> Launch | None:
    after = [launch for launch in launches if launch.at >= at]
    return min(after, key=lambda launch: launch.generation) if after else None


# --------------------------------------------------------------------------- ssh_rejoin


async def _into_ssh_rejoin(run: CellRun) -> None:
    """Crash rank 1 (alone on h2) and hold the recovery's launch where h1's agent has
    carried rank 0 across ssh and the new rank 1 is started on h2, launch.json not
    yet written: the middle of a cross-node rejoin, reached by a chaos point."""
    await run.job.reach_step(run.ctx.shape.fault_step)
    run.points.arm(points.LAUNCH_BEFORE_LAUNCH_JSON)
    signal_newest(run, 1, signal.SIGKILL)
    await held_at(run, points.LAUNCH_BEFORE_LAUNCH_JSON)
    gen = chaos.newest_generation(run.job.run_root)
    assert gen is not None, "no generation held at the launch"
    carried = [rank for rank in range(run.job.spec.world_size) if gen.pid_file(rank).is_symlink()]
    run.notes["carried"] = {"generation": gen.generation, "ranks": carried}
    if carried != [0]:
        raise RuntimeError(
            f"generation {gen.generation}'s launch carried ranks {carried}, not rank 0 on "
            "h1: not a cross-node rejoin"
        )


async def rank_kill_ssh_rejoin(run: CellRun) -> None:
    await _into_ssh_rejoin(run)
    signal_newest(run, 1, signal.SIGKILL)  # the new rank 1 on h2, mid-rendezvous
    run.points.release(points.LAUNCH_BEFORE_LAUNCH_JSON)


async def worker_kill_ssh_rejoin(run: CellRun) -> None:
    await _into_ssh_rejoin(run)
    await kill_worker(run)
    run.points.release(points.LAUNCH_BEFORE_LAUNCH_JSON)
    await restart_worker(run)


# --------------------------------------------------------------------------- replicated


async def node_and_buddy_lost(run: CellRun) -> None:
    """h2 and its buddy h3 die together, once the ring holds replicas: h2's step is
    in no tmpfs any more (its own died with it, its replicas with h3), so two spares
    take their slots and every rank resumes from disk."""
    hosts = _hosts(run)
    await run.job.reach_step(run.ctx.shape.fault_step)
    await _replicas_up(run)
    _, step = chaos.current_step(run.job.run_root)
    killed_at = time.time()
    for name in (PROTECTED, BUDDY):  # both cut first: neither is seen going before the other
        hosts.partition(name)
    for name in (PROTECTED, BUDDY):
        await asyncio.to_thread(hosts.kill_host, name)
    run.notes.setdefault("faults", []).append(
        {"hosts_killed": [PROTECTED, BUDDY], "at": killed_at, "step": step}
    )
    run.notes["killed_at"] = killed_at


def resumed_from_disk(run: CellRun, launches: list[Launch]) -> list[str]:
    """The first launch after the double loss resumed every rank from disk: no node's
    memory can serve h2's slot, so a memory resume would mix h1's snapshot with a step
    h2 never held (or with disk)."""
    launch = _first_launch_after(launches, float(run.notes["killed_at"]))
    if launch is None:
        return [f"no launch after {PROTECTED} and {BUDDY} were lost"]
    run.notes["resumed_after_loss"] = {
        "generation": launch.generation,
        "step": launch.resume_step,
        "path": launch.resume_path,
    }
    if launch.resume_path is None:
        return [f"generation {launch.generation} started from scratch, not from disk"]
    if is_memory_path(launch.resume_path):
        return [
            f"generation {launch.generation} resumed the memory tier ({launch.resume_path}) "
            f"although {PROTECTED}'s snapshots died with it and their replicas with {BUDDY}"
        ]
    return []


def _received_whole(run: CellRun) -> list[Path]:
    """Replicas of slot 1 on h3 whose files all arrived (the manifest comes last), not
    committed: what a receiver held at ``replica.before_commit`` has written."""
    return [
        p
        for p in _replicas(run, BUDDY, 1)
        if (p / MANIFEST).exists()
        and not (p / COMMIT_MARKER).exists()
        and not any(p.glob(f"*{TEMP_SUFFIX}"))
    ]


async def replica_torn(run: CellRun) -> None:
    """h3 receives h2's newest snapshot and is held before it checks and commits it; a
    data file of that copy is cut to half (a torn write), h2 is lost, and the receiver
    goes on: it must refuse the copy, so the search finds only older verified steps."""
    hosts = _hosts(run)
    await run.job.reach_step(run.ctx.shape.fault_step)
    await _replicas_up(run)
    run.points.arm(points.REPLICA_BEFORE_COMMIT)
    await held_at(run, points.REPLICA_BEFORE_COMMIT)  # every receiver holds there now
    [held, *_] = await _observed(
        run, "h3 holding a received replica of h2", partial(_received_whole, run)
    )
    data = sorted(
        (p for p in held.iterdir() if p.is_file() and p.name != MANIFEST),
        key=lambda p: p.stat().st_size,
    )
    if not data or data[-1].stat().st_size < 2:
        raise RuntimeError(f"{held}: no data file to tear")
    target = data[-1]
    size = target.stat().st_size
    os.truncate(target, size // 2)
    step = parse_step_dir(held.name)
    assert step is not None, held
    run.notes["torn"] = {"step": step, "file": target.name, "size": size, "kept": size // 2}
    killed_at = time.time()
    await asyncio.to_thread(hosts.kill_host, PROTECTED)
    run.notes.setdefault("faults", []).append(
        {"hosts_killed": [PROTECTED], "at": killed_at, "torn_replica_step": step}
    )
    run.notes["killed_at"] = killed_at
    run.points.release(points.REPLICA_BEFORE_COMMIT)


def torn_replica_refused(run: CellRun, launches: list[Launch]) -> list[str]:
    """The torn copy was refused by verification (the receiver's, logged by h3's rank;
    or the search's, as a skipped torn checkpoint) and the first launch after the
    loss did not resume its step from memory."""
    torn = run.notes["torn"]
    step = int(torn["step"])
    problems: list[str] = []
    refusal = f"step {step} of slot 1: torn"
    logs = run.job.run_root.glob(f"*/gen-*/rank-{REPLICA_RANK}.log")
    refused = any(refusal in log.read_text(errors="replace") for log in logs)
    run.notes["refused_by_receiver"] = refused
    launch = _first_launch_after(launches, float(run.notes["killed_at"]))
    if not refused:
        problems.append(f"h3's receiver never logged refusing the torn copy ({refusal!r})")
    if launch is None:
        return [*problems, f"no launch after {PROTECTED} was lost"]
    run.notes["resumed_after_loss"] = {
        "generation": launch.generation,
        "step": launch.resume_step,
        "path": launch.resume_path,
    }
    if launch.resume_path is None:
        problems.append(f"generation {launch.generation} started from scratch")
    elif is_memory_path(launch.resume_path) and launch.resume_step >= step:
        problems.append(
            f"generation {launch.generation} resumed memory step {launch.resume_step}: the "
            f"torn replica's step ({step}) or one past it, which {PROTECTED} alone held"
        )
    return problems


CELLS: list[Cell] = [
    Cell(
        "rank_sigkill",
        "ssh_rejoin",
        "the new rank dies on h2 while h1's survivor rejoins across ssh: never two "
        "generations, the job still completes",
        rank_kill_ssh_rejoin,
        rejoin=True,
        ssh=SshLayout(nodes=2),
    ),
    Cell(
        "worker_sigkill",
        "ssh_rejoin",
        "the controller dies while h1's survivor rejoins across ssh: the retried launch "
        "carries the same survivor and adopts the new rank, never a duplicate",
        worker_kill_ssh_rejoin,
        rejoin=True,
        ssh=SshLayout(nodes=2),
    ),
    Cell(
        "node_and_buddy_lost",
        "replicated",
        "h2 and its replica buddy h3 lost at once: the memory tier cannot serve h2's "
        "slot, so every rank resumes from disk (never memory and disk, or two timelines, "
        "mixed)",
        node_and_buddy_lost,
        memory=True,
        ssh=SshLayout(nodes=3, spares=2, replicas=True),
        check=resumed_from_disk,
    ),
    Cell(
        "replica_torn",
        "replicated",
        "h3's copy of h2's newest snapshot torn before it commits, then h2 lost: the "
        "torn replica is refused and the job resumes from an older verified step",
        replica_torn,
        memory=True,
        ssh=SshLayout(nodes=3, spares=1, replicas=True, points_in_ranks=True),
        check=torn_replica_refused,
    ),
]
