"""Simulated nodes: no processes, no network, for measuring the controller at scale.

A :class:`SimulatedCluster` holds, in memory, what a fleet of nodes would hold on
disk: which ranks each node started, how far each got, which crashed and which
node went silent. :class:`SimulatedAgent` answers the :class:`NodeAgent` calls
from it, so the real supervise activity (and anything else that goes through
the agent factory) runs unchanged against thousands of nodes on one machine.

It is not a launcher a job spec can name: the bench and the tests install a
cluster with :func:`simulate` (a process-wide substitution in
:mod:`activities.nodes.factory`), and only nodes the cluster knows are
simulated. Faults are injected from outside, as chaos would on real nodes:

- :meth:`SimulatedCluster.crash`: a rank exits with a code and an exit record,
  as the rank wrapper would write it;
- :meth:`SimulatedCluster.silence`: the node stops answering. A poll then
  blocks for ``silent_poll_s`` (the transport's command timeout, as an SSH poll
  of a dead host does) and comes back unreachable.

``round_trip_s`` models the network: every call sleeps that long (in its
thread, costing no CPU), so concurrency limits show up as they would on SSH.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from activities.nodes.agent import (
    MemorySnapshot,
    NodeAgent,
    NodeStatus,
    PreflightRequest,
    PreflightResult,
    RankRecord,
)
from activities.nodes.node_records import NodeStopResult, RankLaunch, StartedRank
from activities.nodes.rundir import GenerationDir
from lazarus.domain.spec import NodeSpec

SIMULATED_PID_BASE = 1_000_000
"""Simulated pids start here: far above any real pid, never signalled."""


@dataclass
class _SimRank:
    rank: int
    started_at: float
    exit: dict[str, object] | None = None


@dataclass
class _SimNode:
    name: str
    ranks: dict[tuple[str, int], _SimRank] = field(default_factory=dict)
    """(generation directory, rank) -> the rank."""
    silent_since: float | None = None
    polls: int = 0


class SimulatedCluster:
    """The nodes' side of a simulated fleet, shared by every agent opened on it
    (the factory opens new agents in each activity; the state must outlive them).
    Thread-safe: polls of many nodes run at once."""

    def __init__(
        self,
        node_names: list[str],
        seconds_per_step: float = 0.2,
        round_trip_s: float = 0.0,
        silent_poll_s: float = 5.0,
    ) -> None:
        self.seconds_per_step = seconds_per_step
        self.round_trip_s = round_trip_s
        self.silent_poll_s = silent_poll_s
        self._lock = threading.Lock()
        self._nodes = {name: _SimNode(name) for name in node_names}
        self._silent = threading.Event()
        """Set when the cluster shuts down: silent polls stop blocking."""

    def knows(self, node: NodeSpec) -> bool:
        return node.name in self._nodes

    def agent(self, node: NodeSpec) -> SimulatedAgent:
        return SimulatedAgent(node, self)

    # ------------------------------------------------------------------ faults

    def start(self, gen_dir: str, node: str, ranks: list[int]) -> None:
        """Ranks running on ``node`` from now on (what a launch would do)."""
        now = time.time()
        with self._lock:
            for rank in ranks:
                self._nodes[node].ranks.setdefault((gen_dir, rank), _SimRank(rank, now))

    def crash(self, gen_dir: str, node: str, rank: int, exit_code: int = 1) -> float:
        """The rank exits with ``exit_code`` and its exit record; returns when (wall)."""
        now = time.time()
        with self._lock:
            found = self._nodes[node].ranks[(gen_dir, rank)]
            found.exit = {"exit_code": exit_code, "signal": None, "ended_at": now}
        return now

    def silence(self, node: str) -> float:
        """The node stops answering (a dead host); returns when (wall)."""
        now = time.time()
        with self._lock:
            self._nodes[node].silent_since = now
        return now

    def heal(self, node: str) -> None:
        with self._lock:
            self._nodes[node].silent_since = None

    def forget(self, gen_dir: str) -> None:
        """Drop a generation's ranks (the bench reuses the nodes for the next trial)."""
        with self._lock:
            for sim in self._nodes.values():
                for key in [k for k in sim.ranks if k[0] == gen_dir]:
                    del sim.ranks[key]

    def polls(self, node: str) -> int:
        with self._lock:
            return self._nodes[node].polls

    def close(self) -> None:
        """Release every poll blocked on a silent node."""
        self._silent.set()

    # ------------------------------------------------------------------ answers

    def _wait(self, seconds: float) -> None:
        if seconds > 0:
            self._silent.wait(seconds)

    def poll(self, node: str, gen_dir: str, ranks: list[int]) -> NodeStatus:
        started = time.monotonic()
        with self._lock:
            sim = self._nodes[node]
            sim.polls += 1
            silent = sim.silent_since is not None
        if silent:
            self._wait(self.silent_poll_s)
            return NodeStatus(
                node=node,
                reachable=False,
                error=f"timed out after {self.silent_poll_s:.1f} s (simulated silent node)",
                observed_at=time.time(),
                round_trip_s=time.monotonic() - started,
            )
        self._wait(self.round_trip_s)
        now = time.time()
        records: list[RankRecord] = []
        with self._lock:
            for rank in ranks:
                found = sim.ranks.get((gen_dir, rank))
                records.append(self._record(rank, found, now))
        return NodeStatus(
            node=node,
            reachable=True,
            ranks=records,
            observed_at=now,
            round_trip_s=time.monotonic() - started,
        )

    def _record(self, rank: int, found: _SimRank | None, now: float) -> RankRecord:
        if found is None:
            return RankRecord(rank=rank)
        end = now if found.exit is None else float(str(found.exit["ended_at"]))
        step = int((end - found.started_at) / self.seconds_per_step)
        return RankRecord(
            rank=rank,
            pid=SIMULATED_PID_BASE + rank,
            alive=found.exit is None,
            exit=found.exit,
            heartbeat={"step": step, "time": found.started_at + step * self.seconds_per_step},
        )

    def stop(self, node: str, run_root: str, keep_generation: int | None) -> NodeStopResult:
        """Ranks under ``run_root`` end as if SIGTERMed; those of ``keep_generation``
        are left running."""
        now = time.time()
        keep = (
            None
            if keep_generation is None
            else GenerationDir.of(run_root, keep_generation).path.name
        )
        stopped = 0
        with self._lock:
            for (gen_dir, _), found in self._nodes[node].ranks.items():
                inside = gen_dir.startswith(run_root.rstrip("/") + "/")
                kept = PurePosixPath(gen_dir).name == keep
                if inside and not kept and found.exit is None:
                    found.exit = {"exit_code": -15, "signal": "SIGTERM", "ended_at": now}
                    stopped += 1
        return NodeStopResult(node=node, reachable=True, signalled_groups=stopped)


