"""Issue 12 §3, with real processes: the stop of a crashed generation's survivors
kills at once, a node declared dead is never contacted, and a launch says when its
last rank's process started (§1, "rank process started")."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities import stop as stop_module
from activities.launcher import launch_generation
from activities.nodes.factory import agents as real_agents
from activities.nodes.procfs import is_alive
from activities.nodes.rundir import GenerationDir, read_json
from activities.stop import stop_generations
from lazarus.domain.contracts import LaunchRequest, LaunchResult, NodeAccess, StopRequest
from lazarus.domain.spec import JobSpec, NodeSpec, SSHSpec, parse_spec

JOB = "faststop"
STUBBORN = """\
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a survivor stuck in a collective
open(sys.argv[1] + "/ready-" + os.environ["RANK"], "w").close()
time.sleep(300)
"""


@pytest.fixture
def spec(tmp_path: Path) -> Iterator[JobSpec]:
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    spec = parse_spec(
        {
            "name": JOB,
            "command": [sys.executable, str(script), str(tmp_path)],
            "nproc_per_node": 1,
            "checkpoint_dir": "ckpt",
        },
        "<test>",
    ).resolved(tmp_path)
    yield spec
    # Whatever a failed assertion left behind.
    asyncio.run(
        stop_generations(
            StopRequest(job_id=JOB, run_root=str(Path(spec.run_dir) / JOB), kill_at_once=True)
        )
    )


def wait_ready(tmp_path: Path, ranks: int) -> None:
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{r}").exists() for r in range(ranks)):
        assert time.monotonic() < deadline, "the ranks never installed their SIGTERM handler"
        time.sleep(0.05)


def alive(result: LaunchResult) -> list[bool]:
    return [is_alive(r.pid, r.start_ticks) for r in result.ranks]


@pytest.mark.timeout(120)
def test_kill_at_once_does_not_wait_out_the_grace(spec: JobSpec, tmp_path: Path) -> None:
    root = str(Path(spec.run_dir) / JOB / "run-1")
    launched = launch_generation(LaunchRequest(spec=spec, generation=1, run_root=root))
    wait_ready(tmp_path, 1)
    grace_s = 90.0
    started = time.monotonic()
    result = asyncio.run(
        stop_generations(StopRequest(job_id=JOB, run_root=root, grace_s=grace_s, kill_at_once=True))
    )
    took = time.monotonic() - started
    assert took < grace_s / 3, f"the stop waited {took:.1f} s: the grace was not skipped"
    assert result.killed_groups == 1 and result.generations == [1]
    assert not any(alive(launched)), "the SIGTERM-ignoring rank survived"
    assert GenerationDir(Path(launched.run_dir)).stopped_file.exists()


@pytest.mark.timeout(120)
def test_a_node_declared_dead_is_not_contacted(
    spec: JobSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(Path(spec.run_dir) / JOB / "run-1")
    a = NodeSpec(name="a")
    # An ssh node nobody answers for: contacting it would cost the connect timeout.
    dead = NodeSpec(name="dead", launcher="ssh", host="127.0.0.1", port=9)
    launched = launch_generation(LaunchRequest(spec=spec, generation=1, nodes=[a], run_root=root))
    wait_ready(tmp_path, 1)
    opened: list[str] = []

    @contextlib.contextmanager
    def recording(access: NodeAccess) -> Iterator[object]:
        opened.extend(n.name for n in access.nodes)
        with real_agents(access) as found:
            yield found

    monkeypatch.setattr(stop_module, "agents", recording)
    result = asyncio.run(
        stop_generations(
            StopRequest(
                job_id=JOB,
                run_root=root,
                access=NodeAccess(
                    nodes=[a, dead],
                    ssh=SSHSpec(connect_timeout_s=30, known_hosts=str(tmp_path / "known_hosts")),
                ),
                kill_at_once=True,
                skip_nodes=["dead"],
            )
        )
    )
    assert opened == ["a"], "the dead node was contacted"
    assert result.unreachable == ["dead"]
    assert not any(alive(launched)), "the live node's rank was not stopped"


@pytest.mark.timeout(120)
def test_a_launch_says_when_its_last_rank_started(tmp_path: Path) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    spec = parse_spec(
        {
            "name": JOB,
            "command": [sys.executable, str(script), str(tmp_path)],
            "nproc_per_node": 2,
            "checkpoint_dir": "ckpt",
        },
        "<test>",
    ).resolved(tmp_path)
    root = str(Path(spec.run_dir) / JOB / "run-1")
    try:
        before = time.time()
        first = launch_generation(LaunchRequest(spec=spec, generation=1, run_root=root))
        gen = GenerationDir(Path(first.run_dir))
        pid_times = [read_json(gen.pid_file(r.rank)) for r in first.ranks]
        expected = max(float(p["started_at"]) for p in pid_times if p is not None)
        assert first.ranks_started_at == expected
        assert before <= expected <= first.launched_at
        # A retried launch adopts the generation and reports the same time.
        again = launch_generation(LaunchRequest(spec=spec, generation=1, run_root=root))
        assert again.adopted and again.ranks_started_at == expected
    finally:
        asyncio.run(stop_generations(StopRequest(job_id=JOB, run_root=root, kill_at_once=True)))
