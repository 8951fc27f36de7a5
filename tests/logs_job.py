"""A standard-library job for the ``lazarus logs`` tests (issue 39): every rank prints
a few lines naming its generation; in generation 1, rank 0 crashes (exit 3) after its
lines, the others wait to be stopped; in later generations every rank ends at once,
successfully. What ``lazarus logs --previous`` must then show is generation 1's lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from lazarus.app.local_stack import LocalStack

SCRIPT = """\
import os, sys, time
gen, rank = os.environ["LAZARUS_GENERATION"], os.environ["RANK"]
for i in range(3):
    print(f"gen {gen} rank {rank} line {i}", flush=True)
if gen == "1" and rank == "0":
    print(f"gen {gen} rank {rank} crashing now", flush=True)
    sys.exit(3)
if gen == "1":
    time.sleep(120)
"""


def logs_job(tmp_path: Path, name: str, python: str, **overrides: Any) -> dict[str, Any]:
    """The spec (as data) of the job: ``python`` runs the script, written under
    ``tmp_path``; no heartbeats, so only a crash is detected (no hang clock to trip
    on a loaded machine)."""
    script = tmp_path / "logs_job.py"
    script.write_text(SCRIPT)
    data: dict[str, Any] = {
        "name": name,
        "command": [python, str(script)],
        "workdir": str(tmp_path),
        "nproc_per_node": 2,
        "checkpoint_dir": str(tmp_path / "checkpoints"),
        "run_dir": str(tmp_path / "runs"),
        "health": {"startup_timeout_s": 60, "poll_interval_s": 0.2},
        "recovery": {
            "max_restarts": 3,
            "backoff_initial_s": 0.2,
            "backoff_max_s": 1,
            "stop_grace_s": 2,
        },
    }
    data.update(overrides)
    return data


SHELL_NOTICES = ("Terminated", "Killed")
"""What a node's shell writes into a rank's log when the stop signals the rank it
runs (timing decides whether it does: the rank may have ended first)."""


def job_lines(stdout: str) -> list[str]:
    """``lazarus logs``' lines less the shell's notices (:data:`SHELL_NOTICES`)."""
    return [line for line in stdout.splitlines() if line.partition("] ")[2] not in SHELL_NOTICES]


def expected(generation: int, ranks: int) -> list[str]:
    """The lines each rank of ``generation`` prints, rank by rank (``[rank N]`` prefixed)."""
    lines = []
    for rank in range(ranks):
        lines += [f"[rank {rank}] gen {generation} rank {rank} line {i}" for i in range(3)]
        if generation == 1 and rank == 0:
            lines.append(f"[rank {rank}] gen 1 rank 0 crashing now")
    return lines


def lazarus(stack: LocalStack, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI, run as an operator would, against ``stack``'s server."""
    return subprocess.run(
        [sys.executable, "-m", "lazarus.app.cli", *args],
        env=stack.worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
