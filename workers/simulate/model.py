"""The simulated cluster's model: failure profiles, a seeded failure trace, recovery
costs calibrated on this machine, training progress with checkpoints, Young-Daly.

Pure and deterministic (a seed in, the same trace out), so every configuration the
simulator compares (fixed interval or Young-Daly, lemon exclusion or not, 0/1/2%
spares) meets the *same* failures on the same physical nodes, and the unit tests
check the arithmetic without a server.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from lazarus.domain.checkpoint_interval import daly_interval_s
from lazarus.domain.failure_classes import FailureClass

DAY_S = 86_400.0

CALIBRATION_FILE = "bench/results/recovery-20261201-004709-node-loss.json"
"""The measured phase breakdown the cost model starts from: a node loss on 3 ssh nodes
(network namespaces, ``python -m bench recovery --scenarios node_loss``), median of 3
repeats. Which figure of it feeds which simulator parameter: :data:`CALIBRATION`."""

MEASURED_NODES = 3


@dataclass(frozen=True)
class Calibrated:
    """One measured figure of :data:`CALIBRATION_FILE` and what the simulator does with it."""

    seconds: float
    """The median over the file's repeats (its ``summary``)."""
    measured: tuple[str, ...]
    """The metrics of the file's ``node_loss`` summary it is made of (added up; a
    ``-name`` is subtracted)."""
    feeds: str
    """The :class:`CostModel` figure it sets, and how it scales; "unused" when the
    simulator takes the cost from elsewhere (and why)."""


CALIBRATION: dict[str, Calibrated] = {
    "detection_overhead": Calibrated(
        7.02 - 5.0,
        ("phase_detected_s", "-node_timeout_s"),
        "detection_s('node_lost') = the spec's node_timeout_s + this (the poll past the "
        "timeout and its ssh timeouts); crashes and hangs are not calibrated: a poll "
        "interval + 1 s, and the hang timeout + a poll interval",
    ),
    "decision": Calibrated(
        0.009, ("phase_decided_s",), "unused: the workflow's own decision, in simulated time"
    ),
    "stop": Calibrated(0.236, ("phase_survivors_stopped_s",), "stop_s, x fan_out"),
    "resume_search": Calibrated(0.026, ("phase_resume_chosen_s",), "search_s, x fan_out"),
    "launch": Calibrated(
        0.192 + 0.201,
        ("phase_launch_requested_s", "phase_rank_started_s"),
        "launch_s, x fan_out",
    ),
    "import": Calibrated(1.862, ("phase_framework_imported_s",), "startup_s's imports, x fan_out"),
    "process_group": Calibrated(
        0.407,
        ("phase_process_group_ready_s",),
        "rendezvous_s: this + the published per-rank store and NCCL costs (or x nodes/3, "
        "--rendezvous linear)",
    ),
    "checkpoint_load": Calibrated(
        1.674,
        ("phase_checkpoint_loaded_s",),
        "unused: startup_s reads the checkpoint back in the profile's δ (a 5.7 TB state, "
        "not the example's)",
    ),
    "first_step": Calibrated(
        0.449, ("phase_first_step_s",), "unused: startup_s adds one step of the profile's"
    ),
}
"""Every measured figure the cost model is built from, the metric it comes from and
the simulator parameter it feeds. ``fan_out`` is log2(nodes) / log2(3): the legs
that fan out to every node grow with the tree depth of the fan-out, not the count.
``tests/unit/test_simulate_model.py`` recomputes each figure from the file."""

MEASURED_PHASES_S: dict[str, float] = {name: c.seconds for name, c in CALIBRATION.items()}
"""The seconds of :data:`CALIBRATION`, by name."""


RENDEZVOUS_MODELS = ("published", "linear")
"""How the rendezvous grows with the job (:meth:`CostModel.rendezvous_s`)."""

TCPSTORE_INIT_S_PER_RANK = 100.0 / 98_304
"""PyTorch's libuv TCPStore (the default since 2.4) had every rank of a 98,304-rank job
connected in 100 s ("Introduction to Libuv TCPStore Backend", PyTorch tutorials)."""

NCCL_INIT_S_PER_RANK = 265.0 / 98_304
"""Stock NCCL's bootstrap and connection set-up took about 265 s at 96K GPUs (Si et al.,
2025, "Collective Communication for 100k+ GPUs", the NCCLX paper). That growth is
super-linear, so scaling it down linearly overstates smaller jobs: a cautious figure."""

