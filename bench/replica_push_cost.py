"""``python -m bench replica-push-cost``: what pushing a memory snapshot to its buddy
costs the training step, per GB, at realistic sizes.

A push's cost follows its bytes, not the step, so it is measured at size: a fixed CPU
step on one thread (a matmul and a pass over 64 MB) timed alone, then while
:func:`lazarus.rank.replica.push` sends a committed snapshot to a
:class:`lazarus.rank.replica.Receiver` in another process. The cost is
``sum(steps during the push) - n x median(baseline)``, per GB. Two placements: the push
on a **separate** core (a GPU node's case, the simulator's figure) and **shared** cores
(the worst case). Not measured: a push sharing the NIC with NCCL. Figures:
docs/results/2026-12-memory-replicas.md, "At size, per GB".
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import costs
from bench.costs import sizes_mb, timed, tmpfs_scratch, write_cost_results

GB = 1e9
JOB = "bench-replica-push"
KEY = secrets.token_bytes(32)
PLACEMENTS = ("separate", "shared")
STEP_CORE = 0
PUSH_CORE = 1

_RECEIVER = """
import sys, time
from pathlib import Path
from lazarus.rank import memory, replica
root = Path(sys.argv[1])
memory.secure(root)
config = replica._Config(
    listen="127.0.0.1:0", allowed_from="127.0.0.1", root=root, job_id=sys.argv[2],
    generation=1, keep=1, key=bytes.fromhex(sys.stdin.readline().strip()),
)
receiver = replica.Receiver(config)
print(receiver.port, flush=True)
sys.stdin.read()  # until the bench closes our stdin
receiver.close()
"""


@contextmanager
def buddy(root: Path, pin: bool) -> Iterator[str]:
    """A receiver in a process of its own (the buddy node); yields its address."""
    command = [sys.executable, "-c", _RECEIVER, str(root), JOB]
    if pin:
        command = ["taskset", "-c", str(PUSH_CORE), *command]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdin is not None
        process.stdin.write(KEY.hex() + "\n")  # the key on stdin, never argv
        process.stdin.flush()
        port = process.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError(f"the receiver did not start (it printed {port!r})")
        yield f"127.0.0.1:{port}"
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def committed_snapshot(step: int, size_bytes: int) -> Path:
    """A committed memory snapshot of ``size_bytes`` of random bytes (random, so no
    page is shared or zero), written and sealed by the rank helper's own calls."""
    from lazarus.rank import memory

    target = memory.write_dir(step) / "state.pt"
    with open(target, "wb") as handle:
        left = size_bytes
        while left > 0:
            chunk = min(left, 64 << 20)
            handle.write(os.urandom(chunk))
            left -= chunk
    return memory.commit(step)


def step_work() -> Callable[[], None]:
    """One step of fixed CPU work on one thread (tens of ms): a 1024 x 1024 matmul,
    which needs the core, and a pass over 64 MB, which needs memory bandwidth, the
    resource a push on another core still shares."""
    import torch

    matrix = torch.rand(1024, 1024)
    stream = torch.rand(16 << 20)

    def step() -> None:
        matrix @ matrix  # the work is the point: its result is not needed
        stream.mul_(1.0)

    return step


def timed_steps(step: Callable[[], None], count: int) -> list[float]:
    return [timed(step) for _ in range(count)]


def one_push(
    step: Callable[[], None], snapshot: Path, to: str, baseline_steps: int, pin: bool
) -> dict[str, float]:
    """Baseline steps, then steps while one push of ``snapshot`` runs beside them."""
    from lazarus.rank import replica

    baseline = timed_steps(step, baseline_steps)
    outcome: dict[str, float] = {}

    def push() -> None:
        if pin:
            os.sched_setaffinity(0, {PUSH_CORE})  # this thread only (Linux)
        started = time.perf_counter()
        outcome["bytes"] = replica.push(snapshot, to, key=KEY, slot=0, job_id=JOB, generation=1)
        outcome["push_s"] = time.perf_counter() - started

    pusher = threading.Thread(target=push, name="bench-replica-push")
    during: list[float] = []
    pusher.start()
    while pusher.is_alive():
        during += timed_steps(step, 1)
    pusher.join()
    if "bytes" not in outcome:
        raise RuntimeError(f"the push of {snapshot} failed (see stderr)")
    typical = statistics.median(baseline)
    extra = sum(during) - len(during) * typical
    return {
        "step_s": typical,
        "steps_during_push": len(during),
        "push_s": outcome["push_s"],
        "bytes": outcome["bytes"],
        "extra_s": extra,
    }


