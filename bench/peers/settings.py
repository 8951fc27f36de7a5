"""Each peer's settings: what the bench runs it with, recorded in every results file.

Each peer gets its best working setup on this machine (CPU, gloo), as torchrun
does (:mod:`bench.torchrun`): the shortest detection its documentation allows
that does not misfire on a 2-core machine, restarts allowed, and the same job
(model, steps, step time, checkpoint interval, fault step). The values are
derived from the job's shape, so ``--quick`` scales them with the job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

from bench.jobs import JobShape, flags

NVRX_DIST = "nvidia-resiliency-ext"
TORCHFT_DIST = "torchft"


def version(dist: str) -> str | None:
    """``dist``'s installed version, or None where it is not installed (a peer before
    ``make bench-peers``): the results files record it for every package they name."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class NvrxSettings:
    """NVRx ``ft_launcher`` (torchrun-compatible, with a rank monitor per rank)."""

    max_restarts: int = 3
    monitor_interval_s: float = 0.5
    """torchrun's ``--monitor-interval``: how often the agent looks at its workers."""
    workload_check_interval_s: float = 0.5
    """``--ft-workload-check-interval``: how often each rank monitor checks its rank."""
    initial_rank_heartbeat_timeout_s: float = 120.0
    """``--ft-initial-rank-heartbeat-timeout``: the first heartbeat comes after
    torch is imported and the group formed (seconds on a busy machine)."""
    rank_heartbeat_timeout_s: float = 10.0
    """``--ft-rank-heartbeat-timeout``: a rank silent this long is hung (the
    shape's ``hang_timeout_s``, as Lazarus's)."""
    unshared_store: bool = True
    """``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, as the torchrun system (see there)."""
    local_checkpointing: str = (
        "off: NVRx's stock local-checkpoint state-dict class needs CUDA tensors; on CPU it "
        "takes a state-dict class of one's own (the 2026-12-03 review wrote one: 6.64 s, "
        "1 step lost), not written for the bench yet. The job keeps its own disk "
        "checkpoints every ckpt_every steps"
    )
    hot_spare: str = (
        "one node: none (ft_launcher's spares are whole nodes); multinode_node_loss: the "
        "spare host's agent, a hot spare of NVRx's barrier rendezvous (--nnodes 2:3)"
    )
    node_loss_nnodes: str = "2:3"
    """``--nnodes`` of ``multinode_node_loss``: 2 active nodes; a third that joins
    waits as a hot spare (its rank past ``min_nodes`` is standby)."""
    last_call_timeout_s: int = 1
    """``--rdzv-conf last_call_timeout`` (NVRx's default): how long a restart round
    waits for a missing previous node before it takes the hot spare."""

    @classmethod
    def for_shape(cls, shape: JobShape) -> NvrxSettings:
        return cls(rank_heartbeat_timeout_s=shape.hang_timeout_s)

    def launcher_flags(self) -> list[str]:
        return flags(
            ft_workload_check_interval=self.workload_check_interval_s,
            ft_initial_rank_heartbeat_timeout=self.initial_rank_heartbeat_timeout_s,
            ft_rank_heartbeat_timeout=self.rank_heartbeat_timeout_s,
        )


@dataclass(frozen=True)
class NvrxInprocessSettings:
    """NVRx's in-process restart (``inprocess.Wrapper``), processes started directly."""

    processes: int = 3
    """The world size (2) plus one spare: a SIGKILLed process cannot come back in
    process, so the spare takes its place (``MaxActiveWorldSize(2)``, ``ShiftRanks``)."""
    active_world_size: int = 2
    soft_timeout_s: float = 10.0
    """No progress (``call_wrapper.ping``, once a step) this long: the rank aborts and
    restarts in process (the shape's ``hang_timeout_s``)."""
    hard_timeout_s: float = 15.0
    """No progress this long: the rank is terminated (must exceed the soft timeout)."""
    heartbeat_timeout_s: float = 5.0
    """A rank whose monitor stops heartbeating this long is declared missing."""
    heartbeat_interval_s: float = 0.5
    monitor_interval_s: float = 0.5
    """Both ``monitor_thread_interval`` and ``monitor_process_interval``."""
    barrier_timeout_s: float = 120.0
    completion_timeout_s: float = 120.0
    last_call_wait_s: float = 0.2
    pg_timeout_s: float = 10.0
    """The gloo group's timeout: gloo collectives cannot be aborted in process, so a
    hung peer is waited out this long (the shape's ``hang_timeout_s``)."""
    node_loss: str = (
        "multinode_node_loss: 2 processes per host on h1, h2 and h3 (world 6), "
        "MaxActiveWorldSize(4) and ShiftRanks, so h3's two are the spares; the Wrapper's "
        "and the job's stores on rank 0 (h1); the other settings as above"
    )
    local_rank_unset: str = (
        "LOCAL_RANK not set: with it the Wrapper adds GPU/NVLink/NIC health checks "
        "that fail without NVML and end the job"
    )

    @classmethod
    def for_shape(cls, shape: JobShape) -> NvrxInprocessSettings:
        return cls(
            soft_timeout_s=shape.hang_timeout_s,
            hard_timeout_s=shape.hang_timeout_s * 1.5,
            pg_timeout_s=shape.hang_timeout_s,
        )


