"""A survivor busy in its own work leaves its step once the controller asks it to
rejoin (lazarus.rank.step_interrupt), rank side, with the test playing the controller.

One real rank under ``run_resilient`` over gloo: its first generation's step sleeps
for ten minutes (a long forward pass, far from any collective). The test writes a
rejoin request with the launcher's own ``request_rejoin``; the rank cuts the sleep
short, tears down, rejoins generation 2 in the same process and finishes. Without the
interrupt it would sleep out its step first: the test's timeout is a fraction of it.
The supervisor's failure notice cuts it short the same way, before any request.
With ``interrupt=False`` the script keeps its step (it would leave at its next
heartbeat), and the request is left to that.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from activities.launcher import initial_control_document, rank_environment
from activities.nodes.rejoin import request_rejoin
from activities.nodes.rundir import GenerationDir, read_json, write_json_atomic
from lazarus.domain import environment
from lazarus.domain.ports import free_port
from lazarus.domain.spec import JobSpec, parse_spec

pytest.importorskip("torch")

REPO_ROOT = Path(__file__).resolve().parents[2]
LONG_STEP_S = 600

SCRIPT = f"""
import os, sys, time
from datetime import timedelta
import lazarus.rank as lazarus_rank
import lazarus.rank.torch as lazarus_torch

def train(start_step, state):
    if os.environ["LAZARUS_GENERATION"] == "1":
        lazarus_rank.heartbeat(1)
        print("in the long step", flush=True)
        time.sleep({LONG_STEP_S})
        print("the long step ended", flush=True)
    else:
        print("generation", os.environ["LAZARUS_GENERATION"], "trains", flush=True)

lazarus_torch.run_resilient(
    train, dict, backend="gloo", timeout=timedelta(seconds=60),
    interrupt=sys.argv[1] == "on",
)
print("finished", flush=True)
"""


def _spec(tmp_path: Path) -> JobSpec:
    return parse_spec(
        {
            "name": "step-interrupt",
            "command": [sys.executable, "train.py"],
            "nproc_per_node": 1,
            "rejoin": {"timeout_s": 60},
        },
        "<test>",
    ).resolved(tmp_path)


def _environment(spec: JobSpec, gen: GenerationDir, port: int) -> dict[str, str]:
    worker = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("LAZARUS_", "TORCHELASTIC_"))
    }
    worker.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return rank_environment(spec, spec.nodes, 0, gen, 0, port, None, worker)


def _generation(spec: JobSpec, run_root: Path, number: int) -> GenerationDir:
    gen = GenerationDir.of(run_root, number)
    gen.path.mkdir(parents=True, exist_ok=True)
    write_json_atomic(gen.control_file, initial_control_document(spec))
    return gen


def _wait_for_line(
    log: Path, line: str, process: subprocess.Popen[bytes], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while line not in log.read_text(errors="replace"):
        assert process.poll() is None, log.read_text(errors="replace")
        assert time.monotonic() < deadline, f"no {line!r}:\n{log.read_text(errors='replace')}"
        time.sleep(0.05)


def _start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[bytes], Path, JobSpec, Path]:
    spec = _spec(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    run_root = Path(spec.run_dir) / spec.job_id / "run-test"
    gen1 = _generation(spec, run_root, 1)
    log = tmp_path / f"rank-{mode}.log"
    with open(log, "wb") as handle:
        process = subprocess.Popen(
            [sys.executable, str(tmp_path / "train.py"), mode],
            cwd=REPO_ROOT,
            env=_environment(spec, gen1, free_port()),
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    return process, log, spec, run_root


@pytest.mark.timeout(240)
def test_a_rejoin_request_cuts_the_survivors_step_short(tmp_path: Path) -> None:
    process, log, spec, run_root = _start(tmp_path, "on")
    try:
        _wait_for_line(log, "in the long step", process, 120)
        gen1 = GenerationDir.of(run_root, 1)
        gen2 = _generation(spec, run_root, 2)
        request_rejoin(gen1, 2, {0: _environment(spec, gen2, free_port())})
        # A tenth of the step: the rank left it rather than sleeping it out.
        assert process.wait(timeout=LONG_STEP_S / 10) == 0, log.read_text()
    finally:
        process.kill()
        process.wait()
    output = log.read_text()
    assert "is asked to rejoin generation 2; cutting its step short" in output
    assert "the long step ended" not in output
    assert "lazarus.rank: rank 0 rejoined generation 2 at step 0" in output
    assert "generation 2 trains" in output and "finished" in output
    beat = read_json(GenerationDir.of(run_root, 2).heartbeat_file(0)) or {}
    assert beat.get(environment.HEARTBEAT_GENERATION) == 2 and beat["pid"] == process.pid


@pytest.mark.timeout(240)
def test_the_supervisors_failure_notice_cuts_the_step_before_any_request(tmp_path: Path) -> None:
    """The notice (``failed.json`` beside the control file) comes before the request:
    the rank leaves its step and tears down at once, then waits for the request."""
    process, log, spec, run_root = _start(tmp_path, "on")
    try:
        _wait_for_line(log, "in the long step", process, 120)
        gen1 = GenerationDir.of(run_root, 1)
        write_json_atomic(gen1.failed_file, {"rank": 1, "kind": "crash"})
        _wait_for_line(log, "tearing down to rejoin", process, LONG_STEP_S / 10)
        gen2 = _generation(spec, run_root, 2)
        request_rejoin(gen1, 2, {0: _environment(spec, gen2, free_port())})
        assert process.wait(timeout=LONG_STEP_S / 10) == 0, log.read_text()
    finally:
        process.kill()
        process.wait()
    output = log.read_text()
    assert "is told a rank of generation 1 ended; cutting its step short" in output
    assert "the long step ended" not in output
    assert "lazarus.rank: rank 0 rejoined generation 2 at step 0" in output


@pytest.mark.timeout(240)
def test_without_interrupt_the_step_is_not_cut(tmp_path: Path) -> None:
    process, log, spec, run_root = _start(tmp_path, "off")
    try:
        _wait_for_line(log, "in the long step", process, 120)
        gen2 = _generation(spec, run_root, 2)
        request_rejoin(GenerationDir.of(run_root, 1), 2, {0: _environment(spec, gen2, free_port())})
        time.sleep(3.0)  # 60 times the watch's interval: it would have cut the step by now
        assert process.poll() is None
        assert "cutting its step short" not in log.read_text()
    finally:
        process.kill()
        process.wait()
