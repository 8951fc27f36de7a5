"""Carrying surviving ranks into the next generation in their own process (``rejoin``).

A rank of generation g that is still alive when generation g+1 launches keeps its
process: the launch neither fences nor restarts it. It is *carried over*:

1. :func:`survivors` checks each asked-for rank against g's pid file: alive, its
   start ticks ours, no exit record. Anything else is started afresh, and
   ``LaunchResult.rejoin_refused`` says why.
2. Every older group on the node but the survivors' is fenced (``keep_groups``);
   the launcher fences this machine once more behind the nodes, as a net.
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
survivors again.

Per node (:func:`carry`, issue 28): the steps run on the node that runs the
survivors, since their pid files, control file and process groups are there. The
launcher asks each node's agent for its own slots (``NodeAgent.carry_survivors``):
the local agent calls :func:`carry` in the worker; the shim agent (ssh) runs
``python -m activities.nodes.carry`` on the node with the request on stdin (the ranks'
interpreter, as warm starts do), so the same code carries on every node. Failure
sequences on one node:

- the node cannot be reached: the agent raises ``NodeUnreachable`` before anything
  was fenced or started there; the launch fails as a node failure, after stopping
  what it reached on the other nodes (their survivors too: they were told to join a
  launch that did not happen), and the playbook replaces the node or waits for a
  person;
- Lazarus cannot run on the node (not importable by the ranks' interpreter): the
  agent fences every older generation there with the shim's own ``stop`` and
  refuses each rank with the reason, so they start afresh (whole node, not job);
- a survivor dies between its check and the fencing: it is carried as a dead rank;
  supervision of the new generation sees its exit record (linked) and reports a
  crash, which recovers as any crash does;
- a fenced group would not die (``CarryResult.unkillable``: uninterruptible sleep, a
  GPU after an Xid, a hung mount): the launcher starts no rank and refuses
  (:class:`RanksWouldNotDie`, not retried). A rejoin skips the workflow's stop before
  the launch, which is where such ranks block a launch without rejoin
  (``stuck_ranks``); a fresh rank must never start beside them (issue 37, N7).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from activities.nodes.node_records import CarryRequest, CarryResult, NodeStopResult, StartedRank
from activities.nodes.procfs import is_alive, owned_group
from activities.nodes.rundir import (
    GenerationDir,
    generation_lock,
    generations,
    read_json,
    write_json_atomic,
)
from lazarus.domain import environment as env_names
from lazarus.domain.process_groups import UnkillableGroup


class RanksWouldNotDie(Exception):
    """The launch's fencing found groups of an older generation alive after SIGKILL
    (uninterruptible sleep: a GPU after an Xid, a hung mount): no rank was started.
    The workflow stops the generation and asks a person, as when its own stop finds
    them (``stuck_ranks``)."""

    def __init__(self, groups: list[UnkillableGroup]) -> None:
        self.groups = groups
        lines = "; ".join(
            f"{g.node}: pgid {g.pgid} (pids {', '.join(map(str, g.pids))}) {g.reason}"
            for g in groups
        )
        super().__init__(f"ranks would not die after SIGKILL: {lines}; no rank was started")


@dataclass(frozen=True)
class Survivor:
    """A live rank of an older generation, carried into the new one."""

    rank: int
    pid: int
    pgid: int
    start_ticks: int
    home: Path
    """The directory of the generation that started it: its wrapper writes there."""

    def started(self) -> StartedRank:
        """As a node agent reports a rank (the survivor was not started now)."""
        return StartedRank(
            rank=self.rank,
            pid=self.pid,
            pgid=self.pgid,
            start_ticks=self.start_ticks,
            log_file=str(self.home / f"rank-{self.rank}.log"),
        )


_PROCESS_FIELDS = {"rank", "pid", "pgid", "start_ticks", "log_file"}


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


def rejoin_variables(env: Mapping[str, str | None]) -> dict[str, str | None]:
    """The variables of a rank's new environment a rejoin request carries (null:
    unset): only these leave the launcher for a survivor's node."""
    return {name: env.get(name) for name in env_names.REJOIN_VARIABLES}


def request_rejoin(
    previous: GenerationDir,
    generation: int,
    environments: Mapping[int, Mapping[str, str | None]],
    lock_timeout_s: float | None = None,
) -> None:
    """Ask the survivors in ``previous`` to act for ``generation``: each gets the
    variables of its new rank environment that change per generation (null: unset).
    The rest of the control document (interval overrides, requests) is kept, and so
    are the other ranks of a request for the same generation: several logical nodes
    (local nodes, or ssh nodes on a shared filesystem) each write their own ranks,
    under the generation's lock so that no write loses another's."""
    with generation_lock(previous, lock_timeout_s):
        document = read_json(previous.control_file) or {}
        earlier = document.get(env_names.CONTROL_REJOIN)
        merged: dict[str, Any] = {}
        same = isinstance(earlier, dict) and earlier.get("generation") == generation
        if same and isinstance(earlier, dict) and isinstance(earlier.get("env"), dict):
            merged.update(earlier["env"])
        merged.update(
            {str(rank): rejoin_variables(env) for rank, env in sorted(environments.items())}
        )
        document[env_names.CONTROL_REJOIN] = {
            "generation": generation,
            "env": dict(sorted(merged.items(), key=lambda item: int(item[0]))),
        }
        write_json_atomic(previous.control_file, document)


Fence = Callable[[list[GenerationDir], CarryRequest, frozenset[int]], NodeStopResult]
"""Stops the groups of these generations that the request's node launched, except the
given groups (the local agent's ``stop_ranks``; passed in, since that agent calls
:func:`carry` itself)."""


def carry(request: CarryRequest, fence: Fence) -> CarryResult:
    """One node's carry (``NodeAgent.carry_survivors``), run on that node: check the
    asked-for ranks (:func:`survivors`), fence every other group of the run's older
    generations here (``keep_groups``: the survivors'), link the survivors into the
    new generation and write their rejoin request. Fencing comes before the request,
    so no survivor acts for the new generation while a rank it would replace lives."""
    previous = GenerationDir(Path(request.previous_gen_dir))
    gen = GenerationDir(Path(request.gen_dir))
    gen.path.mkdir(parents=True, exist_ok=True)
    kept, refused = survivors(previous, sorted(set(request.ranks)))
    older = [g for g in generations(Path(request.run_root)) if g.generation < request.generation]
    fenced = fence(older, request, frozenset(s.pgid for s in kept))
    missing = [s.rank for s in kept if s.rank not in request.env]
    if missing:
        raise ValueError(f"env: no rejoin variables for ranks {missing}")
    for survivor in kept:
        link_into(gen, survivor)
    if kept:
        request_rejoin(
            previous,
            request.generation,
            {s.rank: request.env[s.rank] for s in kept},
            request.lock_timeout_s,
        )
    return CarryResult(
        carried=[s.started() for s in kept], refused=refused, unkillable=fenced.unkillable
    )
