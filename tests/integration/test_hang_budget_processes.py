"""The learned hang budget against real rank processes (issue 38).

Two ranks heartbeat through ``lazarus.rank`` every 0.1 s step (one write per 0.2 s,
the throttle); ``hang_timeout_s`` is 10 s and the budget's floor 0.5 s, so the
learned budget is about a second. A SIGSTOPped rank is found in well under the
timeout, and the incident carries every rank's Python stack (with py-spy installed);
a 3 s save that rank 0 declares (``lazarus.rank.slow_phase``), with rank 1
silent beside it as in the save's barrier, is not a hang.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.launcher import launch_generation
from activities.stop import stop_generations
from infra import chaos
from lazarus.domain.contracts import (
    LaunchRequest,
    StopRequest,
    SuperviseOutcome,
    SuperviseRequest,
    SupervisionProgress,
)
from lazarus.domain.spec import JobSpec, parse_spec
from lazarus.rank.rank_stacks import py_spy

HANG_S = 10.0

SCRIPT = """
import sys, time
import lazarus.rank as lz
rank = lz.info().rank
save_at, save_s, start = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
for step in range(1, 100000):
    # Both ranks step on one wall-clock schedule, as a collective would keep them.
    due = start + 0.1 * step + (save_s if step > save_at > 0 else 0.0)
    time.sleep(max(0.0, due - time.time()))
    lz.heartbeat(step)
    if step == save_at:
        print(f"rank {rank} saving at step {step}", flush=True)
        if rank == 0:
            with lz.slow_phase("checkpoint_save"):
                time.sleep(save_s)
        else:
            time.sleep(save_s)  # waits for rank 0 in its next collective: silent
"""


def _spec(tmp_path: Path, name: str, save_at: int, save_s: float) -> JobSpec:
    return parse_spec(
        {
            "name": name,
            # The ranks' first step comes 3 s from now: both have started by then.
            "command": [
                sys.executable,
                "-c",
                SCRIPT,
                str(save_at),
                str(save_s),
                str(time.time() + 3),
            ],
            "nproc_per_node": 2,
            "health": {
                "startup_timeout_s": 30.0,
                "hang_timeout_s": HANG_S,
                "poll_interval_s": 0.1,
                "hang_budget": {"mode": "learned", "floor_s": 0.5},
            },
        },
        "<test>",
    ).resolved(tmp_path)


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[list[JobSpec]]:
    started: list[JobSpec] = []
    yield started
    for spec in started:
        root = Path(spec.run_dir) / spec.job_id
        # The stop sends SIGCONT with SIGTERM: a stopped rank dies too.
        asyncio.run(
            stop_generations(StopRequest(job_id=spec.job_id, run_root=str(root), grace_s=0))
        )
        assert chaos.live_rank_processes(root) == []


def _request(spec: JobSpec, run_dir: str, report_after_s: float) -> SuperviseRequest:
    return SuperviseRequest(
        job_id=spec.job_id,
        generation=1,
        run_dir=run_dir,
        world_size=spec.world_size,
        nproc_per_node=spec.nproc_per_node,
        health=spec.health,
        report_after_s=report_after_s,
    )


def _watching() -> tuple[ActivityEnvironment, list[SupervisionProgress]]:
    env = ActivityEnvironment()
    beats: list[SupervisionProgress] = []

    def seen(*details: object) -> None:
        beats.extend(d for d in details if isinstance(d, SupervisionProgress))

    env.on_heartbeat = seen
    return env, beats


@pytest.mark.timeout(120)
def test_a_stopped_rank_is_found_in_seconds_not_at_hang_timeout(
    tmp_path: Path, jobs: list[JobSpec]
) -> None:
    from activities.supervise import supervise

    spec = _spec(tmp_path, "stopped", save_at=0, save_s=0.0)
    jobs.append(spec)
    launched = launch_generation(LaunchRequest(spec=spec, generation=1))
    env, beats = _watching()
    request = _request(spec, launched.run_dir, report_after_s=120.0)
    root = Path(spec.run_dir) / spec.job_id

    async def stop_rank_once_learned() -> float:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            budget = beats[-1].hang_budget if beats else None
            if budget is not None and budget.source == "learned":
                return chaos.signal_rank(root, rank=1, sig=signal.SIGSTOP).at
        raise AssertionError("the budget was never learned")

    async def both() -> tuple[SuperviseOutcome, float]:
        supervised = asyncio.ensure_future(env.run(supervise, request))
        stopped_at = await stop_rank_once_learned()
        return await supervised, stopped_at

    outcome, stopped_at = asyncio.run(both())
    assert outcome.kind == "failed" and outcome.failure is not None
    failure = outcome.failure
    assert failure.kind == "hang" and failure.rank == 1, failure.evidence
    assert failure.hang_budget is not None and failure.hang_budget.source == "learned"
    assert failure.hang_budget.budget_s < 3.0
    if py_spy() is not None:  # each live rank's stack, the stopped one first
        stacks = [line for line in failure.evidence if " stack, innermost first: " in line]
        assert stacks[0].startswith("rank 1 (pid "), failure.evidence
        assert "stopped" in stacks[0] and "<module>" in stacks[0], stacks[0]
        assert any(line.startswith("rank 0 (pid ") for line in stacks), failure.evidence
    detected_after = failure.detected_at - stopped_at
    assert detected_after < HANG_S / 2, f"{detected_after:.2f} s: {failure.evidence}"
    print(f"hang detected {detected_after:.2f} s after SIGSTOP; {failure.evidence[0]}")


@pytest.mark.timeout(120)
def test_a_declared_3s_save_is_no_hang_with_a_1s_budget(
    tmp_path: Path, jobs: list[JobSpec]
) -> None:
    from activities.supervise import supervise

    # Step 80 comes at about 11 s (0.1 s steps from 3 s on): the budget is learned by then.
    spec = _spec(tmp_path, "saving", save_at=80, save_s=3.0)
    jobs.append(spec)
    launched = launch_generation(LaunchRequest(spec=spec, generation=1))
    env, beats = _watching()
    outcome = asyncio.run(env.run(supervise, _request(spec, launched.run_dir, 18.0)))
    assert outcome.kind == "progress", outcome.failure and outcome.failure.evidence
    assert outcome.step is not None and outcome.step > 85
    in_phase = [b for b in beats if b.slow_phases]
    assert in_phase, "no poll saw the save's phase"
    budget = in_phase[0].hang_budget
    assert budget is not None and budget.source == "learned" and budget.budget_s < 3.0
    last = beats[-1].hang_budget
    assert last is not None and last.budget_s < 3.0, "the save was learned as the rhythm"
