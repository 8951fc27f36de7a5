"""A hung generation's evidence, read where its ranks run (issue 38).

Between a hang's detection and the stop, the supervisor asks each node of the
generation for two things at once, both bounded:

- the Python stacks of a few of its live ranks (:mod:`lazarus.rank.rank_stacks`,
  py-spy), and
- the collectives' flight recorder: a new request in the generation directory, a
  wait until every rank that can answer has (a SIGSTOPped rank cannot: it is not
  waited for), at most :data:`WAIT_S`, and what came back
  (:mod:`lazarus.domain.flight_recorder` says why and summarizes it;
  :mod:`lazarus.rank.flight_recorder` writes the dumps); on NCCL, the names of the
  watchdog's own dumps at its timeout.

One helper for every node: the local agent calls :func:`gather` in the worker (its
ranks are on the worker's machine); an ssh or Slurm node runs
``python -m lazarus.rank.hang_evidence`` with the node's interpreter (the shim's
``hang-evidence``), the request on stdin, and answers one JSON line. So this module
is standard library only, like all of ``lazarus.rank``. Each rank's dump is cut to
the newest collective of each process group before it leaves the node
(:func:`compact`), and the supervisor summarizes the dumps of every node together
(:func:`evidence_lines`), so a rank that never joined is named across nodes.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from lazarus.domain import flight_recorder as fr
from lazarus.rank.rank_stacks import MAX_LINE_CHARS, MAX_RANKS, StackTarget, stack_lines

WAIT_S = 1.0
"""The longest the stop waits for the dumps (a rank's watcher looks every 0.25 s)."""
POLL_S = 0.05
MAX_REQUEST_BYTES = 1 << 20
MAX_GROUP_ENTRIES = 16
"""Process groups kept per rank's dump when it is compacted (:func:`compact`)."""
MAX_SIZES_CHARS = 200
"""A collective's ``input_sizes`` longer than this (as JSON) is left out."""

Dump = dict[str, object] | str | None
"""A rank's flight-recorder dump: the JSON object, why it could not be read, or None
(the rank did not answer)."""


@dataclass(frozen=True)
class EvidenceTarget:
    """A live rank of the node: its flight recorder is asked for; its stack is read
    when ``stack`` (the supervisor picks the culprit and a few peers)."""

    rank: int
    pid: int
    stopped: bool = False
    stack: bool = True


@dataclass
class HangEvidence:
    """What one node said: ready to be merged with the other nodes' answers."""

    stacks: list[str] = field(default_factory=list)
    """One line per rank read (the order asked), or one line saying why none was."""
    dumps: dict[int, Dump] = field(default_factory=dict)
    """The flight recorder of each rank that was asked (compacted)."""
    dump_dir: str = ""
    """Where the dumps are, on the node that answered."""
    node: str = ""
    """That node's name when it is another machine (set by its agent, not sent): the
    reader is told where the directory is."""
    nccl: list[str] = field(default_factory=list)
    """The NCCL watchdog's own dumps, named."""

    def to_json(self) -> dict[str, object]:
        return {
            "stacks": self.stacks,
            "dumps": {str(rank): dump for rank, dump in self.dumps.items()},
            "dump_dir": self.dump_dir,
            "nccl": self.nccl,
        }

    @classmethod
    def from_json(cls, value: object) -> HangEvidence:
        """A node's answer, bounded: lines cut to :data:`MAX_LINE_CHARS`, at most a few
        of each, and only dumps keyed by a rank. Raises ValueError when it is not one."""
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
        dumps: dict[int, Dump] = {}
        raw_dumps = value.get("dumps")
        for key, dump in raw_dumps.items() if isinstance(raw_dumps, dict) else ():
            if not str(key).isdigit():
                continue
            if isinstance(dump, dict):
                dumps[int(key)] = compact(dump)
            elif isinstance(dump, str):
                dumps[int(key)] = dump[:200]
            else:
                dumps[int(key)] = None
        return cls(
            stacks=_lines(value.get("stacks"), MAX_RANKS + 1),
            dumps=dumps,
            dump_dir=str(value.get("dump_dir") or "")[:MAX_LINE_CHARS],
            nccl=_lines(value.get("nccl"), 2),
        )


def _lines(value: object, most: int) -> list[str]:
    if not isinstance(value, list):
        return []
    return [str(line)[:MAX_LINE_CHARS] for line in value[:most]]


def gather(
    generation_dir: Path, targets: list[EvidenceTarget], where: str = "the worker"
) -> HangEvidence:
    """This machine's part: the stacks of the targets marked ``stack`` and the flight
    recorder of all of them, at once; within :data:`~lazarus.rank.rank_stacks.DUMP_TIMEOUT_S`
    or :data:`WAIT_S`, whichever is longer (plus a thread's start)."""
    stack_targets = [StackTarget(t.rank, t.pid, t.stopped) for t in targets if t.stack]
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="flight-recorder") as beside:
        recorder = beside.submit(
            request_dumps,
            generation_dir,
            [t.rank for t in targets],
            [t.rank for t in targets if t.stopped],
        )
        stacks = stack_lines(stack_targets, where)
        dumps = recorder.result()
    return HangEvidence(
        stacks=stacks,
        dumps={rank: compact(d) if isinstance(d, dict) else d for rank, d in dumps.items()},
        dump_dir=str(generation_dir / fr.DUMP_DIR),
        nccl=nccl_dumps(generation_dir),
    )


