"""A small, fully deterministic DDP training job that Lazarus can kill and resume.

Determinism is the point: the model is seeded, and the batch for step ``s`` on
rank ``r`` depends only on ``(seed, s, r)``, so a run interrupted at any step and
resumed from a checkpoint ends with bit-identical weights to an uninterrupted
run. That turns "recovery works" into a ``torch.equal`` check. SGD with momentum
is used because it has optimizer state: forgetting to checkpoint it would break
the equality, which is exactly the mistake the check exists to catch.

Runs under Lazarus, under ``torchrun --nproc-per-node 2 examples/train_ddp.py``,
or alone as ``python examples/train_ddp.py`` (one rank). Every step prints
``step <n> loss <x>`` (n = completed steps) so a progress regex can follow it,
and a resumed run first prints ``resumed from step <n>``.

Checkpoints: to disk every ``--ckpt-every`` steps, unless the controller sets its
own interval (``LAZARUS_CHECKPOINT_EVERY_STEPS`` or the control file), and on its
requests; to the memory tier (a snapshot per ``LAZARUS_MEMORY_EVERY_STEPS``) when
the launcher names ``LAZARUS_MEMORY_CHECKPOINT_DIR``.

``--epoch-batches N`` trains on a fixed data set in epochs of ``N`` batches per rank
instead, read through torchdata's ``StatefulDataLoader`` with a shuffling
``DistributedSampler``: the loader's position goes into every checkpoint beside the
model and optimizer, so a run resumed from a step in the middle of an epoch goes on at
that epoch's next batch, and still ends with the uninterrupted run's weights.

``--resilient`` runs the same training through
:func:`lazarus.rank.torch.run_resilient` (``setup`` builds the model and optimizer
once per process, ``train`` runs the steps once per generation): under a job with
``rejoin``, a rank whose peer died keeps its process, rejoins the next generation
and resumes from the checkpoint every rank of it shares, and the final weights
still equal an uninterrupted run's (DDP and its comm hook are set up again in each
generation; model and optimizer state come from the checkpoint).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

try:
    import lazarus.rank as lazarus_rank
except ImportError:  # a checkout without `pip install -e .`: use the repo next door
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import lazarus.rank as lazarus_rank
import lazarus.rank.torch as lazarus_torch
from lazarus.domain.ports import free_port
from lazarus.rank import replica

INPUT_DIM = 32
HIDDEN_DIM = 64
BATCH_SIZE = 16


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="total steps to complete")
    parser.add_argument("--ckpt-every", type=int, default=10, help="checkpoint period in steps")
    parser.add_argument(
        "--step-time", type=float, default=0.05, help="extra sleep per step, seconds"
    )
    parser.add_argument("--out", type=Path, help="rank 0 saves the final state_dict here")
    parser.add_argument(
        "--checkpoint-dir", type=Path, help="used when LAZARUS_CHECKPOINT_DIR is unset"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument(
        "--epoch-batches",
        type=int,
        default=0,
        help="train in epochs of this many batches per rank from a fixed data set, through "
        "a StatefulDataLoader saved with each checkpoint (0: a fresh batch every step)",
    )
    parser.add_argument(
        "--pg-timeout-s", type=float, default=60.0, help="timeout of every collective"
    )
    parser.add_argument(
        "--resilient",
        action="store_true",
        help="run through lazarus.rank.torch.run_resilient: under a job with rejoin, "
        "survive a peer's death in this process",
    )
    parser.add_argument(
        "--exit-at-step",
        type=int,
        help="testing aid: every rank exits (code 0) right after completing this step, "
        "before any checkpoint of it, as if interrupted",
    )
    parser.add_argument(
        "--die-at-step",
        type=int,
        help="testing aid: the last rank exits 13 on reaching this step, in every generation "
        "(a crash loop)",
    )
    parser.add_argument(
        "--nan-at-step",
        type=int,
        help="testing aid: in the first generation only, the loss turns NaN at this step",
    )
    parser.add_argument(
        "--ballast-mb",
        type=int,
        default=0,
        help="testing aid: rank 0 adds this many MB of data to each checkpoint (slow uploads)",
    )
    parser.add_argument(
        "--state-mb",
        type=int,
        default=0,
        help="testing aid: every rank carries this many MiB of extra training state "
        "(as a large model's optimizer would), checkpointed, snapshotted and restored "
        "with the rest and checked on resume; it never touches the weights",
    )
    slow = parser.add_argument_group(
        "straggler injection (testing aid): one rank's own work takes longer, the way a "
        "throttled GPU or a noisy neighbour makes it"
    )
    slow.add_argument("--slow-rank", type=int, help="this rank is slow")
    slow.add_argument(
        "--slow-node",
        help="ranks on this Lazarus node (LAZARUS_NODE) are slow: moving "
        "the job to another node cures it, as it would a bad machine",
    )
    slow.add_argument("--slow-factor", type=float, default=2.0, help="compute time multiplier")
    slow.add_argument("--slow-from-step", type=int, default=0)
    slow.add_argument("--slow-until-step", type=int, help="default: to the end")
    args = parser.parse_args(argv)
    if args.steps < 0 or args.ckpt_every < 1 or args.epoch_batches < 0:
        parser.error("--steps and --epoch-batches must be >= 0 and --ckpt-every >= 1")
    return args


def build_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(INPUT_DIM, HIDDEN_DIM), nn.Tanh(), nn.Linear(HIDDEN_DIM, 1))


def stream_seed(*parts: int) -> int:
    """A seed that depends on ``parts`` alone, never on how many steps ran before:
    that is what lets a resumed run see exactly the data the original would have."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 63) - 1)


