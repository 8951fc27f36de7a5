"""A job the bench abandons leaves nothing behind: the bench's own cleanup stop ends
its runs, so a zygote (warm starts) and the run's memory-tier snapshots go too.

Defect seen in issue 12's soak: its job is ended by the bench (terminated), never by
the workflow's end-of-run stop, and its zygote, a standby and a tmpfs snapshot
directory outlived ``python -m bench compare``."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import Any, cast

import pytest

from activities.nodes import zygote_client
from activities.nodes.procfs import is_alive
from activities.nodes.zygote_socket import zygote_dir
from bench.harness import BenchConfig, BenchContext
from lazarus.domain.memory_tier import memory_checkpoint_dir, on_node
from lazarus.rank.memory import secure


@pytest.mark.timeout(120)
def test_the_bench_cleanup_ends_the_run_zygote_and_memory_tier_included(tmp_path: Path) -> None:
    job_id = f"bench-cleanup-{os.getpid()}"
    job_root = tmp_path / "runs" / job_id
    run_root = job_root / "run-0001"
    (run_root / "gen-00001").mkdir(parents=True)
    zygote = zygote_dir(run_root, "local")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAZARUS_")}
    zygote_client.start_zygote(zygote, ("json",), 1, env=env)
    memory = Path(on_node(memory_checkpoint_dir(job_id, str(run_root)), os.getuid()))
    secure(memory / "step-00000001")  # where a rank would have made it: the private root
    try:
        info = zygote_client.wait_serving(zygote, 60)
        ctx = BenchContext(cast(Any, None), cast(Any, None), BenchConfig.quick(), tmp_path)
        asyncio.run(ctx.stop_ranks(job_root, job_id))
        deadline = time.monotonic() + 30
        while zygote_client.read_zygote(zygote) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert zygote_client.read_zygote(zygote) is None, "the zygote outlived the cleanup"
        assert not is_alive(info.pid, info.start_ticks)
        assert not memory.exists(), "the run's memory tier outlived the cleanup"
    finally:
        zygote_client.stop_zygote(zygote)
        shutil.rmtree(memory.parent, ignore_errors=True)