class SimulatedAgent(NodeAgent):
    """One simulated node, answering from its :class:`SimulatedCluster`."""

    def __init__(self, node: NodeSpec, cluster: SimulatedCluster) -> None:
        super().__init__(node)
        self.cluster = cluster

    def start_ranks(self, gen_dir: str, ranks: list[RankLaunch]) -> list[StartedRank]:
        self.cluster.start(gen_dir, self.node.name, [r.rank for r in ranks])
        return [
            StartedRank(
                rank=r.rank,
                pid=SIMULATED_PID_BASE + r.rank,
                pgid=SIMULATED_PID_BASE + r.rank,
                start_ticks=0,
                log_file=f"{gen_dir}/rank-{r.rank}.log",
            )
            for r in ranks
        ]

    def poll(self, gen_dir: str, ranks: list[int]) -> NodeStatus:
        return self.cluster.poll(self.node.name, gen_dir, ranks)

    def stop(
        self,
        run_root: str,
        keep_generation: int | None,
        grace_s: float,
        kill_wait_s: float = 10.0,
    ) -> NodeStopResult:
        return self.cluster.stop(self.node.name, run_root, keep_generation)

    def end_run(self, run_root: str, memory_dirs: list[str]) -> None:
        return None

    def log_tail(self, gen_dir: str, rank: int, max_bytes: int = 65536) -> str:
        return f"simulated rank {rank} on {self.node.name}\n"

    def preflight(self, request: PreflightRequest) -> PreflightResult:
        return PreflightResult(node=self.node.name, ok=True)

    def write_file(self, path: str, content: str) -> None:
        return None

    def memory_snapshots(self, root: str) -> list[MemorySnapshot]:
        return []


@contextmanager
def simulate(cluster: SimulatedCluster) -> Iterator[SimulatedCluster]:
    """Nodes the cluster knows are simulated in this process (the worker's too, when
    it runs here) until the block ends; every other node keeps its launcher."""
    from activities.nodes.factory import substituted_agents

    def source(node: NodeSpec) -> NodeAgent | None:
        return cluster.agent(node) if cluster.knows(node) else None

    try:
        with substituted_agents(source):
            yield cluster
    finally:
        cluster.close()
