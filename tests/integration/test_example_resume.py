"""The example job resumes bit-exactly: the property every recovery test builds on.

A 2-rank run interrupted after step 25 and resumed from its step-20 checkpoint
must end with exactly the weights of an uninterrupted run. Anything short of
``torch.equal`` would mean the checkpoint misses state (optimizer momentum, data
position) and recovery quietly changes the training result.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lazarus.domain import checkpoint_layout, environment

torch = pytest.importorskip("torch")

# The fixture ``launch_ddp`` (tests/integration/conftest.py) returns RankRun objects;
# they are not imported by name because "conftest" is ambiguous across test folders.
LaunchDDP = Callable[..., list[Any]]
RankRun = Any

STEPS = 30
CKPT_EVERY = 10
INTERRUPT_AT = 25
STEP_LINE = re.compile(r"^step (?P<step>\d+) loss (?P<loss>\S+)$")


def _common_args(out: Path) -> list[str]:
    return [
        "--steps",
        str(STEPS),
        "--ckpt-every",
        str(CKPT_EVERY),
        "--step-time",
        "0",
        "--seed",
        "7",
        "--out",
        str(out),
    ]


def _losses(run: RankRun) -> dict[int, str]:
    found = {}
    for line in run.output.splitlines():
        match = STEP_LINE.match(line)
        if match:
            found[int(match["step"])] = match["loss"]
    return found


def _assert_clean_exit(runs: list[RankRun]) -> None:
    for run in runs:
        assert run.returncode == 0, f"rank {run.rank} exited {run.returncode}:\n{run.output}"


@pytest.mark.timeout(400)  # three DDP launches, each bounded at 90 s by launch_ddp
def test_interrupted_and_resumed_run_matches_a_straight_run(
    tmp_path: Path, launch_ddp: LaunchDDP
) -> None:
    straight_dir = tmp_path / "straight"
    straight = launch_ddp(
        _common_args(straight_dir / "final.pt"),
        straight_dir / "logs",
        extra_env={environment.CHECKPOINT_DIR: str(straight_dir / "ckpt")},
        per_rank_env=lambda rank: {
            environment.HEARTBEAT_FILE: str(straight_dir / f"heartbeat-{rank}.json")
        },
    )
    _assert_clean_exit(straight)
    for run in straight:
        assert sorted(_losses(run)) == list(range(1, STEPS + 1))
        beat = json.loads((straight_dir / f"heartbeat-{run.rank}.json").read_text())
        assert beat["step"] == STEPS

    resumed_dir = tmp_path / "resumed"
    checkpoints = resumed_dir / "ckpt"
    interrupted = launch_ddp(
        [*_common_args(resumed_dir / "final.pt"), "--exit-at-step", str(INTERRUPT_AT)],
        resumed_dir / "logs-1",
        extra_env={environment.CHECKPOINT_DIR: str(checkpoints)},
    )
    _assert_clean_exit(interrupted)
    assert not (resumed_dir / "final.pt").exists()
    assert [step for step, _ in checkpoint_layout.committed_steps(checkpoints)] == [10, 20]
    for run in interrupted:
        assert max(_losses(run)) == INTERRUPT_AT

    resume_from = checkpoints / checkpoint_layout.step_dir_name(20)
    second = launch_ddp(
        _common_args(resumed_dir / "final.pt"),
        resumed_dir / "logs-2",
        extra_env={
            environment.CHECKPOINT_DIR: str(checkpoints),
            environment.JOB_ID: "resume-test",
            environment.GENERATION: "2",
            environment.RESUME_FROM: str(resume_from),
            environment.RESUME_STEP: "20",
        },
    )
    _assert_clean_exit(second)
    for run, reference in zip(second, straight, strict=True):
        assert run.lines("resumed from step") == ["resumed from step 20"]
        losses = _losses(run)
        assert sorted(losses) == list(range(21, STEPS + 1))
        # Same data and same state give the same printed loss at every step.
        assert losses == {step: loss for step, loss in _losses(reference).items() if step > 20}
    manifest = json.loads((checkpoints / "step-00000030" / checkpoint_layout.MANIFEST).read_text())
    assert (manifest["step"], manifest["generation"], manifest["world_size"]) == (30, 2, 2)

    expected = torch.load(straight_dir / "final.pt", weights_only=True)
    actual = torch.load(resumed_dir / "final.pt", weights_only=True)
    assert expected.keys() == actual.keys()
    for name, tensor in expected.items():
        assert torch.equal(tensor, actual[name]), f"{name} differs after resume"


@pytest.mark.timeout(270)  # two DDP launches, each bounded at 90 s by launch_ddp
def test_a_plain_relaunch_resumes_from_the_newest_commit(
    tmp_path: Path, launch_ddp: LaunchDDP
) -> None:
    """Outside Lazarus (e.g. a torchrun restart) no resume variables are set;
    the script must still pick up the newest committed checkpoint itself."""
    checkpoints = tmp_path / "ckpt"
    args = ["--steps", "12", "--ckpt-every", "4", "--step-time", "0"]
    first = launch_ddp(
        [*args, "--exit-at-step", "10"],
        tmp_path / "logs-1",
        extra_env={environment.CHECKPOINT_DIR: str(checkpoints)},
    )
    _assert_clean_exit(first)
    second = launch_ddp(
        [*args, "--checkpoint-dir", str(checkpoints)],
        tmp_path / "logs-2",
    )
    _assert_clean_exit(second)
    for run in second:
        assert run.lines("resumed from step") == ["resumed from step 8"]
        assert sorted(_losses(run)) == [9, 10, 11, 12]
