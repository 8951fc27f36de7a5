"""The supervisor's failure notice (``activities.supervise.announce_failure``): written
on every node that answered, only for a job that rejoins and a failure that ended a
rank, and never raising. The rank side is ``tests/integration/test_step_interrupt.py``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from activities.supervise import announce_failure
from lazarus.domain.contracts import FailureKind, FailureReport, SuperviseRequest
from lazarus.domain.environment import GENERATION_FAILED_FILE
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.spec import HealthSpec

pytestmark = pytest.mark.timeout(30)


class _Node:
    def __init__(self, name: str, root: Path, broken: bool = False) -> None:
        self.node = SimpleNamespace(name=name)
        self.root, self.broken = root / name, broken

    def write_file(self, path: str, content: str) -> None:
        if self.broken:
            raise OSError("no route to host")
        target = self.root / Path(path).name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)


class _Observer:
    """Two ranks per node; ``silent`` nodes did not answer the last poll."""

    def __init__(self, nodes: list[_Node], silent: set[str], gen: Path) -> None:
        self.nodes, self.silent, self.generation_dir = nodes, silent, gen

    def answering_agent(self, rank: int) -> Any:
        node = self.nodes[rank // 2]
        return None if node.node.name in self.silent else node


def _request(rejoin: bool) -> SuperviseRequest:
    return SuperviseRequest(
        job_id="j",
        generation=3,
        run_dir="/runs/gen-00003",
        world_size=6,
        nproc_per_node=2,
        health=HealthSpec(),
        rejoin_timeout_s=45.0 if rejoin else None,
    )


def _failure(kind: FailureKind) -> FailureReport:
    return FailureReport(
        kind=kind, failure_class=FailureClass.UNKNOWN, rank=3, fault_at=1.0, detected_at=1.1
    )


def test_every_answering_node_is_told_and_a_broken_one_is_skipped(tmp_path: Path) -> None:
    nodes = [_Node("h1", tmp_path), _Node("h2", tmp_path, broken=True), _Node("h3", tmp_path)]
    observer = _Observer(nodes, silent={"h3"}, gen=Path("/runs/gen-00003"))

    written = announce_failure(_request(rejoin=True), observer, _failure("crash"))  # type: ignore[arg-type]

    assert written == ["h1"]
    assert json.loads((tmp_path / "h1" / GENERATION_FAILED_FILE).read_text()) == {
        "rank": 3,
        "kind": "crash",
    }
    assert not (tmp_path / "h3").exists()


@pytest.mark.parametrize(
    ("rejoin", "kind"), [(False, "crash"), (True, "hang"), (True, "preempted")]
)
def test_no_notice_without_rejoin_or_for_a_failure_that_left_every_rank_alive(
    tmp_path: Path, rejoin: bool, kind: FailureKind
) -> None:
    observer = _Observer([_Node("h1", tmp_path)], silent=set(), gen=Path("/runs/gen-00003"))
    assert announce_failure(_request(rejoin), observer, _failure(kind)) == []  # type: ignore[arg-type]
    assert not (tmp_path / "h1").exists()
