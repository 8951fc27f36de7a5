"""A survivor whose peer dies as the memory tier's process group forms learns of it
within the default group's timeout, not gloo's 30 minutes.

The first memory snapshot creates a gloo group of its own. ``new_group`` without a
timeout takes torch's default, 30 minutes, and its rendezvous waits that long for a
peer that never arrives. CI caught it: the survivor of a peer SIGKILLed at its first
snapshot sat there for the whole of a 120 s wait instead of tearing down to rejoin.
The group now takes the default group's timeout.

Later measured: a peer that dies while gloo connects the new group's mesh (after it
published its address) holds the survivor there for five times that timeout. So
``lazarus.rank.torch.init_process_group`` (which ``run_resilient`` uses) now creates
the group at once, beside the default group: a death during training then meets a
group that exists, and its collectives fail within milliseconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from lazarus.domain import environment
from lazarus.domain.ports import free_port

pytest.importorskip("torch")

GROUP_TIMEOUT_S = 5

_SCRIPT = textwrap.dedent(
    f"""
    import os, sys, time
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    import lazarus.rank.torch as rank_torch

    rank = int(os.environ["RANK"])
    dist.init_process_group(
        "gloo", init_method="env://", timeout=timedelta(seconds={GROUP_TIMEOUT_S})
    )
    if rank == 1:
        # Dies after the broadcast that decides the snapshot, before joining its group.
        dist.new_group = lambda *args, **kwargs: os._exit(0)
    started = time.monotonic()
    try:
        rank_torch.snapshot(1, {{"w": torch.zeros(4)}})
    except Exception as error:
        elapsed = time.monotonic() - started
        peer = rank_torch.is_peer_failure(error)
        print(f"raised after {{elapsed:.1f}} s; peer failure: {{peer}}")
        sys.exit(0)
    print("no error")
    """
)


_EAGER_SCRIPT = textwrap.dedent(
    """
    import torch.distributed as dist
    import lazarus.rank.torch as rank_torch

    rank_torch.init_process_group("gloo", init_method="env://")
    print(f"snapshot group at init: {rank_torch._snapshot_group is not None}")
    dist.destroy_process_group()
    """
)


@contextmanager
def _two_ranks(script: str, tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Ranks 0 and 1 running ``script`` with the memory tier on; killed if still
    running on exit."""
    port = free_port()
    ranks = []
    for rank in (0, 1):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": "2",
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "OMP_NUM_THREADS": "1",
            environment.MEMORY_CHECKPOINT_DIR: str(tmp_path / f"memory-{rank}"),
            environment.MEMORY_EVERY_STEPS: "1",
        }
        ranks.append(
            subprocess.Popen(
                [sys.executable, "-c", script],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        yield ranks
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.wait()


PORT_TRIES = 3
"""Runs on a port a test beside this one took first (EADDRINUSE: ``free_port`` only
finds a port free when it looks) are run again on another port."""


def _outputs(script: str, tmp_path: Path) -> list[str]:
    """Both ranks' output, ``script`` run to its end; again on a fresh port when the
    store's port was taken between ``free_port`` and the listen."""
    for attempt in range(PORT_TRIES):
        with _two_ranks(script, tmp_path / f"try-{attempt}") as ranks:
            # 30 minutes without the fix; the group's 5 s with it, plus a busy machine's slack.
            outputs = [process.communicate(timeout=180)[0] for process in ranks]
        if not any("EADDRINUSE" in output for output in outputs):
            break
    return outputs


@pytest.mark.timeout(600)
def test_a_peer_dying_as_the_snapshot_group_forms_raises_within_the_group_timeout(
    tmp_path: Path,
) -> None:
    survivor_output = _outputs(_SCRIPT, tmp_path)[0]
    assert "peer failure: True" in survivor_output, survivor_output[-3000:]


@pytest.mark.timeout(600)
def test_the_snapshot_group_forms_with_the_process_group_not_mid_training(
    tmp_path: Path,
) -> None:
    for output in _outputs(_EAGER_SCRIPT, tmp_path):
        assert "snapshot group at init: True" in output, output[-3000:]
