"""Rejoin in place, rank side (issue 16): the real 2-rank DDP example over gloo in its
``--resilient`` mode, with the test playing the controller.

The test sets each rank's environment with the launcher's own ``rank_environment``,
writes control files with the launcher's own ``request_rejoin``, and starts and kills
processes itself; no Temporal, no worker. What it pins:

- a SIGKILLed rank's peer keeps its process, waits visibly, rejoins generation 2
  beside a new rank 1 (resuming from the newest committed checkpoint of either tier),
  shows only the rejoin phases in its generation-2 heartbeat, and the final weights
  equal a fault-free run's;
- a survivor that never gets a request exits non-zero within its timeout, saying why;
- a NaN is the script's own failure: it is not mistaken for a peer's and the rank dies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from activities.launcher import initial_control_document, rank_environment
from activities.nodes.rejoin import request_rejoin
from activities.nodes.rundir import GenerationDir, read_json, write_json_atomic
from lazarus.domain import checkpoint_layout, environment, phases
from lazarus.domain.contracts import CheckpointRef
from lazarus.domain.ports import free_port
from lazarus.domain.spec import JobSpec, parse_spec
from lazarus.rank import REJOIN_TIMEOUT_EXIT_CODE
from tests import tiers

torch = pytest.importorskip("torch")

REPO_ROOT = Path(__file__).resolve().parents[2]
TRAIN_DDP = REPO_ROOT / "examples" / "train_ddp.py"
STEPS = 50
KILL_AFTER_STEP = 15
SEED = "7"


def _script_args(out: Path, step_time: float) -> list[str]:
    return [
        "--steps",
        str(STEPS),
        "--ckpt-every",
        "10",
        "--step-time",
        str(step_time),
        "--seed",
        SEED,
        "--pg-timeout-s",
        "60",
        "--out",
        str(out),
    ]


@dataclass
class Rank:
    rank: int
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Controller:
    """Plays the controller's part for one job: generation directories, control
    files and rank environments, all built by the launcher's own functions."""

    spec: JobSpec
    run_root: Path
    memory_dir: Path
    started: list[Rank]

    def generation(self, number: int) -> GenerationDir:
        gen = GenerationDir.of(self.run_root, number)
        gen.path.mkdir(parents=True, exist_ok=True)
        if not gen.control_file.exists():
            write_json_atomic(gen.control_file, initial_control_document(self.spec))
        return gen

    def environment(
        self, gen: GenerationDir, rank: int, port: int, resume: CheckpointRef | None
    ) -> dict[str, str]:
        worker = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("LAZARUS_", "TORCHELASTIC_"))
        }
        worker.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        env = rank_environment(self.spec, self.spec.nodes, 0, gen, rank, port, resume, worker)
        # The launcher's memory tier lives in /dev/shm; this test keeps it in tmp_path.
        env[environment.MEMORY_CHECKPOINT_DIR] = str(self.memory_dir)
        return env

    def start(self, gen: GenerationDir, rank: int, env: Mapping[str, str], args: list[str]) -> Rank:
        log = gen.path / f"rank-{rank}.log"
        with open(log, "wb") as handle:
            process = subprocess.Popen(
                [sys.executable, str(TRAIN_DDP), *args],
                cwd=REPO_ROOT,
                env=dict(env),
                stdout=handle,
                stderr=subprocess.STDOUT,
            )
        started = Rank(rank, process, log)
        self.started.append(started)
        return started

    def logs(self) -> str:
        return "\n".join(
            f"--- rank {r.rank} (pid {r.process.pid}, {r.log.parent.name})\n{r.output()[-4000:]}"
            for r in self.started
        )


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    spec = parse_spec(
        {
            "name": "rejoin-rank",
            "command": [sys.executable, str(TRAIN_DDP)],
            "nproc_per_node": 2,
            "checkpoint_dir": "ckpt",
            "checkpoints": {"memory_every_steps": 3},
            "rejoin": {"timeout_s": 60},
        },
        "<test>",
    ).resolved(tmp_path)
    run_root = Path(spec.run_dir) / spec.job_id / "run-test"
    started: list[Rank] = []
    try:
        yield Controller(spec, run_root, tmp_path / "shm", started)
    finally:
        for rank in started:
            if rank.process.poll() is None:
                rank.process.kill()
            rank.process.wait()