LLAMA3_STATE_BYTES = 405e9 * 14
"""Llama 3 405B's training state: bf16 weights (2 bytes a parameter) plus fp32 master
weights and Adam's two moments (12 bytes), 5.7 TB."""

LLAMA3_GPUS = 16_384
"""Llama 3 405B trained on 16,384 H100s (Dubey et al., 2024, section 3.3)."""

LLAMA3_STATE_BYTES_PER_GPU = LLAMA3_STATE_BYTES / LLAMA3_GPUS
"""Each GPU's share of that state, 0.35 GB: what one rank copies per memory snapshot."""

SNAPSHOT_COST_FILE = "bench/results/snapshot-cost-20261204.json"
"""The memory snapshot's measured cost per GB (``python -m bench snapshot-cost`` as of
commit 35cdd3d, retired since: ``python -m bench state-scale`` measures it at size)."""

SNAPSHOT_S_PER_GB = 0.1328
"""The blocking copy per GB at the file's largest size (1 GiB), median of 5."""

LLAMA3_GPUS_PER_NODE = 8
"""Llama 3's nodes: 8 H100s each (Dubey et al., 2024, section 3.3)."""

REPLICA_PUSH_COST_FILE = "bench/results/replica-push-cost-20261204.json"
"""A replica push's measured cost to the step per GB (``python -m bench replica-push-cost``
as of commit 35cdd3d, retired since: ``python -m bench state-scale`` measures it at size)."""

REPLICA_PUSH_S_PER_GB = 0.0644
"""The steps' extra time per GB pushed, separate cores, at the file's largest size (1
GiB), median of 5."""

STATE_SCALE_FILE = "docs/results/2026-12-state-scale.json"
"""The replica restore measured at size (``python -m bench state-scale``)."""

REPLICA_RESTORE_S_PER_GB = 1.43 / 1.073741824
"""Seconds per GB of the replica's copy onto the spare at 1 GiB a rank: 1.43 s
(0.75 GB/s), node to node over the SSH test hosts, loaded."""

REPLICA_RESTORE_START_S = 2.03 - 1.43
"""The restore's fixed part, at most: the 1 GiB node loss's whole resume search
(2.03 s, the restore included) less the copy; the search itself and the two ends'
start on their nodes are all charged to it."""

LLAMA3_STORAGE_BYTES_PER_S = 2e12
"""Tectonic's sustained throughput for Llama 3's checkpoints, 2 TB/s (7 TB/s at peak;
Dubey et al., 2024, section 3.3.1)."""

LLAMA3_CHECKPOINT_S = LLAMA3_STATE_BYTES / LLAMA3_STORAGE_BYTES_PER_S
"""δ for the Llama 3 profile, 2.8 s: its whole training state written at the storage's
sustained rate, with the ranks blocked for all of it (no asynchronous save)."""


@dataclass(frozen=True)
class ClassShare:
    """One Llama 3 interruption category, how it shows to Lazarus, and its share."""

    name: str
    share: float
    kind: str
    """The supervision outcome: ``crash``, ``hang`` or ``node_lost``."""
    failure_class: FailureClass
    hardware: bool
    """The node stays broken until it is replaced (its next preflight fails too)."""


LLAMA3_CLASSES: tuple[ClassShare, ...] = (
    # GPU 64%: faulty GPU 30%, HBM3 17%, the rest SRAM, GSP, driver, NVLink...
    ClassShare("gpu_faulty", 0.30, "crash", FailureClass.GPU_HARDWARE, True),
    ClassShare("gpu_hbm3", 0.17, "crash", FailureClass.GPU_HARDWARE, True),
    ClassShare("gpu_other", 0.17, "crash", FailureClass.GPU_HARDWARE, True),
    ClassShare("software", 0.13, "crash", FailureClass.UNKNOWN, False),
    ClassShare("host_maintenance", 0.11, "node_lost", FailureClass.NODE_LOST, True),
    # Network 12%: switch/cable 8% (a collective times out), NIC and NCCL errors 4%
    ClassShare("network_switch_cable", 0.08, "hang", FailureClass.NCCL_TIMEOUT, False),
    ClassShare("network_nic_nccl", 0.04, "crash", FailureClass.NCCL_ERROR, False),
)
"""Llama 3 405B pre-training, 54 days on 16,384 H100s: 419 unexpected interruptions
(Dubey et al., 2024, table 5), grouped as the issue gives them."""