def teacher_weights(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(stream_seed(seed, -1))
    return torch.randn(INPUT_DIM, 1, generator=generator)


def batch_for(seed: int, step: int, rank: int, teacher: torch.Tensor) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(stream_seed(seed, step, rank))
    inputs = torch.randn(BATCH_SIZE, INPUT_DIM, generator=generator)
    noise = 0.01 * torch.randn(BATCH_SIZE, 1, generator=generator)
    return inputs, torch.tanh(inputs @ teacher) + noise


def data_loader(args: argparse.Namespace) -> Any:
    """A ``StatefulDataLoader`` over a fixed, seeded data set of ``--epoch-batches``
    batches per rank, shuffled by a ``DistributedSampler`` (each epoch's order a function
    of the seed and the epoch). Its ``state_dict`` is its position in the epoch, so it is
    saved and restored with the model. Imported here: only this mode needs torchdata."""
    from torch.utils.data import DistributedSampler, TensorDataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    world = int(os.environ["WORLD_SIZE"])
    generator = torch.Generator().manual_seed(stream_seed(args.seed, -2))
    inputs = torch.randn(args.epoch_batches * BATCH_SIZE * world, INPUT_DIM, generator=generator)
    data = TensorDataset(inputs, torch.tanh(inputs @ teacher_weights(args.seed)))
    rank = int(os.environ["RANK"])
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed
    )
    return StatefulDataLoader(data, batch_size=BATCH_SIZE, sampler=sampler)


