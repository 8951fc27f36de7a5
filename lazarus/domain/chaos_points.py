"""Named pause points inside the product, so a chaos test reaches a phase exactly.

A fault injected "during a checkpoint write" or "between the pid files and
``launch.json``" cannot be timed with a sleep: the window is milliseconds wide and
moves with the machine's load. Instead the product calls :func:`chaos_point` at
each such place. Normally that costs one environment lookup and does nothing.
When ``LAZARUS_CHAOS_DIR`` is set (only by the chaos matrix, see
:mod:`tests.chaos.matrix`), the call touches ``<dir>/<name>.reached`` and waits until
``<dir>/<name>.go`` exists, so the test can inject its fault while the process is
held exactly there, then let it go on. The wait is bounded
(:data:`MAX_WAIT_S`): a forgotten release slows a run down, it never wedges it.

Standard library only: :mod:`lazarus.rank` calls it inside training ranks.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

CHAOS_DIR_ENV = "LAZARUS_CHAOS_DIR"
MAX_WAIT_S = 120.0
POLL_S = 0.02

# The points the product calls, by name (the matrix arms them by these names).
LAUNCH_BEFORE_PIDS = "launch.before_pids"
"""activities/launcher.py launch_generation: the plan is written, no rank started yet."""
LAUNCH_BEFORE_LAUNCH_JSON = "launch.before_launch_json"
"""activities/launcher.py launch_generation: every rank started (pid files written),
``launch.json`` not yet written."""
STOP_AFTER_SIGTERM = "stop.after_sigterm"
"""activities/nodes/local/agent.py LocalAgent.stop: SIGTERM sent, nothing reaped yet."""
CHECKPOINT_BEFORE_COMMIT = "checkpoint.before_commit"
"""lazarus/rank commit_checkpoint: the manifest is written, ``COMMITTED`` is not."""
REPLICA_BEFORE_COMMIT = "replica.before_commit"
"""lazarus/rank/replica.py Receiver: every file of a buddy's replica received, not yet
checked against its manifest, ``COMMITTED`` not written."""

ALL_POINTS = (
    LAUNCH_BEFORE_PIDS,
    LAUNCH_BEFORE_LAUNCH_JSON,
    STOP_AFTER_SIGTERM,
    CHECKPOINT_BEFORE_COMMIT,
    REPLICA_BEFORE_COMMIT,
)


def reached_file(directory: Path, name: str) -> Path:
    return directory / f"{name}.reached"


def go_file(directory: Path, name: str) -> Path:
    return directory / f"{name}.go"


def chaos_point(name: str, when: bool = True) -> None:
    """Hold here while a chaos test injects its fault (a no-op unless armed, see the
    module docstring). ``when`` False skips it (e.g. a stop with nothing to signal),
    keeping each call site one line. Never raises: a chaos hook must not become a
    failure of its own."""
    directory = os.environ.get(CHAOS_DIR_ENV)
    if not directory or not when:
        return
    root = Path(directory)
    go = go_file(root, name)
    try:
        if go.exists():
            return
        reached_file(root, name).write_text(f"{os.getpid()} {time.time()}\n")
    except OSError:
        return
    deadline = time.monotonic() + MAX_WAIT_S
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(POLL_S)
