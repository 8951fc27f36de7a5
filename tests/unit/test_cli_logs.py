"""``lazarus logs`` (issue 39) without a server: which generation ``--previous`` and
``--generation`` name, ``--since`` and line times, reading by offset (a log bigger
than a read chunk, ``--tail`` from the end), and a past generation's rank found on
another node than today's."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from lazarus.app import cli_logs
from lazarus.domain.spec import parse_spec
from workflows.state import Incident, JobStatus, NodePool, RankStatus


def _status(tmp_path: Path, generation: int, incidents: list[tuple[int, str]]) -> JobStatus:
    return JobStatus(
        job_id="demo",
        phase="RUNNING",
        generation=generation,
        step=None,
        world_size=2,
        ranks=[RankStatus(rank=r, node=n, pid=1, alive=True) for r, n in ((0, "a"), (1, "b"))],
        restarts=len(incidents),
        max_restarts=5,
        incidents=[
            Incident(
                id=i,
                generation=g,
                kind=kind,  # type: ignore[arg-type]
                failure_class="unknown",
                rank=0,
                node="c",
                exit_code=3,
                fault_at=0.0,
                detected_at=0.0,
                detection_s=0.0,
            )
            for i, (g, kind) in enumerate(incidents, 1)
        ],
        ettr=None,
        elapsed_s=1.0,
        run_dir=str(tmp_path / "run"),
        nodes=NodePool(active=["a", "b"]),
    )


def test_previous_is_the_newest_generation_that_ended_in_a_failure(tmp_path: Path) -> None:
    status = _status(tmp_path, 5, [(1, "crash"), (3, "hang"), (4, "operator")])
    assert cli_logs.pick_generation(status, None, False) == 5
    assert cli_logs.pick_generation(status, None, True) == 3  # not 4: a forced recovery
    assert cli_logs.pick_generation(status, 2, False) == 2
    note = cli_logs.previous_note(status, 3)
    assert note == "generation 3 of job 'demo': ended in a hang of rank 0 (exit 3) on node c"
    with pytest.raises(cli_logs.LogsProblem, match="generations 1 to 5") as bad:
        cli_logs.pick_generation(status, 6, False)
    assert bad.value.bad_input
    with pytest.raises(cli_logs.LogsProblem, match="give one"):
        cli_logs.pick_generation(status, 2, True)
    calm = _status(tmp_path, 2, [(1, "operator")])
    with pytest.raises(cli_logs.LogsProblem, match="no generation of job 'demo' ended in a fail"):
        cli_logs.pick_generation(calm, None, True)


def test_line_times_and_since() -> None:
    at = datetime(2026, 12, 7, 10, 0, 0, 250000, tzinfo=UTC).timestamp()
    assert cli_logs.line_time("2026-12-07T10:00:00.25Z step 1") == at
    assert cli_logs.line_time("[2026-12-07 11:00:00,250+01:00] INFO x") == at
    assert cli_logs.line_time("2026-12-07 10:00:00,250 INFO x") == (
        datetime(2026, 12, 7, 10, 0, 0, 250000).astimezone().timestamp()
    )
    assert cli_logs.line_time("step 1 at 2026-12-07 10:00:00") is None
    assert cli_logs.line_time("2026-12-07 10:00:0012") is None
    assert cli_logs.parse_since("1h30m", now=10_000.0) == 10_000.0 - 5400
    assert cli_logs.parse_since("90s", now=100.0) == 10.0
    assert cli_logs.parse_since("2026-12-07T10:00:00.25Z") == at
    with pytest.raises(cli_logs.LogsProblem, match="give a duration") as bad:
        cli_logs.parse_since("yesterday")
    assert bad.value.bad_input


def test_since_drops_only_the_lines_known_to_be_older() -> None:
    keep = cli_logs.SinceFilter(100.0)
    got: list[bytes] = []
    for line, stamp in [
        (b"untimed 1", None),  # before an older line: older
        (b"old", 50.0),
        (b"untimed 2", None),  # before a newer line: shown
        (b"new", 150.0),
        (b"untimed 3", None),  # after a newer line: newer
    ]:
        got += [kept for kept, _ in keep.feed(line, stamp)]
    assert got == [b"untimed 2", b"new", b"untimed 3"]
    tail = cli_logs.SinceFilter(100.0)
    assert tail.feed(b"old", 50.0) == [] and tail.feed(b"untimed", None) == []
    assert tail.flush() == [(b"untimed", None)]  # the file was written since: shown
    assert cli_logs.older_than(cli_logs.Chunk(b"", 3, 98.0), 100.0)
    assert not cli_logs.older_than(cli_logs.Chunk(b"", 3, 99.5), 100.0)


class FakeAgent:
    """A remote node holding some generation-1 logs (by rank), read by offset."""

    def __init__(self, files: dict[int, bytes]) -> None:
        self.files = files
        self.reads = 0

    def log_read(self, gen_dir: str, rank: int, offset: int, max_bytes: int) -> Any:
        self.reads += 1
        data = self.files.get(rank)
        if data is None:
            return cli_logs.Chunk()
        return cli_logs.Chunk(data[offset : offset + max_bytes], len(data), 1.0)

    def close(self) -> None:
        pass


def _ssh_spec(tmp_path: Path) -> Any:
    nodes = [{"name": n, "launcher": "ssh", "host": f"10.0.0.{i}"} for i, n in enumerate("abc")]
    data = {
        "name": "demo",
        "command": ["python", "train.py"],
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "nodes": nodes[:2],
        "spares": nodes[2:],
    }
    return parse_spec(data, "<test>").resolved(tmp_path)


def test_a_past_generation_is_read_whole_from_whichever_node_ran_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Generation 1's rank 0 crashed on c (since replaced); rank 1 ran on a, not on
    today's b: without a readable plan.json, each is found by asking the nodes."""
    monkeypatch.setattr(cli_logs, "READ_CHUNK_BYTES", 64)
    big = b"".join(b"line %04d of rank 1\n" % i for i in range(100))  # 2,000 bytes
    agents = {"a": FakeAgent({1: big}), "b": FakeAgent({}), "c": FakeAgent({0: b"boom\n"})}
    from activities import node_logs  # the worker's reader, here in this process

    monkeypatch.setattr(node_logs, "agent_for", lambda node, ssh, slurm=None: agents[node.name])
    remote = node_logs.AgentLogs()
    spec = _ssh_spec(tmp_path)
    status = _status(tmp_path, 2, [(1, "crash")])
    logs = cli_logs.rank_logs(status, spec, None, cli_logs.pick_generation(status, None, True))
    assert [(log.rank, log.node) for log in logs] == [(0, "c"), (1, "b")]
    assert cli_logs.show(logs, spec, None, False, as_json=True, remote=remote) == []
    documents = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert documents[0] == {"generation": 1, "rank": 0, "node": "c", "line": "boom", "time": None}
    assert [d["line"] for d in documents[1:]] == big.decode().splitlines()
    assert {d["node"] for d in documents[1:]} == {"a"}
    reads = agents["a"].reads
    assert cli_logs.show(logs[1:], spec, 2, False, remote=remote) == []
    assert capsys.readouterr().out == "line 0098 of rank 1\nline 0099 of rank 1\n"
    assert agents["a"].reads - reads <= 4, "a tail reads from the end, not the whole log"
    missing = cli_logs.rank_logs(status, spec, None, 1)
    agents["c"].files.clear()
    [problem] = cli_logs.show(missing[:1], spec, None, False, remote=remote)
    assert "no log at" in problem and "on node c, a, b" in problem