@dataclass(frozen=True)
class FailureProfile:
    name: str
    per_node_day: float
    """Mean failures per node-day across the fleet (lemons included)."""
    source: str
    classes: tuple[ClassShare, ...] = LLAMA3_CLASSES


def llama3_profile(gpus_per_node: int) -> FailureProfile:
    return FailureProfile(
        "llama3",
        4.7e-4 * gpus_per_node,
        "Llama 3: 419 interruptions / (16,384 GPUs x 54 days) = 4.7e-4 per GPU-day",
    )


def kokolis_profile(gpus_per_node: int) -> FailureProfile:
    del gpus_per_node
    return FailureProfile(
        "kokolis",
        6.5e-3,
        "Kokolis et al. 2024 (Meta RSC): 6.5 failures per 1,000 node-days; "
        "classes in Llama 3's proportions",
    )


PROFILES = {"llama3": llama3_profile, "kokolis": kokolis_profile}


@dataclass(frozen=True)
class FailureEvent:
    at_s: float
    """Seconds after the simulation's start."""
    node: str
    share: ClassShare


@dataclass(frozen=True)
class ClusterTrace:
    """The physical nodes, which are lemons, what a fleet's memory would flag, and
    every failure over the horizon, sorted by time."""

    nodes: list[str]
    lemons: frozenset[str]
    flagged: frozenset[str]
    """Nodes a fleet would exclude up front: ``lemon_k`` or more incidents in their
    look-back window (drawn from the same rates: flags are imperfect, as in life)."""
    events: list[FailureEvent]
    lookback: dict[str, int] = field(default_factory=dict)
    """Per node, its incidents in the look-back window before the simulation starts:
    the memory a fleet that ran those weeks holds (``flagged``: ``lemon_k`` or more)."""


@dataclass(frozen=True)
class TraceConfig:
    nodes: int
    """Physical nodes in the cluster (the job's, its spares, and a reserve)."""
    horizon_s: float
    profile: FailureProfile
    seed: int = 1
    lemon_fraction: float = 0.01
    lemon_rate_factor: float = 20.0
    lemon_lookback_days: float = 30.0
    lemon_k: int = 2


def node_name(index: int) -> str:
    return f"n{index:05d}"


def make_trace(config: TraceConfig) -> ClusterTrace:
    """Per-node Poisson failures. The fleet's mean rate is the profile's: ordinary
    nodes run at ``r0`` and lemons at ``lemon_rate_factor * r0``, with
    ``(1 - f) r0 + f F r0 = rate``."""
    rng = random.Random(config.seed)
    nodes = [node_name(i) for i in range(config.nodes)]
    f, factor = config.lemon_fraction, config.lemon_rate_factor
    base = config.profile.per_node_day / ((1 - f) + f * factor)
    lemon_count = round(f * config.nodes)
    lemons = frozenset(rng.sample(nodes, lemon_count)) if lemon_count else frozenset()
    shares = config.profile.classes
    weights = [c.share for c in shares]
    events: list[FailureEvent] = []
    flagged: set[str] = set()
    lookback: dict[str, int] = {}
    for node in nodes:
        per_day = base * (factor if node in lemons else 1.0)
        per_s = per_day / DAY_S
        # the fleet's memory: incidents of this node in the look-back window
        lookback[node] = _poisson(rng, per_day * config.lemon_lookback_days)
        if lookback[node] >= config.lemon_k:
            flagged.add(node)
        t = rng.expovariate(per_s)
        while t < config.horizon_s:
            events.append(FailureEvent(t, node, rng.choices(shares, weights)[0]))
            t += rng.expovariate(per_s)
    events.sort(key=lambda e: e.at_s)
    return ClusterTrace(nodes, lemons, frozenset(flagged), events, lookback)


def _poisson(rng: random.Random, mean: float) -> int:
    count, total = 0, rng.expovariate(1.0)
    while total < mean:
        count += 1
        total += rng.expovariate(1.0)
    return count


# ------------------------------------------------------------------ recovery costs


def fan_out(nodes: int) -> float:
    """How a leg that fans out to ``nodes`` nodes grows against the 3-node measurement:
    with the tree's depth, log2(nodes) / log2(3), and never below the one node's cost."""
    return max(1.0, math.log2(max(1, nodes)) / math.log2(MEASURED_NODES))


