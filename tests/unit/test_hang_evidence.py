"""A hang's evidence read on each node and merged for the incident (issue 38): the
dumps are cut to what the summary reads before they leave a node, the answers of
several nodes make one summary (a rank that never joined is named across nodes), a
node's answer is bounded, and a node without py-spy says so in one line. The real
shim verb on a stopped process: tests/integration/test_shim_hang_evidence.py; over
real ssh: tests/netns/test_ssh_hang_evidence.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lazarus.domain.flight_recorder import summarize
from lazarus.rank import hang_evidence, rank_stacks
from lazarus.rank.hang_evidence import (
    MAX_GROUP_ENTRIES,
    EvidenceTarget,
    HangEvidence,
    compact,
    evidence_lines,
    request_json,
    run,
)
from lazarus.rank.rank_stacks import MAX_LINE_CHARS


def _dump(*seqs: int, group: str = "default_pg") -> dict[str, object]:
    return {
        "version": "2.10",
        "entries": [
            {
                "collective_seq_id": seq,
                "profiling_name": "gloo:all_reduce",
                "process_group": ["0", group],
                "pg_id": 0,
                "input_sizes": [[4]],
                "state": "scheduled",
                "frames": [{"name": "f", "filename": "a.py", "line": 1}] * 50,
            }
            for seq in seqs
        ],
    }


def test_a_compacted_dump_says_what_the_whole_one_says() -> None:
    dumps: dict[int, dict[str, object] | str | None] = {0: _dump(*range(1, 2001)), 1: _dump(4, 5)}
    compacted: dict[int, dict[str, object] | str | None] = {
        r: compact(d) for r, d in dumps.items() if isinstance(d, dict)
    }
    assert summarize(compacted, "d") == summarize(dumps, "d")
    assert len(json.dumps(compacted[0])) < 300
    many = {"entries": [e for g in range(40) for e in _dump(g + 1, group=f"g{g}")["entries"]]}  # type: ignore[attr-defined]
    assert len(compact(many)["entries"]) == MAX_GROUP_ENTRIES  # type: ignore[arg-type]
    huge = _dump(3)
    huge["entries"][0]["input_sizes"] = [[1]] * 1000  # type: ignore[index]
    assert "input_sizes" not in compact(huge)["entries"][0]  # type: ignore[index]


def test_two_nodes_make_one_summary_the_culprits_node_first() -> None:
    h2 = HangEvidence(
        stacks=["rank 2 (pid 7, stopped) stack, innermost first: ..."],
        dumps={2: None, 3: compact(_dump(5))},
        dump_dir="/r/gen-1/flight-recorder",
        node="h2",
    )
    h1 = HangEvidence(
        stacks=["rank 0 (pid 5) stack, innermost first: ..."],
        dumps={0: compact(_dump(5, 6)), 1: compact(_dump(5, 6))},
        dump_dir="/r/gen-1/flight-recorder",
        node="h1",
        nccl=["NCCL flight recorder dumps (watchdog timeout) in /r/gen-1: nccl-trace-rank-0"],
    )
    lines = evidence_lines([h2, h1])
    assert lines[0].startswith("rank 2 (pid 7, stopped)") and lines[1].startswith("rank 0 ")
    assert lines[2] == (
        "flight recorder, group default_pg: gloo:all_reduce #6 [[4]] entered by ranks 0, 1; "
        "never joined by rank 3 (last #5); no dump from rank 2 (stopped, or stuck outside "
        "Python) (dumps in /r/gen-1/flight-recorder on nodes h2, h1)"
    )
    assert lines[3].startswith("NCCL flight recorder dumps")
    # Nobody answered: no summary (a script without the helper's process group).
    assert evidence_lines([HangEvidence(dumps={0: None}, dump_dir="d")]) == []


def test_a_nodes_answer_is_bounded() -> None:
    answer = {
        "stacks": ["x" * 10_000] * 50,
        "dumps": {"0": _dump(*range(1, 500)), "1": "y" * 10_000, "2": None, "r": {}},
        "dump_dir": "z" * 10_000,
        "nccl": ["n"] * 10,
    }
    evidence = HangEvidence.from_json(json.loads(json.dumps(answer)))
    assert len(evidence.stacks) <= rank_stacks.MAX_RANKS + 1
    assert all(len(line) <= MAX_LINE_CHARS for line in evidence.stacks)
    assert sorted(evidence.dumps) == [0, 1, 2] and len(json.dumps(evidence.dumps)) < 1000
    assert len(evidence.dump_dir) <= MAX_LINE_CHARS and len(evidence.nccl) <= 2
    with pytest.raises(ValueError):
        HangEvidence.from_json(None)


def test_a_node_without_py_spy_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rank_stacks, "py_spy", lambda: None)
    targets = [EvidenceTarget(0, 11, stopped=True), EvidenceTarget(1, 12, stack=False)]
    answer = run(request_json(str(tmp_path), targets, "node h1"))
    assert answer == {
        "hang_evidence": {
            "stacks": ["rank stacks: py-spy is not installed on node h1 (pip install py-spy)"],
            "dumps": {},  # no rank's watcher announced itself: nobody asked, nobody waited
            "dump_dir": str(tmp_path / "flight-recorder"),
            "nccl": [],
        }
    }


def test_a_bad_request_is_an_error_line_not_a_traceback(tmp_path: Path) -> None:
    assert "a bad request" in str(run("not json")["error"])
    assert "a bad request" in str(run(json.dumps({"gen_dir": "/x", "ranks": [[1]]}))["error"])
    missing = run(request_json(str(tmp_path / "gone"), [], "node h1"))
    assert "no generation directory" in str(missing["error"])
    assert hang_evidence.WAIT_S <= 1.0  # the stop waits for it
