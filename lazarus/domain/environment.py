"""The environment contract between the launcher and a training rank.

Both sides import these names: the launcher (in ``activities/``) sets them and
:mod:`lazarus.rank` reads them. Keeping them in one standard-library module means
a renamed variable cannot silently break one side. The torchrun-compatible names
are set too, so scripts written for torchrun run unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

# Set as torchrun's agent sets them (torch/distributed/elastic/agent/server/
# local_elastic_agent.py, ``_start_workers``, and torch/distributed/run.py), with the
# meaning they have there for a launch of one role (torchrun's only kind). Built in one
# place, :func:`torchrun_environment`; tests/integration/test_torchrun_parity.py runs a
# probe under real torchrun and under the launcher and compares.
RANK = "RANK"
"""The global rank: ``node_index * nproc_per_node + local_rank``."""
LOCAL_RANK = "LOCAL_RANK"
"""The rank on its node, 0 to ``nproc_per_node - 1``."""
WORLD_SIZE = "WORLD_SIZE"
"""Ranks in the generation: nodes times ``nproc_per_node``."""
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
"""``nproc_per_node``."""
GROUP_RANK = "GROUP_RANK"
"""The node's index in the generation (torchrun: the agent's rank in the rendezvous)."""
GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"
"""Nodes in the generation (torchrun: agents in the rendezvous); it falls when a job
shrinks (``min_nodes``)."""
ROLE_NAME = "ROLE_NAME"
"""Always ``"default"``: torchrun's role, and Lazarus launches one role."""
ROLE_RANK = "ROLE_RANK"
"""The rank among the ranks of its role: with one role, equal to ``RANK``."""
ROLE_WORLD_SIZE = "ROLE_WORLD_SIZE"
"""Ranks of the role: with one role, equal to ``WORLD_SIZE``."""
MASTER_ADDR = "MASTER_ADDR"
"""The first node's host: rank 0 hosts the TCPStore there."""
MASTER_PORT = "MASTER_PORT"
"""A fresh port per generation (torchrun: the rendezvous picks one per round)."""
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
"""``generation - 1``: restarts of the worker group so far (torchrun counts its own
restarts the same way, from 0)."""
MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
"""``recovery.max_restarts`` (torchrun: ``--max-restarts``). Lazarus's budget is per
``recovery.restart_window_s``, not per life of the job, so a rank must not infer from
``RESTART_COUNT == MAX_RESTARTS`` that this is its last life."""
RUN_ID = "TORCHELASTIC_RUN_ID"
"""The job id (torchrun: ``--rdzv-id``, or a fresh uuid with ``--standalone``). PyTorch
Lightning's ``TorchElasticEnvironment`` recognises a torchrun launch by it."""
USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
"""Always ``"False"``: Lazarus runs no agent store, so ``init_process_group("env://")``
must start the TCPStore in rank 0 (``torch.distributed.rendezvous``: ``"True"`` makes
every rank a client of a store the agent hosts, which would never answer). torchrun
sets ``"True"`` with its c10d and static rendezvous (the agent shares its store) and
``"False"`` with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` or a rendezvous that shares
none (etcd): the value here is torchrun's own for the same arrangement."""
NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
"""``"1"`` unless the job's environment sets it (torchrun: the agent's value, or 1): a
NCCL collective that fails or times out aborts the communicator rather than hanging."""
OMP_NUM_THREADS = "OMP_NUM_THREADS"
"""``"1"`` when ``nproc_per_node > 1`` and the job's environment does not set it
(torchrun does the same, so N ranks per node do not each spawn a thread per core)."""
ROLE = "default"
"""The one role's name (``ROLE_NAME``), torchrun's default ``--role``."""

# Lazarus's own.
JOB_ID = "LAZARUS_JOB_ID"
GENERATION = "LAZARUS_GENERATION"
HEARTBEAT_FILE = "LAZARUS_HEARTBEAT_FILE"
CHECKPOINT_DIR = "LAZARUS_CHECKPOINT_DIR"
RESUME_FROM = "LAZARUS_RESUME_FROM"
RESUME_STEP = "LAZARUS_RESUME_STEP"
CONTROL_FILE = "LAZARUS_CONTROL_FILE"
RUN_DIR = "LAZARUS_RUN_DIR"
HEARTBEAT_INTERVAL = "LAZARUS_HEARTBEAT_INTERVAL_S"
NODE = "LAZARUS_NODE"