@dataclass(frozen=True)
class CostModel:
    """Seconds each leg of a recovery takes at ``nodes`` nodes, scaled from the
    3-node measurement: fan-out legs (stop, launch, preflight, imports from a shared
    filesystem) grow with log2 of the node count, the rendezvous with the rank count
    (:meth:`rendezvous_s`), checkpoint load is the checkpoint cost δ read back, and the
    first step is one step."""

    nodes: int
    step_s: float
    checkpoint_s: float
    poll_interval_s: float = 0.5
    node_timeout_s: float = 15.0
    hang_timeout_s: float = 300.0
    gpus_per_node: int = 8
    rendezvous: str = "published"
    """``published``: the 3-node measurement plus, per rank, the store's and NCCL's
    published costs at 96K ranks. ``linear``: the 3-node measurement times nodes/3,
    the model before (278 s at 2,048 nodes; 16 times the published figures)."""
    warm_start: bool = False
    """The spec's ``warm_start``: ranks fork from each node's zygote (the spare's is
    prewarmed), so the imports leg is a standby's hand-off, not a fresh import."""

    def __post_init__(self) -> None:
        if self.rendezvous not in RENDEZVOUS_MODELS:
            raise ValueError(
                f"rendezvous: {self.rendezvous!r} is not one of {', '.join(RENDEZVOUS_MODELS)}"
            )

    @property
    def fan_out(self) -> float:
        return fan_out(self.nodes)

    def detection_s(self, kind: str) -> float:
        if kind == "node_lost":
            return self.node_timeout_s + MEASURED_PHASES_S["detection_overhead"]
        if kind == "hang":
            return self.hang_timeout_s + self.poll_interval_s
        return self.poll_interval_s + 1.0

    @property
    def stop_s(self) -> float:
        return self.stop_of_s(self.nodes)

    def stop_of_s(self, nodes: int) -> float:
        """A stop that reaches ``nodes`` nodes: a rejoin's replacement stops only the
        failed node, a whole-generation restart every node."""
        return MEASURED_PHASES_S["stop"] * fan_out(nodes)

    @property
    def preflight_s(self) -> float:
        return 1.0 * self.fan_out

    @property
    def search_s(self) -> float:
        return MEASURED_PHASES_S["resume_search"] * self.fan_out

    @property
    def launch_s(self) -> float:
        return MEASURED_PHASES_S["launch"] * self.fan_out

    @property
    def rendezvous_s(self) -> float:
        """Every rank in the store and the NCCL communicator up. The 3-node figure is
        mostly fixed cost (0.41 s for 6 ranks), so scaling all of it with the node
        count, as ``linear`` does, charges every rank that fixed cost again. The
        ``published`` model adds to it, per rank, what the libuv TCPStore and NCCL's
        start-up cost at 98,304 ranks: 3.7 ms a rank, 61 s at 16,384 GPUs."""
        measured = MEASURED_PHASES_S["process_group"]
        if self.rendezvous == "linear":
            return measured * self.nodes / MEASURED_NODES
        ranks = self.nodes * self.gpus_per_node
        return measured + ranks * (TCPSTORE_INIT_S_PER_RANK + NCCL_INIT_S_PER_RANK)

    @property
    def replica_restore_s(self) -> float:
        """A relaunch node getting its slot's snapshot from the buddy's replica, node
        to node: the two ends' start, measured, plus the node's share of the state
        (``gpus_per_node`` x :data:`LLAMA3_STATE_BYTES_PER_GPU`) at the restore rate
        measured at 1 GiB (every such node copies in parallel)."""
        node_gb = LLAMA3_STATE_BYTES_PER_GPU * self.gpus_per_node / 1e9
        return (
            MEMORY_CALIBRATION["replica_restore_start_s"].value
            + node_gb * MEMORY_CALIBRATION["replica_restore_s_per_gb"].value
        )

    @property
    def import_s(self) -> float:
        """One node's imports before the fan-out: cold (measured in the calibration
        file) or from a warm standby (:data:`MEMORY_CALIBRATION`)."""
        if self.warm_start:
            return MEMORY_CALIBRATION["warm_import_s"].value
        return MEASURED_PHASES_S["import"]

    @property
    def startup_s(self) -> float:
        """Launch done to first new step: imports, rendezvous, checkpoint load, a step."""
        return self.startup_of_s(self.nodes)

    def startup_of_s(self, starting_nodes: int) -> float:
        """Launch done to first new step when only ``starting_nodes`` nodes start ranks
        (rejoin in place: the others' ranks keep their process and imports). Only the
        imports shrink. Every rank still joins the new generation's store and NCCL
        communicator, which a replaced rank cannot join otherwise, so the rendezvous is
        the full one; every rank reloads the resume point the controller chose (as
        ``run_resilient`` does), and makes a step."""
        return (
            self.import_s * fan_out(starting_nodes)
            + self.rendezvous_s
            + self.checkpoint_s
            + self.step_s
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "detection_crash_s": self.detection_s("crash"),
            "detection_hang_s": self.detection_s("hang"),
            "detection_node_lost_s": self.detection_s("node_lost"),
            "stop_s": self.stop_s,
            "preflight_s": self.preflight_s,
            "launch_s": self.launch_s,
            "rendezvous_s": self.rendezvous_s,
            "startup_s": self.startup_s,
            "startup_rejoin_one_node_s": self.startup_of_s(1),
            "stop_one_node_s": self.stop_of_s(1),
            "replica_restore_s": self.replica_restore_s,
        }


