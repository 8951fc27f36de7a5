"""``python -m bench state-scale``: recovery at real model sizes, on the SSH test hosts.

Every figure before it was measured on a few-KB to 60 MB training state; real jobs
carry gigabytes a rank. For each ``--sizes-mb`` the example carries that much extra
state a rank (``--state-mb``: checkpointed, snapshotted, pushed to its buddy, restored
and checked byte for byte) on 2 test hosts x 1 rank plus a spare, each with its own
``/dev/shm``, a snapshot every step and ``memory_replicas`` on; two faults, a host lost
(``state_node_loss``) and a rank crash with rejoin (``state_rank_crash``), against a
plain memcpy and ``torch.save``/``torch.load`` of the same bytes. Each row's keys and
the examples: bench/README.md ("Recovery at real model sizes").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import costs, multinode
from bench.benchmark import run_benchmark
from bench.harness import BenchConfig, BenchContext
from bench.jobs import JobShape
from bench.measure import SAMPLE_INTERVAL_S, BackgroundSampler
from bench.registry import runs, scenario
from bench.scenarios_multinode import Layout, run_node_loss, run_rank_crash
from bench.systems import Measured

NODE_LOSS_LAYOUT = Layout(
    "state_node_loss", nodes=2, spares=1, nproc_per_node=1, victim="h2", replicas=True
)
CRASH_RANK = 1
"""h2's rank: the one the crash kills."""
WORLD = NODE_LOSS_LAYOUT.world_size
RESTORED = re.compile(
    r"restored from the replica on \S+ \((\d+) MiB copied in ([\d.]+) s[^;]*; ([\d.]+) s with"
)
STATE_LINE = re.compile(r"^state-scale (\w+) ([\d.]+)(?: bytes (\d+))?")

STATE_NODE_LOSS = scenario(
    "state_node_loss",
    """A host lost at size: h2 killed whole; its step restored from h1's replica onto the spare.

    1. 2 test hosts x 1 rank and a spare host, the example with ``--state-mb`` of
       extra state a rank, a memory snapshot every step, ``memory_replicas`` on;
    2. once it reports ``shape.fault_step``: ``kill_host("h2")``;
    3. the search finds h2's newest step in h1's replicas; h3 listens, h1 streams the
       replica to it (node to node, authenticated); every rank resumes from it;
    4. wait for the end; weights against a 2-rank reference.
    """,
    unavailable=multinode.netns_unavailable_reason,
    references=lambda shape: [(WORLD, shape.steps)],
)

STATE_RANK_CRASH = scenario(
    "state_rank_crash",
    """A rank crash at size: h2's rank SIGKILLed, restarted on its node while h1's rejoins.

    1. as ``state_node_loss``, with rejoin in place;
    2. once it reports ``shape.fault_step``: SIGKILL rank 1 (on h2);
    3. h1's rank keeps its process and state; rank 1 starts again on h2 (warm) and
       loads its node's newest snapshot from tmpfs;
    4. wait for the end; weights against a 2-rank reference.
    """,
    unavailable=multinode.netns_unavailable_reason,
    references=lambda shape: [(WORLD, shape.steps)],
)


@runs(STATE_NODE_LOSS, "lazarus")
async def state_node_loss(ctx: BenchContext, repeat: int) -> Measured:
    with _Rss(ctx.stack.worker_pid) as rss:
        outcome = await run_node_loss(ctx, repeat, NODE_LOSS_LAYOUT, rejoin=False)
    outcome.metrics |= {"worker_rss_growth_mib": rss.growth_mib(), **_restore_rate(ctx)}
    outcome.metrics |= _rank_log_metrics(ctx)
    return outcome


@runs(STATE_RANK_CRASH, "lazarus")
async def state_rank_crash(ctx: BenchContext, repeat: int) -> Measured:
    layout = replace(NODE_LOSS_LAYOUT, label="state_rank_crash")
    return await run_rank_crash(ctx, repeat, layout, CRASH_RANK, rejoin=True)


# --------------------------------------------------------------------------- measures


class _Rss(BackgroundSampler):
    """The worker's resident memory every 50 ms while the run lasts (a context manager)."""

    def __init__(self, pid: int) -> None:
        super().__init__(SAMPLE_INTERVAL_S, name="bench-rss")
        self.pid = pid
        self.start_kib = _rss_kib(pid) or 0
        self.peak_kib = self.start_kib

    def sample(self) -> None:
        now = _rss_kib(self.pid)
        if now is not None:
            self.peak_kib = max(self.peak_kib, now)

    def growth_mib(self) -> float:
        return round((self.peak_kib - self.start_kib) / 1024, 1)