# The memory checkpoint tier and the checkpoint intervals (issue 12).
MEMORY_CHECKPOINT_DIR = "LAZARUS_MEMORY_CHECKPOINT_DIR"
"""A per-node tmpfs directory (e.g. /dev/shm/lazarus/<job>/<run>): set, and each node's
local rank 0 writes memory snapshots there. The same path on every node."""
MEMORY_KEEP = "LAZARUS_MEMORY_KEEP"
"""How many committed memory snapshots a node keeps (default 2, at least 1)."""
MEMORY_EVERY_STEPS = "LAZARUS_MEMORY_EVERY_STEPS"
"""Memory snapshot cadence in steps (default 1 when the memory directory is set; 0: off)."""
CHECKPOINT_EVERY_STEPS = "LAZARUS_CHECKPOINT_EVERY_STEPS"
"""Disk checkpoint cadence in steps (unset: the script's own; 0: only on request)."""
MEMORY_REPLICA_LISTEN = "LAZARUS_MEMORY_REPLICA_LISTEN"
"""``host:port`` this node's local rank 0 receives its ring predecessor's memory
snapshots on (``checkpoints.memory_replicas``; the host is the node's own address)."""
MEMORY_REPLICA_TO = "LAZARUS_MEMORY_REPLICA_TO"
"""``host:port`` of the buddy (the next node in slot order) this node's committed
snapshots are pushed to."""
MEMORY_REPLICA_FROM = "LAZARUS_MEMORY_REPLICA_FROM"
"""The host of the node whose snapshots this node receives: the only peer accepted."""
MEMORY_REPLICA_SECRET = "LAZARUS_MEMORY_REPLICA_SECRET"
"""The run's replica secret (hex), in the ranks' environment only: never argv, a file,
the control document or the workflow's history. Each generation's key and ports are
derived from it (:func:`lazarus.domain.memory_tier.generation_key`); a survivor that
rejoins derives the new generation's from the same secret."""

# Keys of the JSON document in CONTROL_FILE besides "checkpoint_request" and "then":
# interval overrides that take effect without a restart. A writer of the control file
# must carry them over when it writes a new request, or the ranks fall back to the
# environment's intervals.
CONTROL_CHECKPOINT_EVERY_STEPS = "checkpoint_every_steps"
CONTROL_MEMORY_EVERY_STEPS = "memory_every_steps"

# A key of the rank's heartbeat document (besides "step", "time", "metrics", phases and
# "compute_s"): the blocking seconds of the rank's recent disk checkpoints, which
# ``checkpoints.interval: auto`` tunes the interval with (issue 14).
HEARTBEAT_CHECKPOINT_SAVE_S = "checkpoint_save_s"
HEARTBEAT_GAP_S = "gap_s"
"""Heartbeat key: seconds (the rank's monotonic clock: a duration, never compared with
the controller's clock) since the rank's previous heartbeat write. On the controller's
own machine the supervisor learns the hang budget from these, the silences a healthy
rank really keeps, rather than from the gaps between the heartbeats its polls happen
to see (issue 38)."""