# --------------------------------------------------------------- training progress


@dataclass(frozen=True)
class Progress:
    step: int
    checkpoint_step: int | None
    """Newest committed checkpoint at that moment (None: none written yet)."""
    checkpointing_s: float
    """Time spent blocked in checkpoints so far in the generation."""


def progress_at(
    start_step: int, elapsed_s: float, every: int, step_s: float, checkpoint_s: float
) -> Progress:
    """Steps made ``elapsed_s`` after a generation's first step at ``start_step``: each
    step takes ``step_s``; after every step that is a multiple of ``every`` the ranks
    block ``checkpoint_s`` and then the checkpoint is committed."""
    if elapsed_s <= 0:
        return Progress(start_step, None, 0.0)
    if every <= 0:
        return Progress(start_step + int(elapsed_s / step_s), None, 0.0)
    to_first = every - start_step % every
    first_cycle = to_first * step_s + checkpoint_s
    if elapsed_s < first_cycle:
        steps = min(to_first, int(elapsed_s / step_s))
        blocked = max(0.0, elapsed_s - to_first * step_s)
        return Progress(start_step + steps, None, blocked)
    rest = elapsed_s - first_cycle
    cycle = every * step_s + checkpoint_s
    cycles = int(rest / cycle)
    into = rest - cycles * cycle
    base = start_step + to_first + cycles * every
    steps = min(every, int(into / step_s))
    blocked = (cycles + 1) * checkpoint_s + max(0.0, into - every * step_s)
    return Progress(base + steps, base, blocked)


@dataclass
class Ledger:
    """Ground truth kept by the simulated cluster, per phase in simulated seconds."""

    phases: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, seconds: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds


# ------------------------------------------------------------------ the memory tier


@dataclass(frozen=True)
class MeasuredFigure:
    """One measured figure the memory-tier model uses, where it was measured, and what
    it sets (the counterpart of :class:`Calibrated` for figures of other files)."""

    value: float
    source: str
    feeds: str


MEMORY_CALIBRATION: dict[str, MeasuredFigure] = {
    "snapshot_s_per_gb": MeasuredFigure(
        SNAPSHOT_S_PER_GB,
        f"{SNAPSHOT_COST_FILE}: the blocking part of lazarus.rank.torch.snapshot (the copy "
        "into the previous snapshot's CPU buffers) on 256 MB to 1 GB of float32 tensors, "
        "one core of this machine, the median of 5 per size; the largest size's figure "
        "(python -m bench snapshot-cost, at commit 35cdd3d)",
        "memory_snapshot_s: this x each GPU's share of the state (LLAMA3_STATE_BYTES_PER_GPU, "
        "0.35 GB; every rank copies its own shard at once)",
    ),
    "replica_push_s_per_gb": MeasuredFigure(
        REPLICA_PUSH_S_PER_GB,
        f"{REPLICA_PUSH_COST_FILE}: the extra time of a fixed step (a matmul and a pass "
        "over 64 MB, one thread on core 0) while lazarus.rank.replica.push sends a "
        "committed snapshot to a receiver process (push and receiver on core 1), per GB; "
        "1 GiB, the median of 5 pushes (python -m bench replica-push-cost, at commit "
        "35cdd3d). It replaces 2.5% of a step measured on a few-KB state (python -m bench "
        "replica-cost, also retired after 35cdd3d)",
        "memory_snapshot_s: this x a node's share of the state (8 x "
        "LLAMA3_STATE_BYTES_PER_GPU, 2.8 GB; the node's pusher sends it, and every rank "
        "waits for the slowest) with memory_replicas",
    ),
    "replica_restore_s_per_gb": MeasuredFigure(
        REPLICA_RESTORE_S_PER_GB,
        f"{STATE_SCALE_FILE}: the replica's copy from the buddy onto the spare at 1 GiB "
        "a rank (python -m bench state-scale; node to node, the spare hashing every byte)",
        "replica_restore_s: this x a node's share of the state (8 x "
        "LLAMA3_STATE_BYTES_PER_GPU, 2.8 GB)",
    ),
    "replica_restore_start_s": MeasuredFigure(
        REPLICA_RESTORE_START_S,
        f"{STATE_SCALE_FILE}: the same restore's whole time less its copy (the two ends "
        "started on their nodes over ssh, the handshake)",
        "replica_restore_s: added once per restore",
    ),
    "warm_import_s": MeasuredFigure(
        0.06,
        "docs/results/2026-12-warm-starts-and-memory-tier.md: start to the first line "
        "after import torch from a standby, 0.02-0.06 s (cold 1.2-3.0 s)",
        "startup_s's imports with warm_start (replaces the cold 1.862 s), x fan_out",
    ),
}
"""The measured figures behind the memory tier, replicas and warm starts in the
simulator; each simulation's JSON copies them under ``calibration.memory``. The
snapshot's cost is measured per GB at sizes near a GPU's share of the state and scaled
by that share. The replica push's is measured per GB at 1 GiB beside a CPU step on
another core and scaled by a node's share; what it does beside a GPU's step (PCIe, a
NIC shared with NCCL) nobody measured here."""