def epochs(loader: Any, completed: int) -> Iterator[tuple[torch.Tensor, ...]]:
    """The loader's batches from completed step ``completed`` on, epoch after epoch.

    A loader restored from a checkpoint goes on from the saved position in its epoch;
    the sampler's epoch comes from the step count (one batch a step), set before each
    pass, so a resumed pass draws the order the uninterrupted run drew. A position saved
    after an epoch's last batch gives an empty pass: the next one starts the next epoch.
    """
    while True:
        loader.sampler.set_epoch(completed // len(loader))
        for batch in loader:
            completed += 1
            yield tuple(batch)


def alone_as_one_rank() -> None:
    """Without launcher variables, set those of a one-rank group, so the same DDP
    code path runs everywhere."""
    if "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))


def init_distributed(timeout_s: float) -> None:
    """Join the gloo group through ``env://`` (a one-rank group when alone)."""
    alone_as_one_rank()
    lazarus_torch.init_process_group(
        "gloo", init_method="env://", timeout=timedelta(seconds=timeout_s)
    )


def save_atomically(obj: object, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    torch.save(obj, temp)
    os.replace(temp, target)


def rank_ordered_mean(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations
    """Average gradients summing in rank order, whatever the bucket layout.

    With three or more ranks, a ring allreduce adds each element in an order that
    depends on where it sits in the bucket, and DDP lays buckets out differently in
    the first iteration of a process than after it. Floating-point addition is not
    associative, so a resumed run would drift from an uninterrupted one by a few
    ulps. Gathering and summing in rank order makes resume bit-exact at any world size.

    The gather's own result is read first: when a peer dies the gather fails, and
    that error must reach ``backward`` (ignored, the survivor would go on training
    alone on garbage: measured with torch 2.13 and gloo).
    """
    grads = bucket.buffer()
    gathered = [torch.empty_like(grads) for _ in range(dist.get_world_size())]
    work = dist.all_gather(gathered, grads, async_op=True)
    assert work is not None

    def reduce(done):  # type: ignore[no-untyped-def]
        done.value()  # raises the gather's error, if any
        total = gathered[0].clone()
        for other in gathered[1:]:
            total += other
        return total.div_(len(gathered))

    return work.get_future().then(reduce)


def slowdown(args: argparse.Namespace, rank: int, step: int) -> float:
    """How much longer this rank's work takes at ``step`` (1.0: not slow)."""
    slow_here = (args.slow_rank is not None and args.slow_rank == rank) or (
        args.slow_node is not None and os.environ.get("LAZARUS_NODE") == args.slow_node
    )
    until = args.slow_until_step if args.slow_until_step is not None else args.steps
    return args.slow_factor if slow_here and args.slow_from_step <= step < until else 1.0


class Ballast:
    """``--state-mb`` of extra state: a tensor whose first element is the step it was
    saved at and whose rest is a known pattern, so a resume checks that every byte
    came back (a torn or foreign restore raises instead of training on)."""

    def __init__(self, megabytes: int) -> None:
        count = (megabytes << 20) // 4
        self.tensor = torch.arange(count, dtype=torch.int32)
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        self.tensor[0] = self.step
        return {"tensor": self.tensor}

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        # Checked against this process's own tensor, whose elements past the first
        # are the pattern in every process (only [0] changes), then copied in place,
        # as a model's load_state_dict copies into its parameters: one pass to check
        # and one to copy, and no second GiB allocated at a resume.
        tensor = saved["tensor"]
        if tensor.shape != self.tensor.shape or not torch.equal(tensor[1:], self.tensor[1:]):
            raise RuntimeError("the restored --state-mb state is not the one saved")
        self.tensor.copy_(tensor)
        self.step = int(tensor[0])


def setup(args: argparse.Namespace) -> dict[str, Any]:
    """The training state, named as the checkpoints name it: built once per process."""
    model = build_model(args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    state: dict[str, Any] = {"model": model, "optimizer": optimizer}
    if args.state_mb:
        state["ballast"] = Ballast(args.state_mb)
    if args.epoch_batches:
        state["loader"] = data_loader(args)
    return state


def state_of(state: Mapping[str, Any]) -> dict[str, Any]:
    """What a checkpoint or a snapshot holds: every stateful's state dict."""
    return {name: stateful.state_dict() for name, stateful in state.items()}


def report_state_costs(args: argparse.Namespace, state: Mapping[str, Any]) -> None:
    """``--state-mb``: one host copy of the extra state, timed here beside the
    snapshot stalls (``bench state-scale`` reads both from the rank's log)."""
    if not args.state_mb:
        return
    tensor = state["ballast"].tensor
    target = torch.empty_like(tensor)
    target.copy_(tensor)  # fault the pages in: the snapshot's copy reuses its buffer too
    took = []
    for _ in range(3):
        started = time.perf_counter()
        target.copy_(tensor)
        took.append(time.perf_counter() - started)
    print(f"state-scale memcpy_s {sorted(took)[1]:.6f} bytes {tensor.numel() * 4}", flush=True)


def train(args: argparse.Namespace, completed: int, state: Mapping[str, Any]) -> None:
    """Run from completed step ``completed`` to ``--steps`` in the current process
    group, then save ``--out`` (rank 0) and meet the other ranks in a barrier."""
    model: nn.Module = state["model"]
    optimizer: torch.optim.Optimizer = state["optimizer"]
    rank = dist.get_rank()
    if completed:
        print(f"resumed from step {completed}", flush=True)
    if "ballast" in state and completed and state["ballast"].step != completed:
        raise RuntimeError(f"--state-mb state of step {state['ballast'].step}, not {completed}")
    if not completed:  # once a job, at its start: a replacement's time is its recovery's
        report_state_costs(args, state)
    ddp_model = DistributedDataParallel(model)
    ddp_model.register_comm_hook(state=None, hook=rank_ordered_mean)
    teacher = teacher_weights(args.seed)
    loss_fn = nn.MSELoss()
    loader = state.get("loader")
    if loader is not None:
        loader.sampler.rank = rank  # rejoined, this process may hold another rank
    batches = None if loader is None else epochs(loader, completed)

    while completed < args.steps:
        # The rank's own work: timed for straggler detection. The sleep stands in for
        # the compute a real model would do (and a slow rank does more slowly).
        with lazarus_rank.compute_timer():
            if batches is None:
                inputs, targets = batch_for(args.seed, completed, rank, teacher)
            else:
                inputs, targets = next(batches)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(ddp_model(inputs), targets)
            if args.step_time > 0:
                time.sleep(args.step_time * slowdown(args, rank, completed))
        loss.backward()  # the gradient all-reduce runs here: waiting on peers is not compute
        optimizer.step()
        completed += 1
        if "ballast" in state:
            state["ballast"].step = completed

        loss_value = loss.item()
        if completed == args.nan_at_step and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
            loss_value = math.nan
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"loss is {loss_value} at step {completed}: training diverged")
        if completed == args.die_at_step and rank == dist.get_world_size() - 1:
            print(f"injected fault at step {completed}", file=sys.stderr, flush=True)
            os._exit(13)
        print(f"step {completed} loss {loss_value:.6f}", flush=True)
        lazarus_rank.heartbeat(completed, loss=loss_value)
        if completed == args.exit_at_step:
            lazarus_rank.flush_heartbeat()
            os._exit(0)  # skip every cleanup, like a kill would
        # should_checkpoint and snapshot are collectives: every rank calls them every step.
        if lazarus_torch.should_checkpoint(completed, every=args.ckpt_every):
            if args.ballast_mb and rank == 0:
                ballast = lazarus_rank.checkpoint_path(completed) / "ballast.bin"
                ballast.write_bytes(os.urandom(args.ballast_mb << 20))
            lazarus_torch.save(completed, state_of(state))
        else:
            started = time.perf_counter()
            if lazarus_torch.snapshot(completed, lambda: state_of(state)) and args.state_mb:
                stall = time.perf_counter() - started
                print(f"state-scale stall_s {stall:.6f} step {completed}", flush=True)
                copy_s = lazarus_torch.last_snapshot_copy_s
                print(f"state-scale copy_s {copy_s:.6f} step {completed}", flush=True)
            while args.state_mb and replica.completed_pushes:
                step, sent, took = replica.completed_pushes.popleft()
                print(f"state-scale push_s {took:.6f} bytes {sent} step {step}", flush=True)

    # After the last step: the last snapshot's write, the final save and the barrier
    # are slower than a step, a slow phase the supervisor does not call a hang.
    with lazarus_rank.slow_phase("finishing"):
        lazarus_torch.flush_snapshots()
        if args.state_mb:
            print(f"state-scale skipped {lazarus_torch.snapshots_skipped}", flush=True)
        if rank == 0 and args.out is not None:
            save_atomically(model.state_dict(), args.out)
        dist.barrier()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.checkpoint_dir is not None:
        lazarus_rank.configure(checkpoint_dir=args.checkpoint_dir)
    if args.resilient:
        alone_as_one_rank()
        lazarus_torch.run_resilient(
            lambda completed, state: train(args, completed, state),
            lambda: setup(args),
            backend="gloo",
            timeout=timedelta(seconds=args.pg_timeout_s),
        )
        return 0
    init_distributed(args.pg_timeout_s)
    state = setup(args)
    completed = 0
    resumed = lazarus_torch.load()
    if resumed is not None:
        completed, saved = resumed
        for name, stateful in state.items():
            stateful.load_state_dict(saved[name])
    train(args, completed, state)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
