"""The example training job run straight through, without Lazarus: the weights every
fault-tolerant run of it must end with.

The example is deterministic (see ``examples/train_ddp.py``), so a job that survived
any number of faults must end with exactly the weights of one plain fault-free run:
:func:`run_reference` makes that run (the benchmarks once per benchmark, the tests
once per session, ``tests/reference_weights.py``) and :func:`weights_match` compares
with ``torch.equal``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from lazarus.domain.ports import free_port

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_ddp.py"
WORLD_SIZE = 2
REFERENCE_ATTEMPT_S = 600.0
"""One try of the reference run; then another port (:class:`ReferenceStalled`).
Generous: on a saturated 2-core machine (load 30) four reference ranks got 3% of a
core each and 120 steps did not finish in 300 s."""

REFERENCE_PORT_TRIES = 3
"""A free port is free when asked, not when rank 0 binds it: another process on a busy
machine (a parallel test, a dev server) may take it in between (EADDRINUSE)."""


def run_reference(workdir: Path, steps: int, world_size: int = WORLD_SIZE) -> Path:
    """Run the example straight through with plain processes (no Lazarus, no sleeps)
    and return its final weights: what every benchmark job must end with. A port
    taken between :func:`free_port` and rank 0's bind is retried on another port."""
    for attempt in range(REFERENCE_PORT_TRIES):
        try:
            return _run_reference_once(workdir, steps, world_size)
        except (PortTaken, ReferenceStalled, ReferenceAborted):
            if attempt == REFERENCE_PORT_TRIES - 1:
                raise
    raise AssertionError("unreachable")


class PortTaken(RuntimeError):
    """Rank 0 of the reference run could not bind its rendezvous port."""


class ReferenceAborted(RuntimeError):
    """A reference rank died in torch's C++ (``terminate called ...``, SIGABRT): seen
    once in a fresh clone's ``make test`` with four test workers on 2 cores, in a run
    that involves none of Lazarus's controller. Either the port race of
    :class:`PortTaken` (a rank reached another process's listener) or a crash in
    gloo's teardown; both are the rig's, not a result, so the run is made again on
    another port."""


class ReferenceStalled(RuntimeError):
    """The reference run did not finish in :data:`REFERENCE_ATTEMPT_S`. On a busy
    machine the usual cause is the port race of :class:`PortTaken` seen from the other
    side: another process took the port first, so rank 1 waits on a rendezvous that
    is not ours. Another port is the cure; waiting longer is not."""


def _run_reference_once(workdir: Path, steps: int, world_size: int) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "model.pt"
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    for rank in range(world_size):
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAZARUS_")}
        env.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "PYTHONPATH": str(REPO),
            }
        )
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(EXAMPLE),
                    "--steps",
                    str(steps),
                    "--step-time",
                    "0",
                    "--out",
                    str(out),
                    "--checkpoint-dir",
                    str(workdir / "checkpoints"),
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        )
    deadline = time.monotonic() + REFERENCE_ATTEMPT_S
    try:
        for proc in procs:
            try:
                _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired as exc:
                raise ReferenceStalled(
                    f"reference run on port {port}: no end after {REFERENCE_ATTEMPT_S:.0f} s"
                ) from exc
            if proc.returncode != 0:
                text = err.decode()[-2000:]
                if "EADDRINUSE" in text:
                    raise PortTaken(f"reference run: port {port} was taken: {text}")
                if "terminate called" in text:
                    raise ReferenceAborted(f"reference run on port {port} aborted: {text}")
                raise RuntimeError(f"reference run failed: {text}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


def weights_match(actual: Path, expected: Path) -> bool:
    """True when both state dicts hold the same tensors, bit for bit."""
    import torch

    if not actual.is_file():
        return False
    got = torch.load(actual, map_location="cpu")
    want = torch.load(expected, map_location="cpu")
    return bool(got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want))
