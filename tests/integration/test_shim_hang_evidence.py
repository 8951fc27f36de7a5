"""The shim's ``hang-evidence`` (issue 38): the node's interpreter reads a hung
generation's stacks and flight recorder where the ranks run, for ssh and Slurm nodes.

Run here through :class:`LocalShimAgent` (the ssh agent's exact code path, ``sh -s``
under dash, without a network): a SIGSTOPped process's stack, read with py-spy by
``python -m lazarus.rank.hang_evidence``, and a live rank's flight-recorder dump
(a stand-in watcher that answers the request the way the rank helper's does),
compacted on the node; the stopped rank is not waited for. Over real ssh:
tests/netns/test_ssh_hang_evidence.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.nodes.agent import HANG_EVIDENCE_TIMEOUT_S
from activities.nodes.shim_agent import LocalShimAgent
from lazarus.domain import flight_recorder as fr
from lazarus.domain.spec import NodeSpec
from lazarus.rank.hang_evidence import EvidenceTarget, evidence_lines
from lazarus.rank.rank_stacks import py_spy

pytestmark = pytest.mark.timeout(60)

DASH = "/bin/dash" if Path("/bin/dash").exists() else "/bin/sh"

STUCK = """
import time
def stuck_in_here():
    time.sleep(600)
stuck_in_here()
"""

WATCHER = """
import json, os, sys, time
gen, rank = sys.argv[1], sys.argv[2]
entries = [{"collective_seq_id": s, "profiling_name": "gloo:all_reduce",
            "process_group": ["0", "default_pg"], "pg_id": 0, "input_sizes": [[4]],
            "frames": [{"name": "f", "filename": "x.py", "line": 1}] * 20}
           for s in range(1, 7)]
open(os.path.join(gen, "flight-recorder", f"rank-{rank}.ready"), "w").close()
seen = None
while True:
    try:
        request = open(os.path.join(gen, "flight-recorder.request"), "rb").read()
    except OSError:
        request = None
    if request is not None and request != seen:
        seen = request
        target = os.path.join(gen, "flight-recorder", f"rank-{rank}.json")
        open(target + ".tmp", "w").write(json.dumps({"entries": entries}))
        os.replace(target + ".tmp", target)
    time.sleep(0.05)
"""


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _start(argv: list[str], started: list[subprocess.Popen[bytes]]) -> int:
    proc = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL)
    started.append(proc)
    return proc.pid


def test_the_shim_reads_a_stopped_ranks_stack_and_a_live_ranks_recorder(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    gen = tmp_path / "run" / "gen-00001"
    (gen / fr.DUMP_DIR).mkdir(parents=True)
    stuck = _start([sys.executable, "-c", STUCK], processes)
    live = _start([sys.executable, "-c", WATCHER, str(gen), "1"], processes)
    deadline = time.monotonic() + 20  # both have started their Python code
    while not (gen / fr.DUMP_DIR / fr.ready_name(1)).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    os.kill(stuck, signal.SIGSTOP)
    # The node's interpreter is this venv's (lazarus-rank and py-spy beside it),
    # found on the node's PATH as a spec's nodes[].env.PATH would put it.
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin:/bin"])
    node = NodeSpec(name="n1", env={"PATH": path})
    agent = LocalShimAgent(node, shell=DASH)
    targets = [EvidenceTarget(0, stuck, stopped=True), EvidenceTarget(1, live, stack=False)]
    started = time.monotonic()
    evidence = agent.hang_evidence(str(gen), targets)
    took = time.monotonic() - started
    assert took < HANG_EVIDENCE_TIMEOUT_S, took
    lines = evidence_lines([evidence])
    print("\n".join(lines), f"\n({took:.2f} s)")
    if py_spy() is not None:
        assert lines[0].startswith(f"rank 0 (pid {stuck}, stopped) stack, innermost first: ")
        assert "stuck_in_here" in lines[0] and "<module>" in lines[0], lines[0]
    else:
        assert lines[0] == "rank stacks: py-spy is not installed on node n1 (pip install py-spy)"
    assert lines[1] == (
        "flight recorder, group default_pg: gloo:all_reduce #6 [[4]] entered by rank 1 "
        f"(dumps in {gen / fr.DUMP_DIR} on node n1)"
    )
    assert len(json.dumps(evidence.dumps)) < 400  # compacted on the node: 6 entries -> 1


def test_a_node_whose_python_cannot_answer_says_so_in_one_line(tmp_path: Path) -> None:
    gen = tmp_path / "gen-00001"
    gen.mkdir()
    node = NodeSpec(name="n1", python="python-nowhere", env={"PATH": "/usr/bin:/bin"})
    evidence = LocalShimAgent(node, shell=DASH).hang_evidence(str(gen), [EvidenceTarget(0, 1)])
    assert len(evidence.stacks) == 1 and not evidence.dumps
    assert evidence.stacks[0].startswith("rank stacks on node n1: not read ("), evidence.stacks
    assert "python-nowhere" in evidence.stacks[0], evidence.stacks
