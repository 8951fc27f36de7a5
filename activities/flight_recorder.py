"""Ask the ranks of a hung generation for their flight-recorder dumps (issue 38).

:mod:`lazarus.domain.flight_recorder` says why and reads the dumps;
:mod:`lazarus.rank.flight_recorder` writes them. Here, between the hang's detection
and the stop: write a new request into the generation directory, wait until every
rank that can answer has (a SIGSTOPped rank cannot: it is not waited for), at most
:data:`WAIT_S`, and fold what came back into evidence lines. Best effort and local,
like the Python stacks (:mod:`activities.rank_stacks`): a generation directory on
another machine is not read from here.

The rank helper turns the recorder on (:func:`lazarus.rank.flight_recorder.configure`);
on NCCL it also points the watchdog's own dump at its timeout into the generation
directory, and those files are named here too.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterable
from pathlib import Path

from lazarus.domain import flight_recorder as fr

WAIT_S = 1.0
"""The longest the stop waits for the dumps (a rank's watcher looks every 0.25 s)."""
POLL_S = 0.05


def request_and_read(
    generation_dir: Path, ranks: Iterable[int], stopped: Iterable[int] = ()
) -> list[str]:
    """Ask those of ``ranks`` whose watcher announced itself for a dump, wait for those
    not ``stopped`` (bounded), and return the evidence lines (none for a script
    without the rank helper's process group: no rank is asked or waited for)."""
    dump_dir = generation_dir / fr.DUMP_DIR
    ranks = sorted(r for r in set(ranks) if (dump_dir / fr.ready_name(r)).exists())
    stopped_set = set(stopped)
    if not ranks:  # no rank runs the helper's watcher: nothing to ask, nothing to wait for
        return _nccl_dumps(generation_dir)
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
    dumps: dict[int, dict[str, object] | str | None] = {}
    for rank in ranks:
        path = dump_dir / fr.dump_name(rank)
        dumps[rank] = _read(path) if path.exists() else None
    if all(d is None for d in dumps.values()):
        return _nccl_dumps(generation_dir)
    return fr.summarize(dumps, str(dump_dir)) + _nccl_dumps(generation_dir)


def _read(path: Path) -> dict[str, object] | str:
    try:
        with open(path, "rb") as handle:
            raw = handle.read(fr.MAX_DUMP_BYTES + 1)
    except OSError as exc:
        return f"unreadable ({type(exc).__name__})"
    return fr.parse_dump(raw)


def _nccl_dumps(generation_dir: Path) -> list[str]:
    found = sorted(generation_dir.glob(f"{fr.NCCL_DUMP_PREFIX}*"))
    if not found:
        return []
    names = ", ".join(p.name for p in found[:8])
    return [f"NCCL flight recorder dumps (watchdog timeout) in {generation_dir}: {names}"]
