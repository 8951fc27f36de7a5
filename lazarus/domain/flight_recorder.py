"""The collective flight recorder at a hang: which collective, and who never joined it.

A hang in distributed training is usually a collective that some rank never entered.
torch keeps a ring buffer of each process group's collectives, the flight recorder
(``TORCH_FR_BUFFER_SIZE`` entries; gloo and NCCL alike in torch 2.13), and can dump it
as JSON. At a hang the supervisor asks every rank for that dump (a request file in the
generation directory, :data:`REQUEST_FILE`); the rank helper's watcher thread answers
even while the training thread is stuck inside the collective (the wait releases the
GIL), writing ``<generation>/flight-recorder/rank-<r>.json``. A rank that is stopped
(SIGSTOP) or stuck outside Python does not answer, and that absence is evidence too.

This module is the pure half: the names both sides share and :func:`summarize`, which
turns the dumps into the incident's lines: per process group, the newest collective
each rank entered, and the ranks that are behind it (never joined) or silent.

JSON, never pickle: the dump is written by a rank, which runs the user's code; the
worker that reads it must not run code from it. Size-bounded for the same reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

REQUEST_FILE = "flight-recorder.request"
"""In the generation directory: its content (a request id) changing asks for a dump."""
DUMP_DIR = "flight-recorder"
"""In the generation directory: ``rank-<r>.json``, one dump per rank."""
BUFFER_ENTRIES = 2000
"""``TORCH_FR_BUFFER_SIZE`` the rank helper sets when the environment does not:
torch's own suggestion for NCCL debugging; a few hundred KB per process group."""
NCCL_DUMP_PREFIX = "nccl-trace-rank-"
"""In the generation directory: NCCL's own dump when its watchdog times out a
collective (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``; torch appends the rank)."""
MAX_DUMP_BYTES = 8 << 20
"""A dump larger than this is not read (2,000 entries are well under 1 MB)."""
MAX_GROUPS = 4
"""Process groups named per incident: the default group and a few more."""


def dump_name(rank: int) -> str:
    return f"rank-{rank}.json"


def ready_name(rank: int) -> str:
    """In :data:`DUMP_DIR`: this rank's watcher runs in this generation, so the
    supervisor asks it, and waits for it, and for no rank without one (a script
    without the helper's process group would only make the stop wait)."""
    return f"rank-{rank}.ready"


@dataclass(frozen=True)
class LastCollective:
    """The newest collective a rank entered in one process group."""

    group: str
    seq: int
    name: str
    sizes: str


def last_collectives(dump: Mapping[str, object]) -> dict[str, LastCollective]:
    """Per process group, the entry with the highest collective sequence number."""
    found: dict[str, LastCollective] = {}
    entries = dump.get("entries")
    if not isinstance(entries, list):
        return found
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        seq = entry.get("collective_seq_id")
        if not isinstance(seq, int) or isinstance(seq, bool):
            continue
        group = _group_name(entry.get("process_group"), entry.get("pg_id"))
        if group in found and found[group].seq >= seq:
            continue
        name = entry.get("profiling_name")
        sizes = entry.get("input_sizes")
        found[group] = LastCollective(
            group=group,
            seq=seq,
            name=name if isinstance(name, str) else "?",
            sizes=json.dumps(sizes)[:40] if sizes is not None else "",
        )
    return found


def parse_dump(raw: bytes) -> dict[str, object] | str:
    """A rank's dump, or why it cannot be read."""
    if len(raw) > MAX_DUMP_BYTES:
        return f"larger than {MAX_DUMP_BYTES >> 20} MiB, not read"
    try:
        value = json.loads(raw)
    except ValueError:
        return "not JSON"
    return value if isinstance(value, dict) else "not a JSON object"


def summarize(dumps: Mapping[int, dict[str, object] | str | None], where: str) -> list[str]:
    """The incident's lines from each rank's dump (None: the rank did not answer;
    a string: why its dump could not be read). ``where``: the dumps' directory."""
    if not dumps:
        return []
    silent = sorted(rank for rank, dump in dumps.items() if dump is None)
    unreadable = {rank: dump for rank, dump in dumps.items() if isinstance(dump, str)}
    per_rank = {
        rank: last_collectives(dump) for rank, dump in dumps.items() if isinstance(dump, dict)
    }
    lines: list[str] = []
    groups = sorted({group for found in per_rank.values() for group in found})
    for group in groups[:MAX_GROUPS]:
        newest = max(
            (found[group] for found in per_rank.values() if group in found), key=lambda c: c.seq
        )
        inside = sorted(r for r, found in per_rank.items() if found.get(group) == newest)
        behind = sorted(
            (r, found[group].seq)
            for r, found in per_rank.items()
            if group in found and found[group].seq < newest.seq
        )
        absent = sorted(r for r, found in per_rank.items() if group not in found)
        parts = [
            f"flight recorder, group {group}: {newest.name} #{newest.seq} {newest.sizes}".rstrip()
            + f" entered by rank{_s(inside)} {_ranks(inside)}"
        ]
        if behind:
            parts.append(
                "never joined by " + ", ".join(f"rank {r} (last #{seq})" for r, seq in behind)
            )
        if absent:
            parts.append(f"no entry from rank{_s(absent)} {_ranks(absent)}")
        if silent:
            parts.append(
                f"no dump from rank{_s(silent)} {_ranks(silent)} (stopped, or stuck outside Python)"
            )
        lines.append("; ".join(parts))
    if not groups:
        answered = sorted(per_rank)
        if answered:
            lines.append(
                f"flight recorder: rank{_s(answered)} {_ranks(answered)} recorded no collective"
                + (f"; no dump from rank{_s(silent)} {_ranks(silent)}" if silent else "")
            )
        elif silent:
            lines.append(f"flight recorder: no rank answered ({_ranks(silent)})")
    for rank, why in sorted(unreadable.items())[:2]:
        lines.append(f"flight recorder: rank {rank}'s dump {why}")
    if lines:
        lines[-1] += f" (dumps in {where})"
    return lines


def _group_name(value: object, pg_id: object) -> str:
    if isinstance(value, list) and len(value) == 2 and isinstance(value[1], str):
        return value[1]
    return f"pg{pg_id}" if isinstance(pg_id, int) else "?"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _s(items: list[int]) -> str:
    return "s" if len(items) != 1 else ""
