"""The fault x phase chaos matrix (``python -m tests.chaos``, ``tests/chaos/``) end to
end: every cell run must hold every invariant, the table and the JSON must say so, and
nothing the matrix started may outlive it.

``make test`` runs two smoke cells, each reached through a chaos point; ``make
test-all`` runs every cell that needs no SSH test hosts (``--cells local``, about 25
minutes), and the netns tier one cross-node cell (``tests/netns/test_chaos_multinode.py``);
``make test-chaos`` runs the whole matrix.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from infra import chaos
from lazarus.domain.api import SIGNAL_PAUSE, SIGNAL_RESUME
from tests import tiers
from tests.chaos.invariants import processes_mentioning
from tests.chaos.matrix import CELLS_BY_KEY, FAULTS, LOCAL, PHASES, SMOKE, absent_reason
from tests.e2e.conftest import Job, ddp_spec
from workflows.state import Phase

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def test_every_pair_is_a_cell_or_has_a_reason() -> None:
    assert len(SMOKE) >= 2
    for key, cell in CELLS_BY_KEY.items():
        assert cell.fault in FAULTS and cell.phase in PHASES, key
        assert cell.why, key
    for fault in FAULTS:
        for phase in PHASES:
            if f"{fault}@{phase}" not in CELLS_BY_KEY:
                assert absent_reason(fault, phase), (fault, phase)


CELLS = LOCAL if tiers.ALL else SMOKE[:2]
"""``make test`` runs the first two smoke cells (a rank killed inside the launch and
inside a checkpoint's commit: the two invariants nothing else reaches), ``make
test-all`` every local cell of the matrix (the smoke ones among them)."""
BACKSTOP_S = 3600 if tiers.ALL else 840


@pytest.mark.timeout(BACKSTOP_S + 60)
def test_chaos_smoke_cells_hold(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    argv = [sys.executable, "-m", "tests.chaos", "--cells", ",".join(CELLS)]
    argv += ["--json-out", str(out)]
    with subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as child:
        try:
            # A backstop only: each cell fails by itself when its job stops making
            # progress, and every phase is reached by a chaos point, not a sleep.
            stdout, stderr = child.communicate(timeout=BACKSTOP_S)
        except subprocess.TimeoutExpired:
            child.terminate()  # the benchmark then stops everything it started
            stdout, stderr = child.communicate(timeout=60)
            pytest.fail(f"the chaos smoke run timed out:\n{stderr[-4000:]}")
    assert child.returncode == 0, f"stdout:\n{stdout}\nstderr:\n{stderr[-6000:]}"
    assert f"{len(CELLS)}/{len(CELLS)} cells held" in stdout, stdout

    data = json.loads(out.read_text())
    assert data["benchmark"] == "chaos"
    assert data["held"] == len(CELLS) and data["failed"] == 0
    matrix = {f"{c['fault']}@{c['phase']}": c for c in data["matrix"]}
    assert len(matrix) == len(FAULTS) * len(PHASES)
    for key in CELLS:
        assert matrix[key]["state"] == "held", matrix[key]
    for run in data["runs"]:
        assert run["error"] is None, run["error"]
        assert run["metrics"]["held"] is True, run["details"]["violations"]
        assert run["details"]["notes"].get("faults"), run["scenario"]

    match = re.search(r"state in (\S+);", stderr)
    assert match, stderr[-2000:]
    assert not Path(match.group(1)).exists()
    assert processes_mentioning(match.group(1)) == []


@pytest.mark.timeout(180)
async def test_a_second_pause_during_a_pause_has_no_later_effect(
    start_job: Callable[..., Awaitable[Job]], tmp_path: Path
) -> None:
    job = await start_job(ddp_spec(tmp_path, steps=60, step_time=0.1))
    await asyncio.to_thread(chaos.wait_for_step, job.run_root, 10)
    await job.handle.signal(SIGNAL_PAUSE)
    await job.handle.signal(SIGNAL_PAUSE)
    await job.wait_phase(Phase.PAUSED)
    await job.handle.signal(SIGNAL_RESUME)
    # One resume undoes one pause: training starts again (a deadline on that event).
    await job.wait_phase(Phase.RUNNING, Phase.SUCCEEDED, timeout_s=90)
