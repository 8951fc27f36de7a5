"""The GPU check: a killed and a hung rank over NCCL, under Lazarus, on one machine.

Run on a GPU machine, from the repository root (with one GPU the two ranks share
it: :func:`infra.gpu.nccl_train.share_one_gpu`)::

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

from infra import chaos
from lazarus.app.client import JobClient
from lazarus.app.local_stack import LocalStack
from lazarus.domain.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "infra" / "gpu" / "nccl_job.yaml"
FAULTS = [(40, 1, signal.SIGKILL, "crash"), (120, 1, signal.SIGSTOP, "hang")]


async def run(stack: LocalStack, deadline_s: float) -> dict[str, object]:
    spec = load_spec(SPEC)
    for leftover in (Path(spec.checkpoint_dir), Path(spec.run_dir) / spec.name):
        shutil.rmtree(leftover, ignore_errors=True)
    jobs = await JobClient.connect(stack.settings)
    handle = await jobs.start(spec)
    run_root = Path(spec.run_dir) / spec.name
    plan = list(FAULTS)
    injected: list[dict[str, object]] = []
    faulted_generation = 0
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        view = await jobs.status(handle)
        generation, step = chaos.current_step(run_root)
        # The next fault goes to any generation after the last one's: a recovery that
        # took two generations (a rejoin that fell back) must not skip it.
        if plan and step is not None and step >= plan[0][0] and generation > faulted_generation:
            _, rank, sig, label = plan.pop(0)
            fault = chaos.signal_rank(run_root, rank, sig)
            injected.append({"fault": label, "rank": rank, "step": fault.step, "at": time.time()})
            faulted_generation = generation
            print(f"injected {label}: {sig.name} to rank {rank} at step {fault.step}", flush=True)
        if view.is_terminal:
            break
        await asyncio.sleep(0.5)
    if not view.is_terminal:  # out of time: keep what was seen, leave nothing running
        phase = view.status.phase if view.status else view.phase_hint
        print(f"deadline: the job is still {phase}; cancelling it", flush=True)
        status = await jobs.query(handle)
        await jobs.cancel(handle)
        return {"injected": injected, "status": status.model_dump(mode="json"), "timed_out": True}
    final = await asyncio.wait_for(jobs.result(handle), timeout=60)
    return {"injected": injected, "status": final.model_dump(mode="json")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / ".lazarus" / "gpu")
    parser.add_argument("--deadline-s", type=float, default=420.0, help="give up after this long")
    args = parser.parse_args(argv)
    stack = LocalStack(REPO / ".lazarus" / "gpu-check")
    stack.start()
    try:
        result = asyncio.run(run(stack, args.deadline_s))
    finally:
        stack.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nccl-faults.json").write_text(json.dumps(result, indent=2))
    spec = load_spec(SPEC)  # the ranks' logs, one archive: the evidence beside the figures
    shutil.make_archive(str(args.out / "runs"), "gztar", Path(spec.run_dir))
    status = result["status"]
    assert isinstance(status, dict)
    incidents = status.get("incidents") or []
    print(json.dumps({"phase": status.get("phase"), "incidents": incidents}, indent=2))
    return 0 if status.get("phase") == "SUCCEEDED" and len(incidents) >= 2 else 1


if __name__ == "__main__":
    sys.exit(main())
