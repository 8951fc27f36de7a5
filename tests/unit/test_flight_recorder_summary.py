"""The flight recorder's dumps read into an incident's lines (pure; issue 38)."""

from __future__ import annotations

import json

from lazarus.domain.flight_recorder import MAX_DUMP_BYTES, parse_dump, summarize


def _dump(
    *seqs: int, group: str = "default_pg", name: str = "gloo:all_reduce"
) -> dict[str, object]:
    return {
        "version": "2.10",
        "entries": [
            {
                "collective_seq_id": seq,
                "profiling_name": name,
                "process_group": ["0", group],
                "pg_id": 0,
                "input_sizes": [[4]],
                "state": "scheduled",
            }
            for seq in seqs
        ],
    }


def test_the_rank_behind_and_the_silent_one_are_named() -> None:
    lines = summarize({0: _dump(4, 5, 6), 1: _dump(4, 5), 2: _dump(5, 6), 3: None}, "/run/gen-1/fr")
    assert lines == [
        "flight recorder, group default_pg: gloo:all_reduce #6 [[4]] entered by ranks 0, 2; "
        "never joined by rank 1 (last #5); no dump from rank 3 (stopped, or stuck outside "
        "Python) (dumps in /run/gen-1/fr)"
    ]


def test_each_process_group_gets_its_line() -> None:
    lines = summarize(
        {
            0: {"entries": [*_dump(3)["entries"], *_dump(9, group="snapshots")["entries"]]},  # type: ignore[list-item]
            1: _dump(3),
        },
        "d",
    )
    assert len(lines) == 2
    assert lines[0].startswith("flight recorder, group default_pg: gloo:all_reduce #3")
    assert "no entry from rank 1" in lines[1] and lines[1].endswith("(dumps in d)")


def test_nothing_answered_and_nothing_recorded() -> None:
    assert summarize({}, "d") == []
    assert summarize({0: None, 1: None}, "d") == [
        "flight recorder: no rank answered (0, 1) (dumps in d)"
    ]
    assert summarize({0: {"entries": []}}, "d")[0].startswith("flight recorder: rank 0 recorded")


def test_a_hostile_or_broken_dump_is_refused_not_run() -> None:
    assert parse_dump(b"\x80\x04pickle") == "not JSON"
    assert parse_dump(b"[1, 2]") == "not a JSON object"
    assert "not read" in str(parse_dump(b" " * (MAX_DUMP_BYTES + 1)))
    assert parse_dump(json.dumps(_dump(1)).encode()) == _dump(1)
    odd = {"entries": [{"collective_seq_id": "x"}, 7, {"collective_seq_id": True}]}
    assert summarize({0: odd, 1: "not JSON"}, "d") == [
        "flight recorder: rank 0 recorded no collective",
        "flight recorder: rank 1's dump not JSON (dumps in d)",
    ]