def evidence_lines(parts: Iterable[HangEvidence]) -> list[str]:
    """The incident's lines from every node's answer, in the order given (the
    culprit's node first): the stacks, then one flight-recorder summary over all the
    dumps (none when no rank answered), then the NCCL dumps."""
    parts = list(parts)
    lines = [line for part in parts for line in part.stacks]
    dumps: dict[int, Dump] = {}
    for part in parts:
        dumps.update(part.dumps)
    if any(dump is not None for dump in dumps.values()):
        lines += fr.summarize(dumps, _where([p for p in parts if p.dumps and p.dump_dir]))
    lines += [line for part in parts for line in part.nccl]
    return lines


def _where(parts: list[HangEvidence]) -> str:
    """``DIR``, ``DIR on node h2`` or ``DIR on nodes h2, h1``: one directory path per
    run, on each node that holds some of the dumps."""
    nodes: dict[str, list[str]] = {}
    for part in parts:
        nodes.setdefault(part.dump_dir, [])
        if part.node:
            nodes[part.dump_dir].append(part.node)
    said = []
    for path, names in nodes.items():
        on = f" on node{'s' if len(names) > 1 else ''} {', '.join(names)}" if names else ""
        said.append(path + on)
    return "; ".join(said)


def request_dumps(
    generation_dir: Path, ranks: Iterable[int], stopped: Iterable[int] = ()
) -> dict[int, Dump]:
    """Ask those of ``ranks`` whose watcher announced itself for a dump, wait for those
    not ``stopped`` (bounded), and return each asked rank's dump (none for a script
    without the rank helper's process group: no rank is asked or waited for)."""
    dump_dir = generation_dir / fr.DUMP_DIR
    ranks = sorted(r for r in set(ranks) if (dump_dir / fr.ready_name(r)).exists())
    stopped_set = set(stopped)
    if not ranks:  # no rank runs the helper's watcher: nothing to ask, nothing to wait for
        return {}
    for rank in ranks:  # an answer is then a dump that exists
        (dump_dir / fr.dump_name(rank)).unlink(missing_ok=True)
    request = generation_dir / fr.REQUEST_FILE
    temp = request.with_name(f".{request.name}.{secrets.token_hex(4)}")
    temp.write_bytes(secrets.token_hex(8).encode())
    os.replace(temp, request)
    waiting = [r for r in ranks if r not in stopped_set]
    deadline = time.monotonic() + WAIT_S
    while waiting and time.monotonic() < deadline:
        waiting = [r for r in waiting if not (dump_dir / fr.dump_name(r)).exists()]
        if waiting:
            time.sleep(POLL_S)
    dumps: dict[int, Dump] = {}
    for rank in ranks:
        path = dump_dir / fr.dump_name(rank)
        dumps[rank] = _read(path) if path.exists() else None
    return dumps