# Rejoin in place (issue 16): healthy ranks keep their process across a generation.
REJOIN_TIMEOUT_S = "LAZARUS_REJOIN_TIMEOUT_S"
"""Set only for jobs with ``rejoin.enabled``: how long a rank that tore its process group
down waits for the controller's rejoin request before it gives up and exits."""
CONTROL_REJOIN = "rejoin"
GENERATION_FAILED_FILE = "failed.json"
"""In a generation's folder, beside its control file: the supervisor's notice that one
of its ranks has ended (``{"rank", "kind"}``), which tells a survivor armed for rejoin
to leave its step and tear down at once, before its rejoin request is written
(:mod:`lazarus.rank.step_interrupt`)."""
"""Key of the control document that moves surviving ranks into the next generation:
``{"generation": N, "env": {"<current RANK>": {VARIABLE: value or null (unset)}}}``.
Written by the launcher into the failed generation's control file; a rank that sees a
generation newer than its own applies its entry to ``os.environ`` and rejoins."""
HEARTBEAT_GENERATION = "generation"
"""Heartbeat key: the generation the rank acts for now (it changes when it rejoins)."""
HEARTBEAT_REJOIN = "rejoin"
"""Heartbeat key, present only around a rejoin: ``"waiting"`` (in the old generation's
file, for the request) or ``"joining"`` (in the new one's, once read: the rank acts for
it, but has not stepped in it yet, so this is not progress for the hang clock)."""
REJOIN_VARIABLES = (
    RANK,
    LOCAL_RANK,
    GROUP_RANK,
    WORLD_SIZE,
    LOCAL_WORLD_SIZE,
    ROLE_RANK,
    ROLE_WORLD_SIZE,
    GROUP_WORLD_SIZE,
    MASTER_ADDR,
    MASTER_PORT,
    RESTART_COUNT,
    GENERATION,
    HEARTBEAT_FILE,
    CONTROL_FILE,
    RUN_DIR,
    RESUME_FROM,
    RESUME_STEP,
    MEMORY_CHECKPOINT_DIR,
    MEMORY_KEEP,
    MEMORY_EVERY_STEPS,
    CHECKPOINT_EVERY_STEPS,
    MEMORY_REPLICA_LISTEN,
    MEMORY_REPLICA_TO,
    MEMORY_REPLICA_FROM,
)
"""The variables a rejoin request sets (or unsets, as null) in a surviving rank: those
the launcher derives per generation. Everything else in its environment stays."""


def rank_identity(rank: int, nproc_per_node: int, node_index: int) -> dict[str, str]:
    """The variables that differ between the ranks of one generation: what the Slurm
    task sets on its node, each rank's own (``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``,
    ``ROLE_RANK``)."""
    return {
        RANK: str(rank),
        LOCAL_RANK: str(rank % nproc_per_node),
        GROUP_RANK: str(node_index),
        ROLE_RANK: str(rank),
    }


def torchrun_environment(
    *,
    rank: int,
    nproc_per_node: int,
    node_index: int,
    nodes: int,
    master_addr: str,
    master_port: int,
    generation: int,
    max_restarts: int,
    job_id: str,
    job_env: Mapping[str, str],
) -> dict[str, str]:
    """Every variable torchrun's agent sets for a worker, with torchrun's meaning for
    one role (see each name's docstring). ``job_env`` is the rank's environment below
    Lazarus's own (the worker's on local nodes, ``env``, ``pass_env``...): the two
    torchrun sets only when the user did not (``TORCH_NCCL_ASYNC_ERROR_HANDLING``,
    ``OMP_NUM_THREADS``) keep its value. Left out, as torchrun-internal:
    ``TORCHELASTIC_ERROR_FILE`` (where ``@record`` writes a failure for the agent to
    read; Lazarus reads the rank's log and exit file instead)."""
    world_size = nodes * nproc_per_node
    env = rank_identity(rank, nproc_per_node, node_index)
    env.update(
        {
            WORLD_SIZE: str(world_size),
            LOCAL_WORLD_SIZE: str(nproc_per_node),
            GROUP_WORLD_SIZE: str(nodes),
            ROLE_NAME: ROLE,
            ROLE_WORLD_SIZE: str(world_size),
            MASTER_ADDR: master_addr,
            MASTER_PORT: str(master_port),
            RESTART_COUNT: str(generation - 1),
            MAX_RESTARTS: str(max_restarts),
            RUN_ID: job_id,
            USE_AGENT_STORE: str(False),
            NCCL_ASYNC_ERROR_HANDLING: job_env.get(NCCL_ASYNC_ERROR_HANDLING, "1"),
        }
    )
    if OMP_NUM_THREADS in job_env:
        env[OMP_NUM_THREADS] = job_env[OMP_NUM_THREADS]
    elif nproc_per_node > 1:
        env[OMP_NUM_THREADS] = "1"
    return env


TEMPORAL_API_KEY = "TEMPORAL_API_KEY"
"""The Temporal Cloud API key's variable: read by the client, and removed from every
rank's environment by the launcher. Named here, not beside the API names, so the node
side (which strips it) never imports temporalio."""
