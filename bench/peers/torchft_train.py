"""The example job under torchft: one replica group per process, the same model and data.

Each group (one process under its own ``torchrun --max-restarts``) asks the Lighthouse
for a quorum every step and commits it only if every collective succeeded; a dead group
is dropped, restarted by its torchrun, and heals from a live peer. Beside
``examples/train_ddp.py`` (whose model, batches and SGD settings it imports): torchft's
``Manager``, DDP and ``OptimizerWrapper``; group ``r`` sees rank ``r``'s batches, so a
fault-free run matches the example's weights; a comm hook that discards a failed step
where torchft 0.2.0's asserts; disk checkpoints every ``--ckpt-every`` steps (replica 0)
and a cold start resumes from them; ``--start-together``; ``--advertise`` and
``--wait-for`` for the SSH test hosts. Why each: docs/results/2026-12-peers.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from datetime import timedelta
from pathlib import Path

# examples/ is no package: the example is imported as ``train_ddp`` from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.distributed as dist
import train_ddp
from torch import nn


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--ckpt-every", type=int, default=20)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--checkpoint-dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--timeout-s", type=float, default=10.0, help="collectives and quorum")
    parser.add_argument("--quorum-timeout-s", type=float, default=60.0)
    parser.add_argument("--min-replica-size", type=int, default=1)
    parser.add_argument(
        "--start-together",
        type=Path,
        help="a folder: a first start waits until every group has written its file there",
    )
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--advertise", help="this host's address (default: its hostname)")
    parser.add_argument("--wait-for", type=Path, help="start training once this file exists")
    return parser.parse_args()


def advertise(address: str) -> None:
    """Make ``socket.gethostname()`` this host's address before torchft is imported: its
    Manager takes it as a default argument, its HTTP checkpoint transport at each call."""
    import socket

    socket.gethostname = lambda: address


def wait_for(gate: Path) -> None:
    import time

    while not gate.exists():
        time.sleep(0.02)


def discarding_hook(manager, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations
    """torchft's ``_comm_hook``, less its assertion: an errored step is discarded."""
    work = manager.allreduce(bucket.buffer())
    work.wait()
    inner = getattr(work.get_future(), "_fut", None)
    if inner is not None:
        return inner
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def start_together(folder: Path, replica: int, groups: int) -> None:
    """Every group heartbeats before any asks for its first quorum: otherwise the
    first group up forms a quorum alone (``min_replica_size`` 1) and trains its
    first steps alone, and no run could match the fault-free weights."""
    import time

    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"group-{replica}").touch()
    while len(list(folder.glob("group-*"))) < groups:
        time.sleep(0.05)


def newest_checkpoint(folder: Path | None) -> dict[str, dict[str, object]] | None:
    """The newest ``step-<n>.pt`` replica 0 saved, or None."""
    if folder is None or not folder.is_dir():
        return None
    saved = sorted(folder.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    if not saved:
        return None
    loaded: dict[str, dict[str, object]] = torch.load(saved[-1], weights_only=True)
    return loaded


def main() -> int:
    args = parse_args()
    if args.advertise:
        advertise(args.advertise)
    from torchft.ddp import DistributedDataParallel
    from torchft.manager import Manager
    from torchft.optim import OptimizerWrapper
    from torchft.process_group import ProcessGroupGloo

    class DDP(DistributedDataParallel):  # type: ignore[misc]
        _comm_hook = staticmethod(discarding_hook)

    if args.wait_for is not None:
        wait_for(args.wait_for)
    replica = int(os.environ["REPLICA_GROUP_ID"])
    timeout = timedelta(seconds=args.timeout_s)
    # The group's store (the Manager connects to it): kept referenced to the end.
    store = dist.TCPStore(  # type: ignore[attr-defined]
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=True,
        wait_for_workers=False,
    )
    model = train_ddp.build_model(args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    def state_dict() -> dict[str, object]:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    def load_state_dict(saved: dict[str, dict[str, object]]) -> None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=args.min_replica_size,
        store_addr=args.advertise or os.environ["MASTER_ADDR"],
        store_port=int(os.environ["MASTER_PORT"]),
        hostname=args.advertise or socket.gethostname(),
        replica_id=f"bench_{replica}",
        timeout=timeout,
        quorum_timeout=timedelta(seconds=args.quorum_timeout_s),
        rank=0,
        world_size=1,
    )
    cold_start = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    saved = newest_checkpoint(args.checkpoint_dir) if cold_start else None
    if saved is not None:
        load_state_dict(saved)
        manager.load_state_dict(saved["torchft"])
        print(f"resumed from step {manager.current_step()}", flush=True)
    ddp = DDP(manager, model)
    wrapped = OptimizerWrapper(manager, optimizer)
    teacher = train_ddp.teacher_weights(args.seed)
    loss_fn = nn.MSELoss()
    print(f"torchft replica {replica} up", flush=True)
    if args.start_together is not None and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        start_together(args.start_together, replica, args.groups)
    while manager.current_step() < args.steps:
        step = manager.current_step()
        wrapped.zero_grad(set_to_none=True)  # starts the quorum
        inputs, targets = train_ddp.batch_for(args.seed, step, replica, teacher)
        loss = loss_fn(ddp(inputs), targets)
        if args.step_time > 0:
            import time

            time.sleep(args.step_time)
        loss.backward()
        wrapped.step()  # commits only if every collective of the step succeeded
        if manager.current_step() == step:
            print(f"discarded step {step + 1}", flush=True)
            continue
        completed = manager.current_step()
        print(f"step {completed} loss {loss.item():.6f}", flush=True)
        if replica == 0 and args.checkpoint_dir is not None and completed % args.ckpt_every == 0:
            train_ddp.save_atomically(
                {**state_dict(), "torchft": manager.state_dict()},
                args.checkpoint_dir / f"step-{completed}.pt",
            )
    if replica == 0 and args.out is not None:
        train_ddp.save_atomically(model.state_dict(), args.out)
    manager.shutdown()
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
