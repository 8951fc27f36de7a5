"""The environment contract between the launcher and a training rank.

Both sides import these names: the launcher (in ``activities/``) sets them and
:mod:`lazarus.rank` reads them. Keeping them in one standard-library module means
a renamed variable cannot silently break one side. The torchrun-compatible names
are set too, so scripts written for torchrun run unchanged.
"""

from __future__ import annotations

# Set exactly as torchrun sets them.
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
GROUP_RANK = "GROUP_RANK"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"

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

# Rejoin in place (issue 16): healthy ranks keep their process across a generation.
REJOIN_TIMEOUT_S = "LAZARUS_REJOIN_TIMEOUT_S"
"""Set only for jobs with ``rejoin.enabled``: how long a rank that tore its process group
down waits for the controller's rejoin request before it gives up and exits."""
CONTROL_REJOIN = "rejoin"
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
