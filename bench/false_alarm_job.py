"""The false-alarm soak's training job (issue 38): no fault, every legitimate pause.

A 2-rank gloo job whose steps are an ``all_reduce`` after a sleep jittering between one
and two ``--step-time``, with, on the wall-clock ``--schedule`` the soak writes
(:func:`bench.soak_false_alarms.plan`): checkpoint saves, evaluation pauses, data-loader
stalls on one rank, with ``--helper`` a just-in-time save when the controller asks, and
slow first steps after every (re)start. Rank 0 decides when an event is due and tells
the others in the step's ``all_reduce``, so every rank acts on it at the same step.

With ``--helper`` it uses ``lazarus.rank`` (heartbeats, the checkpoint protocol, which
declares the save a slow phase itself, and ``lz.slow_phase``); without it, it never
imports Lazarus and the spec's ``progress_regex`` reads its ``step N`` lines. Each event
rank 0 acts on goes to ``<workdir>/events.jsonl`` for the soak's report.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

NONE, SAVE, EVAL, STALL, JIT = 0, 1, 2, 3, 4
KINDS = {
    SAVE: "checkpoint_save",
    EVAL: "evaluation",
    STALL: "data_loader_stall",
    JIT: "just_in_time_save",
}


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--helper", action="store_true", help="use lazarus.rank")
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=10**9)
    return parser.parse_args(argv)


class Events:
    """Rank 0's view of the schedule: which event is due now (at most one a step)."""

    def __init__(self, schedule: dict[str, Any], started: float) -> None:
        t0 = float(schedule["t0"])
        self.save_every_s = float(schedule["save_every_s"])
        self.t0 = t0
        # A restarted process does not redo what fell due before it started.
        self.next_save = t0 + self.save_every_s * (int((started - t0) / self.save_every_s) + 1)
        self.once = sorted(
            [(t0 + float(at), EVAL) for at in schedule["eval_at_s"]]
            + [(t0 + float(at), STALL) for at in schedule["stall_at_s"]]
        )
        self.once = [(at, kind) for at, kind in self.once if at > started]

    def due(self, now: float) -> int:
        if self.once and self.once[0][0] <= now:
            return self.once.pop(0)[1]
        if now >= self.next_save:
            while self.next_save <= now:
                self.next_save += self.save_every_s
            return SAVE
        return NONE


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    schedule = json.loads(args.schedule.read_text())
    started = time.time()
    lz: Any = None
    if args.helper:
        lz = importlib.import_module("lazarus.rank")  # only the helper variant imports it
    dist.init_process_group("gloo", init_method="env://")
    if lz is not None:
        lz.mark("process_group_ready")
    rank, world = dist.get_rank(), dist.get_world_size()
    rng = random.Random(rank * 7919 + os.getpid())
    args.workdir.mkdir(parents=True, exist_ok=True)
    plain_ckpt = args.workdir / "plain-checkpoint.json"
    if lz is not None:
        step = lz.resume_step() or 0
    else:
        step = json.loads(plain_ckpt.read_text())["step"] if plain_ckpt.exists() else 0
    events = Events(schedule, started) if rank == 0 else None
    local_steps = 0

    def phase(name: str) -> contextlib.AbstractContextManager[None]:
        return lz.slow_phase(name) if lz is not None else contextlib.nullcontext()

    def log_event(kind: int) -> None:
        if rank != 0:
            return
        line = {"kind": KINDS[kind], "at": time.time(), "step": step, "pid": os.getpid()}
        with (args.workdir / "events.jsonl").open("a") as out:
            out.write(json.dumps(line) + "\n")

    while step < args.steps:
        if local_steps == 0:
            compute = float(schedule["first_step_s"])
        elif local_steps < int(schedule["warmup_steps"]):
            compute = float(schedule["warmup_s"])
        else:
            compute = args.step_time * rng.uniform(1.0, float(schedule["jitter"]))
        time.sleep(compute)
        due = NONE
        if events is not None:
            # The controller's just-in-time request (before a planned stop) comes first.
            asked = lz is not None and lz.should_checkpoint()
            due = JIT if asked else events.due(time.time())
        tensor = torch.tensor([1.0, float(due)])
        dist.all_reduce(tensor)
        event = int(tensor[1].item())
        step += 1
        local_steps += 1
        if lz is not None:
            lz.heartbeat(step)
        print(f"step {step}", flush=True)  # the plain variant's progress signal
        if event in (SAVE, JIT):
            log_event(event)
            save_s = float(schedule["save_s"] if event == SAVE else schedule["jit_save_s"])
            # With the helper, its checkpoint protocol declares ``checkpoint_save`` itself,
            # from the first ``checkpoint_path`` to the commit; a plain script cannot.
            if rank == 0:
                began = time.monotonic()
                if lz is None:
                    tmp = plain_ckpt.with_suffix(".tmp")
                    tmp.write_text(json.dumps({"step": step}))
                    os.replace(tmp, plain_ckpt)
                else:
                    state = Path(lz.checkpoint_path(step)) / "state.json"
                    state.write_text(json.dumps({"step": step}))
                time.sleep(max(0.0, save_s - (time.monotonic() - began)))
            elif lz is not None:
                lz.checkpoint_path(step)  # every rank saves its shard: this declares it
            dist.barrier()
            if lz is not None and rank == 0:
                lz.commit_checkpoint(step)
        elif event == EVAL:
            log_event(event)
            with phase("evaluation"):
                time.sleep(float(schedule["eval_s"]))
                dist.barrier()
        elif event == STALL:
            log_event(event)
            if rank == int(schedule["stall_rank"]) % world:
                with phase("data_loader"):
                    time.sleep(float(schedule["stall_s"]))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
