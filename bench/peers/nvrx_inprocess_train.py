"""The example job under NVRx's in-process restart (``nvidia_resiliency_ext.inprocess``).

The bench starts one process per rank plus a spare directly (``RANK``,
``WORLD_SIZE`` = 3, ``MASTER_ADDR``, ``MASTER_PORT``; not under torchrun, which
would kill every worker when one fails; and no ``LOCAL_RANK``, which would add
GPU health checks that fail on CPU). The ``Wrapper`` runs the training function
on two active ranks (``MaxActiveWorldSize(2)``); the third waits as a spare. When
a rank fails, the Wrapper restarts the function in the surviving processes,
``ShiftRanks`` moves the spare into the place of a rank that is gone, and the
function resumes from the example's newest disk checkpoint.

What differs from ``examples/train_ddp.py`` (whose ``setup``/``train`` run as they
are): the process group is formed per restart iteration from the store the
Wrapper hands the function (a ``PrefixStore`` per iteration, on ``MASTER_PORT``
+ 1), ``call_wrapper.ping()`` marks progress once a step (through the example's
per-step ``lazarus.rank.heartbeat``, a no-op outside Lazarus), and each iteration
prints ``nvrx iteration <i> rank <r>`` so the bench can tell restarts apart.
Everything training imports lazily (``torch._dynamo``: DDP's first construction
and the optimizer's first step import it, seconds of work) is imported before the
Wrapper starts, by :func:`warm_up`. NVRx interrupts a rank's function with an
asynchronous exception when a restart is due; an import it cuts short leaves the
module half-initialised in ``sys.modules`` for the rest of the process. The spare
builds its first DDP inside a restart, and under load that import outlasted the soft
timeout: from then on every iteration failed in it (``module 'torch._dynamo' has no
attribute 'utils'`` / ``'trace_rules'``) and the spare never took the dead rank's place.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

# examples/ is no package: the example is imported as ``train_ddp`` from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch._dynamo  # see warm_up
import torch.distributed as dist
import train_ddp

import lazarus.rank as lazarus_rank
import lazarus.rank.torch as lazarus_torch


def warm_up() -> None:
    """Run once what training would import lazily (see the module's docstring)."""
    weight = torch.zeros(1, requires_grad=True)
    weight.grad = torch.zeros(1)
    torch.optim.SGD([weight], lr=0.1, momentum=0.9).step()


def main() -> int:
    from nvidia_resiliency_ext import inprocess

    args = train_ddp.parse_args(sys.argv[1:])
    settings: dict[str, Any] = json.loads(os.environ["BENCH_NVRX_INPROCESS"])
    if args.checkpoint_dir is not None:
        lazarus_rank.configure(checkpoint_dir=args.checkpoint_dir)
    world = int(os.environ["WORLD_SIZE"])
    base_store = dist.TCPStore(  # type: ignore[attr-defined]
        host_name=os.environ["MASTER_ADDR"],
        port=int(os.environ["MASTER_PORT"]) + 1,
        world_size=world,
        is_master=int(os.environ["RANK"]) == 0,
        multi_tenant=True,
        wait_for_workers=True,
        use_libuv=True,
    )
    beat = lazarus_rank.heartbeat
    warm_up()

    def seconds(name: str) -> timedelta:
        return timedelta(seconds=float(settings[name]))

    def run(call_wrapper: Any = None) -> None:
        iteration = call_wrapper.iteration
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        print(f"nvrx iteration {iteration} rank {rank}", flush=True)
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"iteration-{iteration}", base_store),  # type: ignore[attr-defined]
            rank=rank,
            world_size=size,
            timeout=timedelta(seconds=float(settings["pg_timeout_s"])),
        )

        def heartbeat(step: int, **fields: float) -> None:
            call_wrapper.ping()
            beat(step, **fields)

        lazarus_rank.heartbeat = heartbeat
        try:
            state = train_ddp.setup(args)
            completed = 0
            resumed = lazarus_torch.load()
            if resumed is not None:
                completed, saved = resumed
                for name, stateful in state.items():
                    stateful.load_state_dict(saved[name])
            train_ddp.train(args, completed, state)
        finally:
            lazarus_rank.heartbeat = beat
            if dist.is_initialized():
                dist.destroy_process_group()

    # The Wrapper hands the function its CallWrapper by the parameter's annotation,
    # read as an object: this module's annotations are strings (PEP 563), so set it.
    run.__annotations__ = {"call_wrapper": Optional[inprocess.CallWrapper]}  # noqa: UP045
    wrapper = inprocess.Wrapper(
        rank_assignment=inprocess.Compose(
            inprocess.rank_assignment.MaxActiveWorldSize(int(settings["active_world_size"])),
            inprocess.rank_assignment.ShiftRanks(),
        ),
        monitor_thread_interval=seconds("monitor_interval_s"),
        monitor_process_interval=seconds("monitor_interval_s"),
        heartbeat_interval=seconds("heartbeat_interval_s"),
        heartbeat_timeout=seconds("heartbeat_timeout_s"),
        soft_timeout=seconds("soft_timeout_s"),
        hard_timeout=seconds("hard_timeout_s"),
        barrier_timeout=seconds("barrier_timeout_s"),
        completion_timeout=seconds("completion_timeout_s"),
        last_call_wait=seconds("last_call_wait_s"),
    )
    wrapper(run)()
    return 0


if __name__ == "__main__":
    sys.exit(main())
