"""Carrying surviving ranks into the next generation in their own process (``rejoin``).

A rank of generation g that is still alive when generation g+1 launches keeps its
process: the launch neither fences nor restarts it. It is *carried over*:

1. :func:`survivors` checks each asked-for rank against g's pid file: alive, its
   start ticks ours, no exit record. Anything else is started afresh, and
   ``LaunchResult.rejoin_refused`` says why.
2. The launcher fences every older group except the survivors' (``keep_groups``).
3. :func:`link_into` gives g+1 the survivor's pid, log and exit files as symlinks to
   the directory of the generation that started it, where its wrapper still writes.
   Supervision, stop and fencing of g+1 then see the survivor exactly as they see a
   rank g+1 started: nothing downstream changes.
4. :func:`request_rejoin` writes the rejoin request into g's control file, the file
   the survivor reads: per rank, the variables of g+1 (``environment.REJOIN_VARIABLES``),
   from the launcher's own ``rank_environment``. The rank helper applies them,
   re-creates its process group, reloads the resume point every rank of g+1 shares,
   and acts for g+1 from then on (its heartbeat says so).

Every step is idempotent, so a launch retried on another worker carries the same
survivors again. Local nodes only: the spec refuses ``rejoin`` elsewhere.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from activities.nodes.procfs import is_alive, owned_group
from activities.nodes.rundir import GenerationDir, read_json, write_json_atomic
from lazarus.domain import environment as env_names
from lazarus.domain.contracts import RankProcess


@dataclass(frozen=True)
class Survivor:
    """A live rank of an older generation, carried into the new one."""

    rank: int
    pid: int
    pgid: int
    start_ticks: int
    home: Path
    """The directory of the generation that started it: its wrapper writes there."""

    def process(self, node: str) -> RankProcess:
        return RankProcess(
            rank=self.rank,
            node=node,
            pid=self.pid,
            pgid=self.pgid,
            start_ticks=self.start_ticks,
            log_file=str(self.home / f"rank-{self.rank}.log"),
        )


def survivors(previous: GenerationDir | None, ranks: list[int]) -> tuple[list[Survivor], list[str]]:
    """Which of ``ranks`` of ``previous`` can be carried over, and why each other
    cannot (one line per rank, for the incident)."""
    if not ranks:
        return [], []
    if previous is None:
        return [], [f"rank {r}: no earlier generation" for r in ranks]
    kept: list[Survivor] = []
    refused: list[str] = []
    for rank in ranks:
        record = read_json(previous.pid_file(rank))
        why = _why_not(previous, rank, record)
        if why is not None or record is None:  # (no record: a reason was given)
            refused.append(f"rank {rank}: {why}")
            continue
        home = Path(os.path.realpath(previous.pid_file(rank))).parent
        kept.append(
            Survivor(
                rank=rank,
                pid=int(record["pid"]),
                pgid=int(record["pgid"]),
                start_ticks=int(record["start_ticks"]),
                home=home,
            )
        )
    return kept, refused


def _why_not(previous: GenerationDir, rank: int, record: dict[str, Any] | None) -> str | None:
    if record is None:
        return f"no pid file in generation {previous.generation}"
    if previous.exit_file(rank).exists():
        return "its process has exited"
    try:
        pid, ticks = int(record["pid"]), int(record["start_ticks"])
    except (KeyError, TypeError, ValueError):
        return "its pid file is incomplete"
    if not is_alive(pid, ticks) or owned_group(record) is None:
        return "its process is gone"
    return None


def link_into(gen: GenerationDir, survivor: Survivor) -> None:
    """Make the survivor a rank of ``gen``: its pid, log and exit records, linked
    to where its wrapper writes them. Existing links (a retried launch) stay."""
    rank = survivor.rank
    for mine, theirs in (
        (gen.pid_file(rank), survivor.home / gen.pid_file(rank).name),
        (gen.log_file(rank), survivor.home / gen.log_file(rank).name),
        (gen.exit_file(rank), survivor.home / gen.exit_file(rank).name),
    ):
        with contextlib.suppress(FileExistsError):
            os.symlink(theirs, mine)


def request_rejoin(
    previous: GenerationDir,
    generation: int,
    environments: Mapping[int, Mapping[str, str]],
) -> None:
    """Ask the survivors in ``previous`` to act for ``generation``: each gets the
    variables of its new rank environment that change per generation (null: unset).
    The rest of the control document (interval overrides, requests) is kept."""
    document = read_json(previous.control_file) or {}
    document[env_names.CONTROL_REJOIN] = {
        "generation": generation,
        "env": {
            str(rank): {name: env.get(name) for name in env_names.REJOIN_VARIABLES}
            for rank, env in sorted(environments.items())
        },
    }
    write_json_atomic(previous.control_file, document)
