"""Layout of a job's run directory: the durable record that lets any worker re-attach.

Nothing about running ranks lives in worker memory. Each generation owns a folder::

    <run_dir>/<job_id>/gen-00003/
        plan.json              master port, chosen once so a retried launch reuses it
        launch.json            written when every rank has started: the launch is done
        rank-0.pid             wrapper pid, process group, rank pid, start ticks
        rank-0.log             the rank's stdout and stderr
        rank-0.heartbeat.json  written by ``lazarus.rank.heartbeat``
        rank-0.exit.json       written by the wrapper when the rank ends, controller or not
        control.json           checkpoint requests read by ``lazarus.rank.should_checkpoint``
        stopped.json           written by ``stop``: this generation was ended on purpose
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_GEN_DIR = re.compile(r"^gen-(\d{5,})$")


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Readers poll these files while they are written; a rename is never seen half-done."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    """None when the file is absent or (rarely, from a foreign writer) not yet valid."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def job_root(run_dir: str | Path, job_id: str) -> Path:
    return Path(run_dir) / job_id


@dataclass(frozen=True)
class GenerationDir:
    path: Path

    @classmethod
    def of(cls, job_run_root: str | Path, generation: int) -> GenerationDir:
        return cls(Path(job_run_root) / f"gen-{generation:05d}")

    @property
    def generation(self) -> int:
        match = _GEN_DIR.match(self.path.name)
        if match is None:
            raise ValueError(f"{self.path} is not a generation directory")
        return int(match.group(1))

    @property
    def plan_file(self) -> Path:
        return self.path / "plan.json"

    @property
    def launch_file(self) -> Path:
        return self.path / "launch.json"

    @property
    def control_file(self) -> Path:
        return self.path / "control.json"

    @property
    def stopped_file(self) -> Path:
        return self.path / "stopped.json"

    @property
    def lock_file(self) -> Path:
        return self.path / ".launch.lock"

    def pid_file(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.pid"

    def log_file(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.log"

    def heartbeat_file(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.heartbeat.json"

    def exit_file(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.exit.json"


def generations(job_run_root: str | Path) -> list[GenerationDir]:
    """Every generation folder of a job, oldest first."""
    root = Path(job_run_root)
    if not root.is_dir():
        return []
    found = [GenerationDir(p) for p in root.iterdir() if p.is_dir() and _GEN_DIR.match(p.name)]
    return sorted(found, key=lambda g: g.generation)
