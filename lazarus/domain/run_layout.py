"""The names inside a job's run directory, as data: ``<run_dir>/<job_id>/<run_key>/
gen-NNNNN/`` and the files of a generation (the full picture is in
:mod:`activities.nodes.rundir`, which reads, writes and locks them).

Pure paths, no I/O (issue 40, part 2): the worker's launcher and supervisor use them to
write a run, and a client (``lazarus logs`` on a local job) uses the same functions to
find a rank's log, so neither needs the other's code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from lazarus.domain.environment import GENERATION_FAILED_FILE

GEN_DIR_PATTERN = re.compile(r"^gen-(\d{5,})$")
"""A generation folder's name, ``gen-00003``."""


class SrunFiles(NamedTuple):
    """A Slurm generation's detached ``srun`` client for one node (one step per node
    and generation), in its generation directory: its pid record, its output and its
    exit record (written by ``slurm_task srun``). Named here with the rest of the
    layout, so that a reader of a run directory (the Slurm bench) needs not import
    the Slurm transport."""

    pid: str
    log: str
    exit: str

    @classmethod
    def of(cls, node: str) -> SrunFiles:
        stem = f"slurm-srun-{node}"
        return cls(f"{stem}.pid", f"{stem}.log", f"{stem}.exit.json")


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
        match = GEN_DIR_PATTERN.match(self.path.name)
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
    def failed_file(self) -> Path:
        return self.path / GENERATION_FAILED_FILE

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
