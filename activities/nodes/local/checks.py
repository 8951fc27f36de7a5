"""Preflight checks run on this machine: the same checks the ssh shim runs remotely."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from activities.nodes.agent import GpuHealth, PreflightRequest, PreflightResult
from activities.nodes.secret_env import without_worker_secrets


def _free_gb(path: Path) -> float:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free / 1e9


def run_local_preflight(node: str, request: PreflightRequest) -> PreflightResult:
    started = time.monotonic()
    problems: list[str] = []
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    interpreter = request.interpreter
    found = (
        os.access(Path(request.workdir) / interpreter, os.X_OK)
        if os.sep in interpreter
        else shutil.which(interpreter, path=search) is not None
    )
    if not found:
        problems.append(
            f"command: {interpreter!r} not found on node {node}; install it or fix PATH"
        )
    if not Path(request.workdir).is_dir():
        problems.append(f"workdir: {request.workdir} does not exist on node {node}")
    free = _free_gb(Path(request.disk_path))
    if free < request.min_free_disk_gb:
        problems.append(
            f"disk: {free:.1f} GB free under {request.disk_path}, "
            f"preflight.min_free_disk_gb is {request.min_free_disk_gb}"
        )
    gpus: GpuHealth | None = None
    if request.health_command:
        try:
            done = subprocess.run(
                request.health_command,
                capture_output=True,
                text=True,
                timeout=request.timeout_s,
                cwd=request.workdir,
                # The ranks' rule: the worker's own credentials stay with the worker.
                env={**without_worker_secrets(os.environ), "LAZARUS_NODE": node},
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            problems.append(f"health_command: failed to run on node {node}: {exc}")
        else:
            if done.returncode != 0:
                tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
                problems.append(
                    f"health_command: exited {done.returncode} on node {node}: {tail[0]}"
                )
            gpus = _parse_gpus(done.stdout)
            if gpus is not None and (gpus.ecc_errors or gpus.xid_errors):
                problems.append(
                    f"gpu: node {node} reports {gpus.ecc_errors} uncorrected ECC "
                    f"and {gpus.xid_errors} Xid errors"
                )
    return PreflightResult(
        node=node,
        ok=not problems,
        problems=problems,
        free_disk_gb=free,
        gpus=gpus,
        round_trip_s=time.monotonic() - started,
        program_missing=not found,
    )


def _parse_gpus(output: str) -> GpuHealth | None:
    try:
        from activities.nodes.gpu_health import parse_nvidia_smi
    except ImportError:
        return None
    return parse_nvidia_smi(output)
