"""A fault-free run of the example without Lazarus: the weights every recovery must match."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_fault_free(workdir: Path, steps: int, world_size: int = 2) -> Path:
    out = workdir / "model.pt"
    port = _free_port()
    procs = []
    for rank in range(world_size):
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAZARUS_")}
        env.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "PYTHONPATH": str(REPO),
            }
        )
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(REPO / "examples" / "train_ddp.py"),
                    "--steps",
                    str(steps),
                    "--step-time",
                    "0",
                    "--ckpt-every",
                    "10",
                    "--out",
                    str(out),
                    "--checkpoint-dir",
                    str(workdir / "checkpoints"),
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        )
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"reference run failed: {err.decode()[-2000:]}")
    return out