def compact(dump: Mapping[str, object]) -> dict[str, object]:
    """The dump cut to what the summary reads: the newest entry of each process group
    (at most :data:`MAX_GROUP_ENTRIES`), with its sequence number, name, group and
    sizes (left out when long). Pure; a dump of 2,000 entries becomes a few hundred
    bytes, so a node's answer stays small."""
    newest: dict[str, tuple[int, dict[str, object]]] = {}
    entries = dump.get("entries")
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, dict):
            continue
        seq = entry.get("collective_seq_id")
        if not isinstance(seq, int) or isinstance(seq, bool):
            continue
        group = json.dumps([entry.get("process_group"), entry.get("pg_id")])
        held = newest.get(group)
        if held is None and len(newest) >= MAX_GROUP_ENTRIES:
            continue
        if held is not None and held[0] >= seq:
            continue
        kept: dict[str, object] = {
            k: entry[k] for k in ("collective_seq_id", "profiling_name", "pg_id") if k in entry
        }
        group_value = entry.get("process_group")
        if isinstance(group_value, list) and len(json.dumps(group_value)) <= MAX_SIZES_CHARS:
            kept["process_group"] = group_value
        sizes = entry.get("input_sizes")
        if sizes is not None and len(json.dumps(sizes)) <= MAX_SIZES_CHARS:
            kept["input_sizes"] = sizes
        newest[group] = (seq, kept)
    return {"entries": [kept for _, kept in newest.values()]}


def _read(path: Path) -> dict[str, object] | str:
    try:
        with open(path, "rb") as handle:
            raw = handle.read(fr.MAX_DUMP_BYTES + 1)
    except OSError as exc:
        return f"unreadable ({type(exc).__name__})"
    return fr.parse_dump(raw)


def nccl_dumps(generation_dir: Path) -> list[str]:
    """One line naming the NCCL watchdog's dumps in the generation directory, if any."""
    found = sorted(generation_dir.glob(f"{fr.NCCL_DUMP_PREFIX}*"))
    if not found:
        return []
    names = ", ".join(p.name for p in found[:8])
    return [f"NCCL flight recorder dumps (watchdog timeout) in {generation_dir}: {names}"]


def request_json(generation_dir: str, targets: list[EvidenceTarget], where: str) -> str:
    """What ``python -m lazarus.rank.hang_evidence`` reads on stdin."""
    ranks = [[t.rank, t.pid, t.stopped, t.stack] for t in targets]
    return json.dumps({"gen_dir": generation_dir, "ranks": ranks, "where": where})


def run(text: str) -> dict[str, object]:
    """The node's answer to one request: ``{"hang_evidence": ...}`` or ``{"error": ...}``."""
    try:
        request = json.loads(text)
        gen_dir = Path(str(request["gen_dir"]))
        targets = [
            EvidenceTarget(int(rank), int(pid), bool(stopped), bool(stack))
            for rank, pid, stopped, stack in request["ranks"]
        ]
        where = str(request.get("where") or "this node")
    except (ValueError, KeyError, TypeError) as exc:
        return {"error": f"hang evidence: a bad request ({type(exc).__name__}: {exc})"}
    if not gen_dir.is_absolute() or not gen_dir.is_dir():
        return {"error": f"hang evidence: no generation directory {gen_dir} on {where}"}
    return {"hang_evidence": gather(gen_dir, targets, where).to_json()}


def main() -> int:
    answer = run(sys.stdin.read(MAX_REQUEST_BYTES))
    print(json.dumps(answer), flush=True)
    return 0 if "error" not in answer else 1


if __name__ == "__main__":
    sys.exit(main())
