"""Issue 30 smoke: ``python -m bench compare --quick`` runs a peer (torchft: an
ordinary wheel, the ``peers`` extra) through ``crash`` and writes well-formed
results: its metrics, its settings and version, and the reason it gives for a
scenario it does not run.

Only the shape of the output is checked, never a timing. A run starts the dev
server and a worker, the fault-free reference, a Lighthouse and two torchrun
agents with their ranks (and torch in each, a restart included): well over 40 s on
two shared cores, so it runs in ``make test-all`` (``tests/tiers.py``). Skipped,
saying why, where torchft is not installed (``make bench-peers``).
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest

from bench.metrics import lookup
from tests import tiers
from tests.e2e.test_bench_compare_smoke import _run


def _installed(dist: str) -> bool:
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    tiers.only_in_test_all("the torchft compare smoke (about 2 minutes)"),
    pytest.mark.skipif(
        not _installed("torchft"),
        reason="torchft is not installed: `make bench-peers` installs the peers",
    ),
]


@pytest.mark.timeout(600)
def test_quick_compare_runs_crash_under_torchft(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    proc = _run(
        [
            "compare",
            "--quick",
            "--repeats",
            "1",
            "--systems",
            "torchft",
            "--scenarios",
            "crash,pause_resume",
            "--soak-minutes",
            "0",
            "--no-overhead",
            "--json-out",
            str(out),
        ],
        timeout_s=570,
    )
    assert "torchft" in proc.stdout.splitlines()[0]
    data = json.loads(out.read_text())
    settings = data["config"]["peer_settings"]["torchft"]
    assert settings["version"] == metadata.version("torchft")
    assert settings["min_replicas"] == 1 and settings["heartbeat_timeout_ms"] == 1000
    runs = {(r["scenario"], r["system"]): r for r in data["runs"]}
    crash = runs[("crash", "torchft")]
    assert crash["status"] == "ok", crash["error"]
    assert {
        "fault_step",
        "detected",
        "survivors_first_step_s",
        "recovery_outside_s",
        "steps_lost",
        "completed",
        "weights_ok",
    } <= crash["metrics"].keys()
    # The survivor goes on without the killed group: its first step after the fault.
    assert crash["metrics"]["survivors_first_step_s"] is not None
    for name in crash["metrics"]:
        lookup(name)
    paused = runs[("pause_resume", "torchft")]
    assert paused["status"] == "not_possible" and paused["note"].startswith("not possible")