def measure(
    placement: str, size_mb: int, repeats: int, steps: int, scratch: Path
) -> dict[str, Any]:
    """One placement and size: ``repeats`` pushes, each after its own baseline."""
    from lazarus.domain import environment
    from lazarus.rank import reset

    pin = placement == "separate"
    tier = scratch / f"{placement}-{size_mb}-tier"
    os.environ.update(
        {
            environment.JOB_ID: JOB,
            environment.GENERATION: "1",
            environment.MEMORY_CHECKPOINT_DIR: str(tier),
            environment.MEMORY_KEEP: "1",
        }
    )
    reset._reset_state()
    if pin:
        os.sched_setaffinity(0, {STEP_CORE})
    step = step_work()
    pushes = []
    try:
        with buddy(scratch / f"{placement}-{size_mb}-buddy", pin) as to:
            for repeat in range(1, repeats + 1):
                snapshot = committed_snapshot(repeat, size_mb << 20)
                pushes.append(one_push(step, snapshot, to, steps, pin))
    finally:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    gigabytes = (size_mb << 20) / GB
    extra = statistics.median(p["extra_s"] for p in pushes)
    push_s = statistics.median(p["push_s"] for p in pushes)
    step_s = statistics.median(p["step_s"] for p in pushes)
    return {
        "placement": placement,
        "size_mb": size_mb,
        "gigabytes": gigabytes,
        "pushes": pushes,
        "step_median_s": step_s,
        "push_median_s": push_s,
        "push_gb_per_s": gigabytes / push_s,
        "extra_median_s": extra,
        "extra_s_per_gb": extra / gigabytes,
        "extra_fraction_of_push": extra / push_s,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| placement | snapshot | step | push, median | GB/s | steps' extra time, median "
        "| per GB | share of the push's time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['placement']} cores | {r['size_mb']} MiB | {r['step_median_s'] * 1000:.0f} ms "
        f"| {r['push_median_s']:.3f} s | {r['push_gb_per_s']:.2f} | {r['extra_median_s']:.3f} s "
        f"| {r['extra_s_per_gb']:.3f} s | {r['extra_fraction_of_push']:.0%} |"
        for r in rows
    ]
    return "\n".join(lines)


def add_command(commands: Any) -> None:
    parser = costs.add_parser(
        "replica-push-cost",
        commands,
        __doc__,
        help="what a memory replica's push to its buddy costs the step, per GB",
    )
    parser.add_argument(
        "--sizes-mb", default="256,1024", help="snapshot sizes in MiB (default 256,1024)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="pushes per size and placement")
    parser.add_argument("--steps", type=int, default=20, help="baseline steps before each push")


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)  # one core's step, and the machine is shared
    if (os.cpu_count() or 1) < 2:
        print("replica-push-cost needs 2 cores (the step on one, the push on another)")
        return 2
    load = os.getloadavg()
    with tmpfs_scratch("lazarus-replica-push-cost-") as scratch:
        rows = [
            measure(placement, size, max(1, args.repeats), max(3, args.steps), Path(scratch))
            for size in sizes_mb(args.sizes_mb)
            for placement in PLACEMENTS
        ]
    write_cost_results(
        "replica-push-cost",
        args.json_out,
        load,
        rows,
        markdown(rows),
        torch=torch.__version__,
        device="cpu",
    )
    return 0