@dataclass(frozen=True)
class TorchftSettings:
    """torchft: a Lighthouse and one replica group per process, each under torchrun."""

    groups: int = 2
    min_replicas: int = 1
    """Lighthouse ``--min_replicas`` and the Manager's ``min_replica_size``: 1 lets
    the survivors train on while a group is down (torchft's point); the price is that
    weights then differ from a fault-free run (a group trained alone for a while)."""
    heartbeat_timeout_ms: int = 1000
    """Lighthouse ``--heartbeat_timeout_ms`` (default 5000): a group silent this long
    is out of the next quorum. The Manager heartbeats every 100 ms."""
    join_timeout_ms: int = 2000
    """Lighthouse ``--join_timeout_ms`` (default 60000): how long a quorum waits for
    heartbeating stragglers."""
    quorum_tick_ms: int = 100
    timeout_s: float = 10.0
    """The Manager's and the gloo group's timeout for collectives (a hung group is
    waited out this long: the shape's ``hang_timeout_s``)."""
    quorum_timeout_s: float = 60.0
    max_restarts: int = 3
    """Each group's ``torchrun --max-restarts``."""
    monitor_interval_s: float = 0.5
    comm_hook: str = (
        "torchft's DDP hook less its assertion: torchft 0.2.0's asserts when the peer "
        "dies mid-allreduce, crashing the survivor; ours returns the buffer of the step "
        "the Manager already failed, so the step is discarded (should_commit False)"
    )
    start_together: str = (
        "a first start waits until every group heartbeats, so the first quorum holds both"
    )
    healing: str = "a restarted group heals from a live peer (torchft's HTTP checkpoint transport)"
    node_loss: str = (
        "multinode_node_loss: one group per host (group 0 and the Lighthouse on h1, group 1 "
        "on h2, 1 rank each); torchft has no spares, so the bench plays the scheduler: a "
        "replacement group 1 waits on h3 (imports done) and goes on node_timeout_s after "
        "the kill, then heals from the survivor"
    )

    @classmethod
    def for_shape(cls, shape: JobShape) -> TorchftSettings:
        return cls(timeout_s=shape.hang_timeout_s)

    def lighthouse_flags(self) -> list[str]:
        return [
            "--min_replicas",
            str(self.min_replicas),
            "--heartbeat_timeout_ms",
            str(self.heartbeat_timeout_ms),
            "--join_timeout_ms",
            str(self.join_timeout_ms),
            "--quorum_tick_ms",
            str(self.quorum_tick_ms),
        ]


PEERS: dict[str, tuple[str, Callable[[JobShape], Any]]] = {
    "nvrx": (NVRX_DIST, NvrxSettings.for_shape),
    "nvrx_inprocess": (NVRX_DIST, NvrxInprocessSettings.for_shape),
    "torchft": (TORCHFT_DIST, TorchftSettings.for_shape),
}
"""Each peer's distribution and its settings for a job's shape."""


def peer_settings(systems: list[str], shape: JobShape) -> dict[str, dict[str, Any]]:
    """What the results file records for each peer in ``systems``: version and settings."""
    return {
        system: {"version": version(dist), **asdict(settings(shape))}
        for system, (dist, settings) in PEERS.items()
        if system in systems
    }
