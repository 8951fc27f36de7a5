"""A running rank follows a checkpoint interval sent through its control file, without
a restart (``checkpoints.interval: auto``, issue 14): a real process using
``lazarus.rank`` (no torch) and the real ``set_checkpoint_interval`` writer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from activities.checkpoints.interval import interval_document, write_interval
from activities.nodes.rundir import GenerationDir
from lazarus.domain import checkpoint_layout, environment
from lazarus.domain.contracts import SetCheckpointIntervalRequest

pytestmark = pytest.mark.timeout(120)

REPO_ROOT = Path(__file__).resolve().parents[2]

RANK_SCRIPT = """
import time
from pathlib import Path
import lazarus.rank as lz

step = 0
while step < 100_000:
    step += 1
    time.sleep(0.01)
    lz.heartbeat(step)
    if lz.should_checkpoint(step, every=1_000_000):  # the script's own: never, here
        directory = lz.checkpoint_path(step)
        time.sleep(0.03)  # the blocking part of the save
        (directory / "state.bin").write_bytes(b"x")
        lz.commit_checkpoint(step, hash_files=False)
"""


def committed(root: Path) -> list[int]:
    return [step for step, _ in checkpoint_layout.committed_steps(root)] if root.exists() else []


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.05)


def heartbeat(path: Path) -> dict[str, object]:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}


def step_of(path: Path) -> int:
    step = heartbeat(path).get("step")
    return step if isinstance(step, int) else 0


@pytest.fixture
def rank(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], GenerationDir, Path, Path]]:
    gen = GenerationDir(tmp_path / "run" / "gen-00001")
    gen.path.mkdir(parents=True)
    gen.control_file.write_text(json.dumps({"checkpoint_request": 0}))  # as a launch does
    checkpoints = tmp_path / "checkpoints"
    beat = gen.path / "rank-0.heartbeat.json"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        environment.JOB_ID: "tuned",
        environment.RANK: "0",
        environment.WORLD_SIZE: "1",
        environment.HEARTBEAT_FILE: str(beat),
        environment.HEARTBEAT_INTERVAL: "0.05",
        environment.CONTROL_FILE: str(gen.control_file),
        environment.CHECKPOINT_DIR: str(checkpoints),
    }
    process = subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], env=env, cwd=tmp_path)
    try:
        yield process, gen, checkpoints, beat
    finally:
        process.kill()
        process.wait(timeout=30)


def send(gen: GenerationDir, every_steps: int) -> None:
    request = SetCheckpointIntervalRequest(
        job_id="tuned", run_dir=str(gen.path), checkpoint_every_steps=every_steps
    )
    assert write_interval(request) == ["local"]


def test_a_running_rank_follows_a_new_interval_without_a_restart(
    rank: tuple[subprocess.Popen[bytes], GenerationDir, Path, Path],
) -> None:
    process, gen, checkpoints, beat = rank
    wait_until(lambda: step_of(beat) >= 20, "20 steps")
    assert committed(checkpoints) == []  # the script's own interval: none yet
    send(gen, 10)
    wait_until(lambda: len(committed(checkpoints)) >= 3, "3 checkpoints every 10 steps")
    assert all(step % 10 == 0 for step in committed(checkpoints))
    wait_until(lambda: environment.HEARTBEAT_CHECKPOINT_SAVE_S in heartbeat(beat), "the save time")
    save_s = heartbeat(beat)[environment.HEARTBEAT_CHECKPOINT_SAVE_S]
    assert isinstance(save_s, float) and save_s >= 0.03
    before = set(committed(checkpoints))
    send(gen, 25)
    wait_until(
        lambda: len(set(committed(checkpoints)) - before) >= 2, "2 checkpoints every 25 steps"
    )
    newer = sorted(set(committed(checkpoints)) - before)
    # At most one save at the old interval may land while the file is replaced.
    assert all(step % 25 == 0 for step in newer[1:])
    assert process.poll() is None, "the rank kept running: no restart"
    written = json.loads(gen.control_file.read_text())
    assert written == {"checkpoint_request": 0, environment.CONTROL_CHECKPOINT_EVERY_STEPS: 25}


def test_a_pending_request_in_the_file_is_kept() -> None:
    request = SetCheckpointIntervalRequest(
        job_id="j", run_dir="/r", checkpoint_every_steps=40, memory_every_steps=1
    )
    pending = {
        "checkpoint_request": 7,
        "then": "hold",
        environment.CONTROL_CHECKPOINT_EVERY_STEPS: 9,
    }
    assert interval_document(request, pending) == {
        "checkpoint_request": 7,
        "then": "hold",
        environment.CONTROL_CHECKPOINT_EVERY_STEPS: 40,
        environment.CONTROL_MEMORY_EVERY_STEPS: 1,
    }
    older = {"checkpoint_request": 0, "then": "hold"}
    assert interval_document(request, older)["checkpoint_request"] == 0
    assert "then" not in interval_document(request, older)
    assert interval_document(request, None)["checkpoint_request"] == 0