def _rss_kib(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def _restore_rate(ctx: BenchContext) -> dict[str, Any]:
    """The newest restore line in the worker's log: the copy's seconds and GB/s, and
    the whole restore's seconds (the two ends' start on their nodes included)."""
    found: tuple[int, float, float] | None = None
    for log in sorted(ctx.stack.state_dir.glob("worker-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            match = RESTORED.search(line)
            if match:
                found = (int(match.group(1)), float(match.group(2)), float(match.group(3)))
    if found is None:
        return {"restore_s": None, "restore_gb_s": None, "restore_total_s": None}
    mib, seconds, total = found
    rate = (mib << 20) / seconds / 1e9 if seconds > 0 else None
    return {"restore_s": seconds, "restore_gb_s": rate, "restore_total_s": total}


def _rank_log_metrics(ctx: BenchContext) -> dict[str, Any]:
    """Stalls, pushes, skipped snapshots and the memcpy, from every rank log of the
    newest node-loss run (the example prints ``state-scale ...`` lines)."""
    seen: dict[str, list[float]] = {"stall_s": [], "copy_s": [], "memcpy_s": [], "push_s": []}
    skipped = 0
    roots = [root for root in ctx.run_roots.values() if "state-node-loss" in str(root)]
    for root in roots[-1:]:
        for log in root.glob("*/gen-*/rank-*.log"):
            for line in log.read_text(errors="replace").splitlines():
                match = STATE_LINE.match(line)
                if match is None:
                    continue
                what, value, size = match.group(1), float(match.group(2)), match.group(3)
                if what == "push_s" and size and value > 0:
                    seen[what].append(int(size) / value / 1e9)  # GB/s
                elif what in ("stall_s", "copy_s", "memcpy_s"):
                    seen[what].append(value)
                elif what == "skipped":
                    skipped += int(value)
    stall, host_copy, copy, push = (
        statistics.median(values) if values else None for values in seen.values()
    )
    return {
        "snapshot_stall_s": stall,
        "snapshot_copy_s": host_copy,
        "memcpy_s": copy,
        "stall_over_memcpy": stall / copy if stall and copy else None,
        "copy_over_memcpy": host_copy / copy if host_copy and copy else None,
        "snapshots": len(seen["stall_s"]),
        "snapshots_skipped": skipped,
        "push_gb_s": push,
    }


def disk_path(size_mb: int, directory: Path) -> dict[str, float]:
    """``torch.save`` then ``torch.load`` of a state of ``size_mb`` MiB in ``directory``
    (the run's disk, as a torchrun user's checkpoint), and one host copy of it."""
    import torch

    state = {"tensor": torch.arange((size_mb << 20) // 4, dtype=torch.int32)}
    target = torch.empty_like(state["tensor"])
    target.copy_(state["tensor"])
    started = time.perf_counter()
    target.copy_(state["tensor"])
    memcpy_s = time.perf_counter() - started
    path = directory / "state.pt"
    started = time.perf_counter()
    torch.save(state, path)
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
    save_s = time.perf_counter() - started
    started = time.perf_counter()
    loaded = torch.load(path, weights_only=True)
    load_s = time.perf_counter() - started
    assert torch.equal(loaded["tensor"], state["tensor"])
    path.unlink()
    gb = (size_mb << 20) / 1e9
    return {
        "bench_memcpy_s": memcpy_s,
        "torch_save_s": save_s,
        "torch_load_s": load_s,
        "torch_save_gb_s": gb / save_s,
        "torch_load_gb_s": gb / load_s,
    }


# --------------------------------------------------------------------------- command


def shape_for(size_mb: int, quick: bool) -> JobShape:
    """A job long enough for snapshots and pushes of ``size_mb`` to settle before the
    fault: a 1 s step (a large model's steps take seconds), snapshots every step
    (skipped while one is in flight), a disk checkpoint before the fault only as the
    fallback."""
    if quick:
        return replace(JobShape.quick(), state_mb=size_mb)
    return replace(
        JobShape(),
        steps=40,
        step_time_s=1.0,
        ckpt_every=15,
        fault_step=24,
        state_mb=size_mb,
        job_timeout_s=600.0,
        health={"startup_timeout_s": 180.0, "poll_interval_s": 0.5},
    )


FAULTS = {"node_loss": STATE_NODE_LOSS, "crash": STATE_RANK_CRASH}
"""``--faults`` names: the two scenarios, each in runs of its own."""


def measure_size(
    size_mb: int, repeats: int, quick: bool, progress: Any, faults: list[str] | None = None
) -> dict[str, Any]:
    config = replace(
        BenchConfig.quick() if quick else BenchConfig(), shape=shape_for(size_mb, quick)
    )
    run = run_benchmark(
        [FAULTS[name] for name in faults or list(FAULTS)],
        config,
        repeats,
        progress=progress,
        systems=["lazarus"],
        label=f"state-{size_mb}",
    )
    row: dict[str, Any] = {"size_mb": size_mb, "repeats": repeats}
    for name, prefix in (("state_node_loss", "node_loss"), ("state_rank_crash", "crash")):
        records = [r for r in run.records if r.scenario == name]
        values = [r.metrics for r in records if r.metrics and r.error is None]
        if not values:
            why = next((r.error or r.skipped for r in records if r.error or r.skipped), None)
            row[f"{prefix}_error"] = why or "not run"
            continue

        def median(key: str, values: list[dict[str, Any]] = values) -> Any:
            found = [v[key] for v in values if isinstance(v.get(key), int | float)]
            return statistics.median(found) if found else None

        row |= {
            f"{prefix}_s": median("recovery_outside_s"),
            f"{prefix}_steps_lost": median("steps_lost"),
            f"{prefix}_weights_ok": all(v.get("weights_ok") is True for v in values),
        }
        if prefix == "crash":
            row["crash_state_loaded_s"] = median("state_loaded_outside_s")
        if prefix == "node_loss":
            for key in (
                "restore_gb_s",
                "restore_s",
                "restore_total_s",
                "phase_resume_chosen_s",
                "push_gb_s",
                "snapshot_stall_s",
                "snapshot_copy_s",
                "memcpy_s",
                "stall_over_memcpy",
                "copy_over_memcpy",
                "snapshots",
                "snapshots_skipped",
                "worker_rss_growth_mib",
            ):
                row[key] = median(key)
    with tempfile.TemporaryDirectory(prefix="lazarus-state-disk-", dir=Path.cwd()) as tmp:
        row |= disk_path(size_mb, Path(tmp))
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    def fmt(value: Any, spec: str = ".2f") -> str:
        return (
            "-"
            if value is None
            else format(value, spec)
            if isinstance(value, float)
            else str(value)
        )

    head = ["state a rank", "snapshot stall (memcpy)", "push", "restore"]
    head += ["node loss: kill to full world", "steps lost", "worker RSS growth", "weights"]
    head += ["rank crash (rejoin): state loaded, first step", "steps lost"]
    head += ["torch.save / torch.load"]
    body = [
        [
            f"{r['size_mb']} MiB",
            f"{fmt(r.get('snapshot_stall_s'), '.3f')} s "
            f"({fmt(r.get('memcpy_s'), '.3f')} s, {fmt(r.get('stall_over_memcpy'))}x)",
            f"{fmt(r.get('push_gb_s'))} GB/s",
            f"{fmt(r.get('restore_gb_s'))} GB/s",
            f"{fmt(r.get('node_loss_s'))} s",
            fmt(r.get("node_loss_steps_lost"), ".0f"),
            f"{fmt(r.get('worker_rss_growth_mib'), '.0f')} MiB",
            {None: "-", True: "equal", False: "DIFFER"}[r.get("node_loss_weights_ok")],
            f"{fmt(r.get('crash_state_loaded_s'))} s, {fmt(r.get('crash_s'))} s",
            fmt(r.get("crash_steps_lost"), ".0f"),
            f"{fmt(r.get('torch_save_gb_s'))} / {fmt(r.get('torch_load_gb_s'))} GB/s",
        ]
        for r in rows
    ]
    return "\n".join(costs.table(head, body))


def add_command(commands: Any) -> None:
    parser = costs.add_parser(
        "state-scale",
        commands,
        __doc__,
        help="node loss and rank crash with GBs of state a rank, on the SSH test hosts",
    )
    parser.add_argument(
        "--sizes-mb", default="256,512,1024", help="extra state a rank, MiB, comma-separated"
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs per size (default 1)")
    parser.add_argument("--quick", action="store_true", help="64 MiB, a short job")
    parser.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help="which faults to run, comma-separated: node_loss, crash (default both)",
    )


def run(args: argparse.Namespace) -> int:
    sizes = [64] if args.quick else costs.sizes_mb(args.sizes_mb)
    load = os.getloadavg()
    faults = [name.strip() for name in args.faults.split(",") if name.strip()]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown or not faults:
        raise SystemExit(f"--faults: unknown {unknown or 'none given'}; choose from {list(FAULTS)}")
    rows = [measure_size(size, max(1, args.repeats), args.quick, print, faults) for size in sizes]
    costs.write_cost_results("state-scale", args.json_out, load, rows, markdown(rows))
    print(json.dumps(rows, indent=1, default=str)[:4000])
    return 0
