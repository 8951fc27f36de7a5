"""``lazarus report`` on a real finished job with one crash: a PNG of real size, a
self-contained page, and data behind the plot with exactly one incident band in the
four recovery phases; still there once no worker is left to answer queries."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from infra import chaos
from lazarus.app.local_stack import LocalStack
from lazarus.app.report import RECOVERY_PHASES
from tests.e2e.conftest import Job, ddp_spec
from workflows.state import Phase

StartJob = Callable[..., Awaitable[Job]]


async def lazarus_report(stack: LocalStack, job: str, *args: str) -> dict[str, Any]:
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "lazarus.app.cli", "report", job, "--json", *args],
        env=stack.worker_env(),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    body: dict[str, Any] = json.loads(done.stdout)
    return body


@pytest.mark.timeout(240)
async def test_report_of_a_finished_job_with_one_crash(
    start_job: StartJob, stack: LocalStack, tmp_path: Path
) -> None:
    spec = ddp_spec(
        tmp_path,
        steps=60,
        health={"report_interval_s": 1},
        checkpoints={"housekeeping_interval_s": 0, "durable_uri": str(tmp_path / "durable")},
    )
    job = await start_job(spec)
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 25)
    chaos.signal_rank(job.run_root, rank=1, sig=signal.SIGKILL)
    status = await job.result()
    assert status.phase == Phase.SUCCEEDED
    [incident] = status.incidents

    png, page = tmp_path / "out" / "report.png", tmp_path / "out" / "report.html"
    data = await lazarus_report(stack, spec.name, "--out", str(png), "--html", str(page))
    assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 20_000
    html = page.read_text()
    assert "data:image/png;base64," in html and "catching up" in html
    assert data["files"] == {"png": str(png), "html": str(page)}

    [band] = data["incidents"]
    assert band["id"] == incident.id and band["failure_class"] == incident.failure_class.value
    assert [b["phase"] for b in band["bands"]] == list(RECOVERY_PHASES)
    edges = [t for b in band["bands"] for t in (b["start_s"], b["end_s"])]
    assert edges == sorted(edges), f"phases out of order: {band['bands']}"
    assert all(b["complete"] for b in band["bands"])
    summary = data["summary"]
    assert summary["incidents"] == 1 and summary["phase"] == "SUCCEEDED"
    assert summary["steps_lost"] == status.steps_lost and summary["mttr_s"] == status.mttr_s
    assert {p["generation"] for p in data["points"]} == {1, 2}
    assert summary["local_checkpoints"] >= 1, data["checkpoints"]

    stack.kill_worker(signal.SIGKILL)  # a finished job's report needs no worker
    again = await lazarus_report(stack, spec.name)
    assert again["files"] == {"png": None, "html": None}
    assert again["incidents"] == data["incidents"] and again["points"] == data["points"]
