"""The GPU check: a killed and a hung rank over NCCL, under Lazarus, on one machine.

Run on a machine with at least two GPUs, from the repository root::

    python -m infra.gpu.nccl_faults --out "$OUT"

It starts a dev server and a worker (:class:`lazarus.app.local_stack.LocalStack`),
starts ``infra/gpu/nccl_job.yaml`` (2 ranks, NCCL, rejoin, memory tier), SIGKILLs
rank 1 at step 40 (expect ``restart_path: rejoin``: the survivor aborts its
communicators rather than waiting on the dead peer) and SIGSTOPs rank 1 of the next
generation at step 120 (a hang: NCCL's watchdog or the hang clock; expect a whole
generation restart). It writes ``nccl-faults.json`` (the final status and its
incidents: detection and recovery seconds, steps lost, restart path) under ``--out``
and exits 0 when the job succeeded with two incidents. Nothing here runs on the CPU
machines of the suite: it is the prepared script for a lent GPU machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import sys
import time
from pathlib import Path

from lazarus.app import chaos
from lazarus.app.client import JobClient
from lazarus.app.local_stack import LocalStack
from lazarus.domain.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "infra" / "gpu" / "nccl_job.yaml"
FAULTS = [(40, 1, signal.SIGKILL, "crash"), (120, 1, signal.SIGSTOP, "hang")]
DEADLINE_S = 900


async def run(stack: LocalStack) -> dict[str, object]:
    spec = load_spec(SPEC)
    for leftover in (Path(spec.checkpoint_dir), Path(spec.run_dir) / spec.name):
        shutil.rmtree(leftover, ignore_errors=True)
    jobs = await JobClient.connect(stack.settings)
    handle = await jobs.start(spec)
    run_root = Path(spec.run_dir) / spec.name
    plan = list(FAULTS)
    injected: list[dict[str, object]] = []
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        view = await jobs.status(handle)
        generation, step = chaos.current_step(run_root)
        if plan and step is not None and step >= plan[0][0] and generation == len(injected) + 1:
            _, rank, sig, label = plan.pop(0)
            fault = chaos.signal_rank(run_root, rank, sig)
            injected.append({"fault": label, "rank": rank, "step": fault.step, "at": time.time()})
            print(f"injected {label}: {sig.name} to rank {rank} at step {fault.step}", flush=True)
        if view.is_terminal:
            break
        await asyncio.sleep(0.5)
    final = await asyncio.wait_for(jobs.result(handle), timeout=60)
    return {"injected": injected, "status": final.model_dump(mode="json")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / ".lazarus" / "gpu")
    args = parser.parse_args(argv)
    stack = LocalStack(REPO / ".lazarus" / "gpu-check")
    stack.start()
    try:
        result = asyncio.run(run(stack))
    finally:
        stack.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nccl-faults.json").write_text(json.dumps(result, indent=2))
    status = result["status"]
    assert isinstance(status, dict)
    incidents = status.get("incidents") or []
    print(json.dumps({"phase": status.get("phase"), "incidents": incidents}, indent=2))
    return 0 if status.get("phase") == "SUCCEEDED" and len(incidents) >= 2 else 1


if __name__ == "__main__":
    sys.exit(main())
