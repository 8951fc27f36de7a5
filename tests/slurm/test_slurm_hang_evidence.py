"""A hang's evidence read on a Slurm node (issue 38): the agent runs the shim's
``hang-evidence`` as a one-task step on the rank's node, where the node's python
(``slurm.python``, the test venv's) reads a SIGSTOPped rank's stack with py-spy. The
whole path through the supervisor is tested over ssh (tests/netns/
test_ssh_hang_evidence.py); here, that a Slurm node answers, and in time."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from activities.nodes.agent import HANG_EVIDENCE_TIMEOUT_S
from activities.nodes.rundir import GenerationDir
from infra.slurm import TestSlurm
from lazarus.domain.spec import JobSpec
from lazarus.rank.hang_evidence import EvidenceTarget, evidence_lines
from lazarus.rank.rank_stacks import py_spy
from tests.slurm.test_slurm_agent import agents_of, launch, slurm_spec, stopper, wait_for

__all__ = ["stopper"]  # the fixture, shared with the agent's tests

STUCK = """\
import os, sys, time
def stuck_in_a_slurm_step():
    open(os.path.join(sys.argv[1], "ready-" + os.environ["RANK"]), "w").close()
    time.sleep(600)
stuck_in_a_slurm_step()
"""


@pytest.mark.timeout(240)
def test_a_slurm_node_reads_its_stopped_ranks_stack(
    slurm: TestSlurm, allocation: int, tmp_path: Path, stopper: list[tuple[JobSpec, str]]
) -> None:
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    command = [sys.executable, str(script), str(tmp_path)]
    spec = slurm_spec(tmp_path, allocation, command, "slurm-hang-evidence")
    launched = launch(spec, stopper)
    wait_for("ranks ready", lambda: all((tmp_path / f"ready-{r}").exists() for r in (0, 1)), 120)
    victim = launched.ranks[1]
    os.kill(victim.pid, signal.SIGSTOP)
    agent = agents_of(spec)[1]
    gen = GenerationDir(Path(launched.run_dir))
    started = time.monotonic()
    evidence = agent.hang_evidence(str(gen.path), [EvidenceTarget(1, victim.pid, stopped=True)])
    took = time.monotonic() - started
    lines = evidence_lines([evidence])
    print("\n".join(lines), f"\n({took:.2f} s, node {agent.node.name})")
    assert took < HANG_EVIDENCE_TIMEOUT_S, took
    assert py_spy() is not None, "the test venv has py-spy (the diagnose extra)"
    assert lines[0].startswith(f"rank 1 (pid {victim.pid}, stopped) stack"), lines
    assert "stuck_in_a_slurm_step" in lines[0], lines[0]
    os.kill(victim.pid, signal.SIGCONT)  # the stop at teardown would send it too
