"""Launching real multi-rank torch jobs without Lazarus, for integration tests.

The launcher here plays torchrun's part (one process per rank, the rendezvous
variables set by hand) so tests can check the training side of the contract,
checkpoint and resume, independently of the controller.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from lazarus.domain.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
TRAIN_DDP = REPO_ROOT / "examples" / "train_ddp.py"


@dataclass(frozen=True)
class RankRun:
    rank: int
    returncode: int
    output: str
    """stdout and stderr together, as a rank's log file would hold them."""

    def lines(self, prefix: str) -> list[str]:
        return [line for line in self.output.splitlines() if line.startswith(prefix)]


LaunchDDP = Callable[..., list[RankRun]]


def launch_ranks(
    script_args: Sequence[str],
    log_dir: Path,
    *,
    world_size: int = 2,
    extra_env: Mapping[str, str] | None = None,
    per_rank_env: Callable[[int], Mapping[str, str]] | None = None,
    timeout_s: float = 90.0,
) -> list[RankRun]:
    """Run ``examples/train_ddp.py`` as ``world_size`` ranks and wait for all.

    Output goes to files rather than pipes so a chatty rank can never block on a
    full pipe while its peers wait for it in a collective. On timeout every rank
    is killed and the test fails with the logs."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base_env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("LAZARUS_", "TORCHELASTIC_"))
    }
    base_env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        PYTHONWARNINGS="ignore",
        OMP_NUM_THREADS="1",
    )
    base_env.update(extra_env or {})
    processes: list[tuple[int, subprocess.Popen[bytes], Path]] = []
    try:
        for rank in range(world_size):
            env = {**base_env, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            env.update(per_rank_env(rank) if per_rank_env else {})
            log_path = log_dir / f"rank-{rank}.log"
            with open(log_path, "wb") as log:
                process = subprocess.Popen(
                    [sys.executable, str(TRAIN_DDP), *script_args],
                    cwd=REPO_ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            processes.append((rank, process, log_path))
        for _, process, _ in processes:
            process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        logs = "\n".join(f"--- rank {r}\n{path.read_text()[-3000:]}" for r, _, path in processes)
        pytest.fail(f"ranks did not finish within {timeout_s} s\n{logs}")
    finally:
        for _, process, _ in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return [
        RankRun(rank=rank, returncode=process.returncode, output=path.read_text())
        for rank, process, path in processes
    ]


@pytest.fixture
def launch_ddp() -> LaunchDDP:
    """:func:`launch_ranks`, as a fixture so test modules need no import path."""
    return launch_ranks
