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
