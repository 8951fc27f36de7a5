"""Lazarus drains a lost Slurm node and undoes only its own drains (audit suspicion
"Slurm drain overwrites an admin's state"): a node an admin drained keeps the
admin's reason, and ``lazarus return`` does not resume it.

A fake ``scontrol`` on PATH answers ``show node`` with the state and reason the test
gives, and logs every ``update``."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from activities.nodes.local.agent import LocalAgent
from activities.nodes.slurm.agent import SlurmAgent
from activities.nodes.slurm.commands import slurmd_silent
from activities.stop import undrain_on
from activities.supervise import drain_lost_node
from lazarus.domain.contracts import FailureReport
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.spec import NodeSpec, SlurmSpec

pytestmark = pytest.mark.timeout(30)

FAKE_SCONTROL = """#!{python}
import os, sys
args = sys.argv[1:]
here = os.environ["FAKE_SCONTROL_DIR"]
if args[:2] == ["show", "node"]:
    print(open(os.path.join(here, "node")).read())
elif args[:1] == ["update"]:
    with open(os.path.join(here, "updates"), "a") as log:
        log.write(" ".join(args) + "\\n")
"""


@pytest.fixture
def scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "scontrol"
    tool.write_text(FAKE_SCONTROL.format(python=sys.executable))
    tool.chmod(0o755)
    monkeypatch.setenv("FAKE_SCONTROL_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return tmp_path


def node_is(where: Path, state: str, reason: str = "") -> None:
    line = f"NodeName=n2 Arch=x86_64 State={state} NodeAddr=n2"
    (where / "node").write_text(line + (f" Reason={reason}" if reason else ""))


def updates(where: Path) -> list[str]:
    log = where / "updates"
    return log.read_text().splitlines() if log.exists() else []


def agent() -> SlurmAgent:
    return SlurmAgent(NodeSpec(name="n2", launcher="slurm"), SlurmSpec(job_id=500))


ADMIN = "disk replacement, ask ops [admin@2026-12-03T10:00:00]"


def test_a_node_an_admin_drained_keeps_the_admins_reason(scontrol: Path) -> None:
    node_is(scontrol, "ALLOCATED+DRAIN", ADMIN)
    done = agent().drain("node_lost", "train")
    assert updates(scontrol) == []
    assert not done.drained and done.error is None
    assert "already drained by someone else" in done.evidence() and "disk replacement" in (
        done.evidence()
    )


def test_a_lost_node_nobody_drained_is_drained_with_lazarus_reason(scontrol: Path) -> None:
    node_is(scontrol, "DOWN*", "Not responding [slurm@2026-12-03T10:00:00]")
    done = agent().drain("node_lost", "train")
    assert done.drained
    assert updates(scontrol) == [
        "update nodename=n2 state=drain reason=lazarus: node_lost in train"
    ]


def test_return_resumes_only_a_node_lazarus_drained(scontrol: Path) -> None:
    node_is(scontrol, "IDLE+DRAIN", ADMIN)
    left = agent().undrain()
    assert updates(scontrol) == [] and left.left is not None and "someone else" in left.left
    node_is(scontrol, "IDLE+DRAIN", "lazarus: node_lost in train [worker@2026-12-03T10:00:00]")
    resumed = agent().undrain()
    assert resumed.error is None and updates(scontrol) == ["update nodename=n2 state=resume"]


def lost(node: str) -> FailureReport:
    return FailureReport(
        kind="node_lost",
        failure_class=FailureClass.NODE_LOST,
        rank=0,
        node=node,
        fault_at=1.0,
        detected_at=2.0,
    )


def test_the_supervisor_drains_through_the_agent_and_skips_nodes_without_a_scheduler(
    scontrol: Path,
) -> None:
    """The activities ask every agent alike: a Slurm node is drained, a local one (no
    scheduler) answers None and the failure goes on unchanged."""
    node_is(scontrol, "DOWN*", "Not responding [slurm@2026-12-03T10:00:00]")
    drained = drain_lost_node([agent()], lost("n2"), "train")
    assert drained.evidence == ["drained node n2 in Slurm: reason='lazarus: node_lost in train'"]
    local = LocalAgent(NodeSpec(name="n2"))
    assert drain_lost_node([local], lost("n2"), "train") == lost("n2")
    assert local.drain_if_lost("node_lost", "train") is None and local.undrain() is None
    undrain_on(local)  # nothing to give back, nothing asked
    assert updates(scontrol) == [
        "update nodename=n2 state=drain reason=lazarus: node_lost in train"
    ]


def test_a_node_whose_slurmd_refuses_connections_is_drained_before_slurm_says_so(
    scontrol: Path,
) -> None:
    # Slurm still calls the node ALLOCATED (it waits SlurmdTimeout), but nothing
    # listens on its slurmd port: dead, and drained (fenced) now. A listening port
    # is a live node, left alone.
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        live_port = listening.getsockname()[1]
        line = "NodeName=n2 State=ALLOCATED NodeAddr=127.0.0.1 Port={}"
        (scontrol / "node").write_text(line.format(live_port))
        assert slurmd_silent("n2") is None
        assert agent().drain_if_lost("node_lost", "train") is None
    (scontrol / "node").write_text(line.format(live_port))  # closed now: refused
    assert "does not accept connections" in (slurmd_silent("n2") or "")
    done = agent().drain_if_lost("node_lost", "train")
    assert done is not None and done.drained
    assert updates(scontrol) == [
        "update nodename=n2 state=drain reason=lazarus: node_lost in train"
    ]
