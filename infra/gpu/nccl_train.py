"""A tiny DDP job over NCCL for the GPU check (:mod:`infra.gpu.nccl_faults`).

Each rank takes GPU ``LOCAL_RANK % device_count``; the loop runs through
:func:`lazarus.rank.torch.run_resilient`, so a job with ``rejoin`` keeps the
survivors' processes and aborts their NCCL communicators (not a wait on the dead
peer) when a peer is killed. Checkpoints go to the memory tier and to disk like the
CPU example's.

NCCL refuses two ranks of one communicator on one device ("Duplicate GPU detected":
it compares host and bus ids). With fewer GPUs than ranks on the node (a lent
one-GPU machine), :func:`share_one_gpu` gives each rank its own ``NCCL_HOSTID``, so
NCCL takes the ranks for separate hosts and joins them through its network
transport (sockets over loopback) instead of shared memory or P2P: the
communicators, their abort and the watchdog are NCCL's own, only the wire differs.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import lazarus.rank as lazarus_rank
import lazarus.rank.torch as lazarus_torch

STEPS = int(os.environ.get("NCCL_CHECK_STEPS", "200"))
STEP_TIME_S = 0.05


def share_one_gpu() -> str | None:
    """When the node has fewer GPUs than ranks, make NCCL treat each rank as its own
    host (see the module docstring); returns what was set, for the log, or None."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if torch.cuda.device_count() >= local_world:
        return None
    rank = os.environ.get("RANK", "0")
    os.environ["NCCL_HOSTID"] = f"lazarus-gpu-check-rank-{rank}"
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_IB_DISABLE", "1")
    return f"{torch.cuda.device_count()} GPU(s) for {local_world} ranks: NCCL_HOSTID per rank"


def setup() -> dict[str, Any]:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = nn.Linear(1024, 1024).to(device)
    return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=1e-3)}


def current(state: Mapping[str, Any]) -> dict[str, Any]:
    return {name: stateful.state_dict() for name, stateful in state.items()}


def train(start: int, state: Mapping[str, Any]) -> None:
    """From ``start`` to :data:`STEPS`, with the CPU example's checkpoint calls (both
    are collectives: every rank calls them every step)."""
    model, optimizer = state["model"], state["optimizer"]
    ddp_model = DistributedDataParallel(model)
    device = next(model.parameters()).device
    completed = start
    while completed < STEPS:
        with lazarus_rank.compute_timer():
            batch = torch.randn(64, 1024, device=device)
            optimizer.zero_grad(set_to_none=True)
            loss = ddp_model(batch).square().mean()
        loss.backward()
        optimizer.step()
        completed += 1
        value = loss.item()  # synchronises with the GPU: the step is done
        if dist.get_rank() == 0:
            print(f"step {completed} loss {value:.6f}", flush=True)
        lazarus_rank.heartbeat(completed, loss=value)
        if lazarus_torch.should_checkpoint(completed, every=20):
            lazarus_torch.save(completed, current(state))
        else:
            lazarus_torch.snapshot(completed, lambda: current(state))
        time.sleep(STEP_TIME_S)
    lazarus_rank.flush_heartbeat()
    lazarus_torch.flush_snapshots()
    dist.barrier()


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: this check runs on a GPU machine", file=sys.stderr)
        return 2
    shared = share_one_gpu()
    if shared is not None:
        print(f"rank {os.environ.get('RANK')}: {shared}", file=sys.stderr, flush=True)
    lazarus_torch.run_resilient(train, setup, backend="nccl", timeout=timedelta(seconds=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