def memory_snapshot_s(
    replicas: bool,
    state_bytes_per_gpu: float = LLAMA3_STATE_BYTES_PER_GPU,
    gpus_per_node: int = LLAMA3_GPUS_PER_NODE,
) -> float:
    """Seconds the ranks are held back per memory snapshot: the measured copy of each
    rank's share of the state (the ranks copy at once, so one share's time), plus,
    with ``memory_replicas``, the measured cost of pushing the node's share to its
    buddy (one pusher per node; the collectives make every rank wait for its node)."""
    seconds = MEMORY_CALIBRATION["snapshot_s_per_gb"].value * state_bytes_per_gpu / 1e9
    if replicas:
        node_gb = state_bytes_per_gpu * gpus_per_node / 1e9
        seconds += MEMORY_CALIBRATION["replica_push_s_per_gb"].value * node_gb
    return seconds


def memory_interval_steps(snapshot_s: float, mtbf_s: float, step_s: float) -> int:
    """The memory interval in steps by Young-Daly with the snapshot's own cost: the
    same trade as the disk interval (cost per snapshot against work lost per failure),
    at a δ a few hundred times smaller."""
    return max(1, round(daly_interval_s(snapshot_s, mtbf_s) / step_s))


def effective_step_s(step_s: float, memory_every: int, snapshot_s: float) -> float:
    """A step's wall time with the memory tier on: the snapshot's cost spread over
    its interval (the ranks block for it; 0 snapshot cost: the plain step)."""
    if memory_every <= 0:
        return step_s
    return step_s + snapshot_s / memory_every


def newest_snapshot(frozen_step: int, resume_step: int, memory_every: int) -> int:
    """The newest step every node holds in its memory tier when the ranks stopped at
    ``frozen_step``: the last multiple of the interval, or the step the generation
    resumed from (its ranks loaded it, and the tier keeps it)."""
    return max(resume_step, frozen_step - frozen_step % memory_every)


def buddy_of(order: list[str], slot: int) -> str:
    """The node holding ``slot``'s replica: the next one in slot order, a ring
    (``checkpoints.memory_replicas``)."""
    return order[(slot + 1) % len(order)]


def snapshot_reachable(before: list[str], after: list[str], replicas: bool) -> tuple[bool, int]:
    """Whether the relaunch on ``after`` (rank order) can resume from the memory tier
    of the generation that ran on ``before``, and how many nodes must copy their
    snapshot from a buddy. A node that kept its slot holds its own snapshot. A new node
    in a slot (a spare for a lost or broken node) needs the replica on the slot's buddy,
    which must itself be in the relaunch: a buddy lost too (replaced, or gone with a
    shrink) leaves that slot's snapshot nowhere, and disk serves, as in the product."""
    if len(before) != len(after):
        return False, 0
    kept = set(after)
    copies = 0
    for slot, node in enumerate(after):
        if node == before[slot]:
            continue
        if not replicas or buddy_of(before, slot) not in kept:
            return False, 0
        copies += 1
    return True, copies
