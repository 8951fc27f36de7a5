"""``python -m bench slurm-calls``: how many Slurm commands supervision sends a second
per job, at 2, 8 and 64 nodes (issue 29: at most 1), and how late a change in Slurm
is seen.

Simulated, no Slurm needed: N :class:`~activities.nodes.slurm.agent.SlurmAgent` nodes
poll a running generation through the real code paths for a simulated minute, against
:class:`FakeSlurm`, which counts every command on a clock moved by hand. The method and
figures: docs/results/2026-12-bench-notebook-4.md, "Slurm calls per job".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from activities.nodes.agent import NodeStatus
from activities.nodes.rundir import GenerationDir
from activities.nodes.slurm.agent import SlurmAgent
from activities.nodes.slurm.commands import SlurmCommandFailed
from activities.nodes.slurm.rounds import QUERY_INTERVAL_S, SlurmRounds
from bench import costs
from bench.costs import results_path, write_results
from lazarus.domain.spec import NodeSpec, SlurmSpec

JOB = 7
NPROC = 2
DEFAULT_NODES = (2, 8, 64)
POLL_INTERVAL_S = 0.5
"""``health.poll_interval_s``'s default."""


class FakeSlurm:
    """``squeue --steps``, ``squeue -j J -o %T`` and ``scontrol show node -o``
    answered from dicts; every command counted. Each command takes 1 ms of the fake
    monotonic clock."""

    def __init__(self) -> None:
        self.now = 100.0
        self.steps: dict[str, str] = {}
        """step id -> name."""
        self.states: dict[str, str] = {}
        """node -> State=..."""
        self.job_state = "RUNNING"
        self.calls: list[list[str]] = []
        self._lock = threading.Lock()
        self.fail = False

    def clock(self) -> float:
        return self.now

    def run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        with self._lock:
            self.calls.append(argv)
            self.now += 0.001
        if self.fail:
            raise SlurmCommandFailed(f"{argv[0]}: no answer within 30 s")
        if argv[0] == "squeue" and "--steps" in argv:
            out = "".join(f"{s}|{n}|RUNNING|\n" for s, n in sorted(self.steps.items()))
            return subprocess.CompletedProcess(argv, 0, out, "")
        if argv[0] == "squeue":
            return subprocess.CompletedProcess(argv, 0, f"{self.job_state}\n", "")
        if argv[:3] == ["scontrol", "show", "node"]:
            wanted = argv[-1].split(",")
            out = "".join(
                f"NodeName={n} Arch=x86_64 NodeAddr={n} State={self.states[n]} Weight=1\n"
                for n in wanted
                if n in self.states
            )
            missing = [n for n in wanted if n not in self.states]
            err = "".join(f"Node {n} not found\n" for n in missing)
            return subprocess.CompletedProcess(argv, 1 if missing else 0, out, err)
        raise AssertionError(f"unexpected command {argv}")

    def count(self, command: str, *flags: str) -> int:
        """Commands named ``command`` whose arguments include every one of ``flags``."""
        return sum(1 for a in self.calls if a[0] == command and all(f in a for f in flags))


def generation(root: Path, slurm: FakeSlurm, nodes: int) -> tuple[GenerationDir, list[str]]:
    """A running generation of ``nodes`` nodes, one step each, every rank's pid file."""
    gen = GenerationDir.of(root / "run", 1)
    gen.path.mkdir(parents=True)
    names = [f"n{i}" for i in range(nodes)]
    gen.plan_file.write_text(json.dumps({"nodes": names, "nproc_per_node": NPROC}))
    for index, name in enumerate(names):
        start_step(gen, slurm, index, name)
        slurm.states[name] = "ALLOCATED"
    return gen, names


def start_step(gen: GenerationDir, slurm: FakeSlurm, index: int, name: str) -> None:
    slurm.steps[f"{JOB}.{index}"] = f"lazarus-g1-x-{name}"
    for rank in range(index * NPROC, (index + 1) * NPROC):
        gen.pid_file(rank).write_text(
            json.dumps(
                {"rank": rank, "pid": 1000 + rank, "pgid": 1000 + rank, "start_ticks": 1}
                | {"slurm_step": f"{JOB}.{index}", "slurm_node": name}
            )
        )


def agents(names: list[str], rounds: SlurmRounds) -> list[SlurmAgent]:
    slurm = SlurmSpec(job_id=JOB)
    return [SlurmAgent(NodeSpec(name=n, launcher="slurm"), slurm, rounds=rounds) for n in names]


def poll_round(
    gen: GenerationDir,
    polled: list[SlurmAgent],
    threads: bool = True,
    pool: ThreadPoolExecutor | None = None,
) -> list[NodeStatus]:
    """One supervision round's polls: every node at once, as the observer does."""

    def poll(index_agent: tuple[int, SlurmAgent]) -> NodeStatus:
        index, agent = index_agent
        ranks = list(range(index * NPROC, (index + 1) * NPROC))
        return agent.poll(str(gen.path), ranks)

    if not threads:
        return [poll(item) for item in enumerate(polled)]
    if pool is not None:
        return list(pool.map(poll, enumerate(polled)))
    with ThreadPoolExecutor(max_workers=len(polled)) as own:
        return list(own.map(poll, enumerate(polled)))


