"""The example job under NVRx's in-process restart (``nvidia_resiliency_ext.inprocess``).

One process per rank plus a spare, started directly (not under torchrun, which would
kill every worker when one fails; no ``LOCAL_RANK``, which adds GPU checks that fail on
CPU). The ``Wrapper`` runs ``examples/train_ddp.py``'s ``setup``/``train`` on two active
ranks; on a failure it restarts the function in the survivors, ``ShiftRanks`` moves the
spare in, and training resumes from the newest disk checkpoint. Per iteration: a process
group from the Wrapper's store, ``call_wrapper.ping()`` once a step, a
``nvrx iteration <i> rank <r>`` line. :func:`warm_up` imports before the Wrapper starts
what training imports lazily (``torch._dynamo``): an import cut short by a restart's
asynchronous exception leaves the module half-initialised, and the spare never took a
dead rank's place. Settings: docs/results/2026-12-peers.md.
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
