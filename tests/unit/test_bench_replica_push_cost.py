"""``python -m bench replica-push-cost`` end to end at a tiny size: a real push through
:func:`lazarus.rank.replica.push` to a receiver process, in both placements, and the
results file the simulator's figure is read from. (Its figures are the bench's to
measure, never asserted here.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the bench pins the push to a second core")
def test_the_bench_pushes_in_both_placements_and_writes_its_rows(tmp_path: Path) -> None:
    out = tmp_path / "replica-push-cost.json"
    tiny = ["--sizes-mb", "8", "--repeats", "1", "--steps", "3", "--json-out", str(out)]
    result = subprocess.run(
        [sys.executable, "-m", "bench", "replica-push-cost", *tiny],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [row["placement"] for row in rows] == ["separate", "shared"]
    for row in rows:
        (push,) = row["pushes"]
        assert push["bytes"] >= 8 << 20  # the whole snapshot travelled
        assert push["steps_during_push"] >= 1 and push["push_s"] > 0
    assert "separate cores | 8 MiB" in result.stdout
    leftovers = list(Path("/dev/shm").glob("lazarus-replica-push-cost-*"))
    assert not leftovers, leftovers