def _wait_for(
    condition: Callable[[], bool], timeout_s: float, what: str, controller: Controller
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}\n{controller.logs()}")
        time.sleep(0.05)


def _heartbeat(gen: GenerationDir, rank: int) -> dict[str, Any]:
    return read_json(gen.heartbeat_file(rank)) or {}


def _wait_exit(rank: Rank, timeout_s: float, controller: Controller) -> int:
    try:
        return rank.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"rank {rank.rank} still runs after {timeout_s} s\n{controller.logs()}")


def _newest_committed(*roots: Path) -> CheckpointRef:
    found = [
        (step, path) for root in roots for step, path in checkpoint_layout.committed_steps(root)
    ]
    assert found, f"no committed checkpoint in {roots}"
    step, path = max(found)
    return CheckpointRef(step=step, path=str(path))


def _reference_weights(tmp_path: Path) -> dict[str, Any]:
    """A fault-free 2-rank run of the plain example (no Lazarus variables at all)."""
    out = tmp_path / "reference" / "final.pt"
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("LAZARUS_", "TORCHELASTIC_"))
    }
    port = str(free_port())
    processes = []
    try:
        for rank in (0, 1):
            rank_env = {
                **env,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "OMP_NUM_THREADS": "1",
                "PYTHONWARNINGS": "ignore",
            }
            args = [*_script_args(out, 0.0), "--checkpoint-dir", str(tmp_path / "reference")]
            processes.append(
                subprocess.Popen(
                    [sys.executable, str(TRAIN_DDP), *args],
                    cwd=REPO_ROOT,
                    env=rank_env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        for process in processes:
            assert process.wait(timeout=180) == 0
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
    weights: dict[str, Any] = torch.load(out, weights_only=True)
    return weights


@tiers.twin_of(
    "tests/e2e/test_rejoin_e2e.py::test_a_killed_rank_is_replaced_and_the_survivor_keeps_its_process",
    "without the workflow (the test writes the request the launcher writes)",
)
@pytest.mark.timeout(420)
def test_a_survivor_rejoins_in_place_and_the_weights_match_a_fault_free_run(
    tmp_path: Path, controller: Controller
) -> None:
    out = tmp_path / "final.pt"
    args = [*_script_args(out, 0.1), "--resilient"]
    gen1 = controller.generation(1)
    port1 = free_port()
    rank0 = controller.start(gen1, 0, controller.environment(gen1, 0, port1, None), args)
    rank1 = controller.start(gen1, 1, controller.environment(gen1, 1, port1, None), args)
    _wait_for(
        lambda: _heartbeat(gen1, 1).get("step", 0) >= KILL_AFTER_STEP,
        180,
        f"rank 1 to complete step {KILL_AFTER_STEP}",
        controller,
    )
    rank1.process.send_signal(signal.SIGKILL)
    _wait_exit(rank1, 30, controller)
    _wait_for(
        lambda: _heartbeat(gen1, 0).get(environment.HEARTBEAT_REJOIN) == "waiting",
        60,
        "rank 0 to say it waits to rejoin",
        controller,
    )
    waiting = _heartbeat(gen1, 0)
    assert waiting["pid"] == rank0.process.pid
    assert waiting[environment.HEARTBEAT_GENERATION] == 1
    assert phases.TORN_DOWN in waiting[phases.HEARTBEAT_FIELD]
    assert waiting["step"] < STEPS

    # The controller's part: generation 2 resumes from the newest committed checkpoint
    # of either tier; the survivor is asked to rejoin, rank 1 starts afresh.
    resume = _newest_committed(Path(controller.spec.checkpoint_dir), controller.memory_dir)
    assert 0 < resume.step < STEPS
    gen2 = controller.generation(2)
    port2 = free_port()
    env0 = controller.environment(gen2, 0, port2, resume)
    request_rejoin(gen1, 2, {0: env0})
    replacement = controller.start(gen2, 1, controller.environment(gen2, 1, port2, resume), args)

    assert _wait_exit(rank0, 240, controller) == 0, controller.logs()
    assert _wait_exit(replacement, 60, controller) == 0, controller.logs()

    beat = _heartbeat(gen2, 0)
    assert beat["pid"] == rank0.process.pid  # the same process, now in generation 2
    assert beat[environment.HEARTBEAT_GENERATION] == 2
    assert beat["step"] == STEPS
    assert environment.HEARTBEAT_REJOIN not in beat
    marks = beat[phases.HEARTBEAT_FIELD]
    assert set(marks) == set(phases.REJOIN_PHASES), marks
    times = [marks[name] for name in phases.REJOIN_PHASES]
    assert times == sorted(times), marks
    assert _heartbeat(gen2, 1)[environment.HEARTBEAT_GENERATION] == 2
    output = rank0.output()
    assert f"lazarus.rank: rank 0 rejoined generation 2 at step {resume.step} (" in output
    assert f"resumed from step {resume.step}" in replacement.output()
    manifest = json.loads(
        (
            Path(controller.spec.checkpoint_dir) / "step-00000050" / checkpoint_layout.MANIFEST
        ).read_text()
    )
    assert manifest["generation"] == 2

    expected = _reference_weights(tmp_path)
    actual = torch.load(out, weights_only=True)
    assert expected.keys() == actual.keys()
    for name, tensor in expected.items():
        assert torch.equal(tensor, actual[name]), f"{name} differs after the rejoin"


@pytest.mark.timeout(330)
def test_a_survivor_without_a_rejoin_request_exits_within_its_timeout(
    tmp_path: Path, controller: Controller
) -> None:
    rejoin_timeout_s = 3.0
    args = [*_script_args(tmp_path / "final.pt", 0.1), "--resilient"]
    gen1 = controller.generation(1)
    port = free_port()
    envs = [controller.environment(gen1, rank, port, None) for rank in (0, 1)]
    for env in envs:
        env[environment.REJOIN_TIMEOUT_S] = str(rejoin_timeout_s)
    rank0 = controller.start(gen1, 0, envs[0], args)
    rank1 = controller.start(gen1, 1, envs[1], args)
    _wait_for(lambda: _heartbeat(gen1, 1).get("step", 0) >= 3, 180, "rank 1 to train", controller)
    rank1.process.send_signal(signal.SIGKILL)
    _wait_exit(rank1, 30, controller)
    # Within the process group's 60 s collective timeout, the latest a survivor can
    # learn of its peer's death, plus a loaded machine's slack (60 s flat failed once).
    _wait_for(
        lambda: _heartbeat(gen1, 0).get(environment.HEARTBEAT_REJOIN) == "waiting",
        120,
        "rank 0 to wait",
        controller,
    )
    waiting_since = time.monotonic()
    assert _wait_exit(rank0, 60, controller) == REJOIN_TIMEOUT_EXIT_CODE
    # Its timeout, plus the interpreter's slack on a busy machine: never the 60 s
    # a forgotten survivor would otherwise add.
    assert time.monotonic() - waiting_since < rejoin_timeout_s + 30
    assert (
        f"lazarus.rank: rank 0 of generation 1 got no rejoin request within "
        f"{rejoin_timeout_s:g} s" in rank0.output()
    )


@pytest.mark.timeout(180)
def test_a_nan_is_not_taken_for_a_peer_failure(tmp_path: Path, controller: Controller) -> None:
    args = [
        *_script_args(tmp_path / "final.pt", 0.0),
        "--resilient",
        "--nan-at-step",
        "4",
    ]
    gen1 = controller.generation(1)
    port = free_port()
    env = controller.environment(gen1, 0, port, None)
    env.update({environment.WORLD_SIZE: "1", environment.LOCAL_WORLD_SIZE: "1"})
    assert env[environment.REJOIN_TIMEOUT_S]  # the rank could rejoin, and must not
    rank0 = controller.start(gen1, 0, env, args)
    assert _wait_exit(rank0, 150, controller) == 1
    output = rank0.output()
    assert "FloatingPointError: loss is nan at step 4" in output
    assert "tearing down to rejoin" not in output
    assert environment.HEARTBEAT_REJOIN not in _heartbeat(gen1, 0)