def supervise_round(
    gen: GenerationDir, polled: list[SlurmAgent], pool: ThreadPoolExecutor
) -> list[NodeStatus]:
    """A whole round: the polls, then the preemption check by the first agent
    (:meth:`activities.supervise_observer.SuperviseObserver._preemption`)."""
    statuses = poll_round(gen, polled, pool=pool)
    notice = polled[0].preemption_notice(None, None)
    assert notice is None, notice
    return statuses


def measure(
    nodes: int, seconds: float = 60.0, poll_interval_s: float = POLL_INTERVAL_S
) -> dict[str, Any]:
    """Commands sent while supervising a running ``nodes``-node job for ``seconds`` of
    simulated time, by kind, and their rate."""
    slurm = FakeSlurm()
    with tempfile.TemporaryDirectory() as root, ThreadPoolExecutor(nodes) as pool:
        gen, names = generation(Path(root), slurm, nodes)
        polled = agents(names, SlurmRounds(runner=slurm.run, clock=slurm.clock))
        start = slurm.now
        rounds = 0
        while slurm.now - start < seconds:
            at = slurm.now
            statuses = supervise_round(gen, polled, pool)
            assert all(s.reachable and all(r.alive for r in s.ranks) for s in statuses)
            rounds += 1
            slurm.now = at + poll_interval_s
    steps = slurm.count("squeue", "--steps")
    total = len(slurm.calls)
    return {
        "nodes": nodes,
        "seconds": seconds,
        "poll_interval_s": poll_interval_s,
        "rounds": rounds,
        "squeue_steps": steps,
        "scontrol": slurm.count("scontrol"),
        "squeue_job_state": slurm.count("squeue") - steps,
        "total": total,
        "per_second": total / seconds,
    }


def lost_node_seen_after(
    nodes: int, offset_s: float, poll_interval_s: float = POLL_INTERVAL_S
) -> float:
    """Simulated seconds from a node turning DOWN in Slurm, ``offset_s`` after the
    first round, until a poll reports it lost."""
    slurm = FakeSlurm()
    with tempfile.TemporaryDirectory() as root, ThreadPoolExecutor(nodes) as pool:
        gen, names = generation(Path(root), slurm, nodes)
        polled = agents(names, SlurmRounds(runner=slurm.run, clock=slurm.clock))
        start = slurm.now
        down_at: float | None = None
        while True:
            at = slurm.now
            if down_at is None and at - start >= offset_s:
                # The change lands between rounds, just after the previous one asked.
                down_at = start + offset_s
                slurm.states[names[-1]] = "DOWN*"
            statuses = supervise_round(gen, polled, pool)
            if down_at is not None and not statuses[-1].reachable:
                return slurm.now - down_at
            if at - start > offset_s + 60:
                raise AssertionError("the lost node was never reported")
            slurm.now = at + poll_interval_s


def staleness(nodes: int, poll_interval_s: float = POLL_INTERVAL_S) -> float:
    """The largest :func:`lost_node_seen_after` over offsets spread across two query
    intervals (every phase of the shared answer's age)."""
    steps = 20
    offsets = [2 * QUERY_INTERVAL_S * i / steps + 0.001 for i in range(steps)]
    return max(lost_node_seen_after(nodes, o, poll_interval_s) for o in offsets)


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| nodes | simulated s | rounds | `squeue --steps` | `scontrol show node` "
        "| `squeue -j -o %T` | total | calls/s | node DOWN seen after (max, s) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['nodes']} | {r['seconds']:g} | {r['rounds']} | {r['squeue_steps']} "
            f"| {r['scontrol']} | {r['squeue_job_state']} | {r['total']} "
            f"| {r['per_second']:.2f} | {r['down_seen_after_s']:.2f} |"
        )
    return "\n".join(lines)


def add_command(commands: Any) -> None:
    parser = costs.add_parser(
        "slurm-calls",
        commands,
        __doc__,
        help="Slurm commands per second that supervising one job sends, simulated "
        "(2, 8, 64 nodes; CPU only)",
        nodes=DEFAULT_NODES,
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="simulated (default 60)")
    parser.add_argument(
        "--poll-interval", type=float, default=POLL_INTERVAL_S, help="health.poll_interval_s"
    )


def run(args: argparse.Namespace) -> int:
    rows = []
    for nodes in args.nodes:
        row = measure(nodes, args.seconds, args.poll_interval)
        row["down_seen_after_s"] = staleness(nodes, args.poll_interval)
        rows.append(row)
    payload = {"benchmark": "slurm-calls", "query_interval_s": QUERY_INTERVAL_S, "rows": rows}
    write_results(results_path("slurm-calls", args.json_out), payload, markdown(rows))
    return 0
