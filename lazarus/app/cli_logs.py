"""``lazarus logs``: the rank logs of a job's current generation.

Each rank writes ``rank-<N>.log`` in its generation's directory (the layout is in
:mod:`activities.nodes.rundir`); the job's status names its run root (``run_dir``) and
generation, and which node runs each rank, and its spec says how each node is reached.

- A **local** node's log is a file on the worker's machine: read here directly, so
  ``--follow`` works (when this CLI runs on that machine; elsewhere the file is not
  there, and the message says where it is).
- An **ssh** or **slurm** node's log is read through the node's own agent, exactly as
  the supervisor reads it for failure evidence (:meth:`NodeAgent.log_tail`): the last
  :data:`REMOTE_TAIL_BYTES` of it. ``--follow`` is not offered there: the agent
  answers a tail, not an offset, so a follower could lose or repeat lines.

Following ends when the generation does (every followed rank has its exit record, or
the generation was stopped): a recovery starts the next generation in a new
directory, which ``lazarus logs`` run again shows.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from activities.nodes.rundir import GenerationDir
from lazarus.app.client import ClientError
from lazarus.domain.spec import JobSpec, NodeSpec
from workflows.state import JobStatus

REMOTE_TAIL_BYTES = 64 * 1024
"""What one ``log_tail`` round trip to an ssh or slurm node brings back, at most."""
FOLLOW_POLL_S = 0.5


class LogsProblem(ClientError):
    """The logs cannot be shown as asked; the message says why, and what to do.
    ``bad_input``: the request itself was wrong (exit 2, not 1)."""

    def __init__(self, message: str, bad_input: bool = False) -> None:
        super().__init__(message)
        self.bad_input = bad_input


@dataclass(frozen=True)
class RankLog:
    """Where one rank's log is: its node and the file on that node."""

    rank: int
    node: str
    path: Path
    node_spec: NodeSpec | None
    """How the node is reached (None: a node the spec does not name, such as one
    leased from a fleet; its log can only be read if it is a file here)."""

    @property
    def local(self) -> bool:
        return self.node_spec is None or self.node_spec.launcher == "local"


def rank_logs(status: JobStatus, spec: JobSpec, rank: int | None) -> list[RankLog]:
    """The logs of ``rank`` (or of every rank) in the job's current generation."""
    if not status.run_dir:
        raise LogsProblem(f"job '{status.job_id}' reports no run directory (not launched yet?)")
    world = status.world_size
    if rank is not None and not 0 <= rank < world:
        raise LogsProblem(f"--rank {rank}: the job has ranks 0 to {world - 1}", bad_input=True)
    nodes = {r.rank: r.node for r in status.ranks}
    active = status.nodes.active
    for r in range(world):  # not launched yet: the plan's placement
        if r not in nodes and r // spec.nproc_per_node < len(active):
            nodes[r] = active[r // spec.nproc_per_node]
    known = {n.name: n for n in (*spec.nodes, *spec.spares)}
    gen = GenerationDir.of(status.run_dir, status.generation)  # run_dir: the run root
    wanted = [rank] if rank is not None else list(range(world))
    return [
        RankLog(
            rank=r,
            node=nodes.get(r, "local"),
            path=gen.log_file(r),
            node_spec=known.get(nodes.get(r, "local")),
        )
        for r in wanted
    ]


def last_lines(text: str, count: int | None) -> str:
    """The last ``count`` lines of ``text`` (all of it for None)."""
    if count is None:
        return text
    if count <= 0:
        return ""
    lines = text.splitlines(keepends=True)
    return "".join(lines[-count:])


def read_log(log: RankLog, spec: JobSpec, tail: int | None) -> str:
    """One rank's log (its last ``tail`` lines), wherever its node is."""
    if log.local:
        try:
            return last_lines(log.path.read_text(errors="replace"), tail)
        except FileNotFoundError:
            raise LogsProblem(_missing(log)) from None
        except OSError as exc:
            raise LogsProblem(f"rank {log.rank}: cannot read {log.path}: {exc}") from None
    from activities.nodes.factory import agent_for

    assert log.node_spec is not None  # not local: the spec names the node
    agent = agent_for(log.node_spec, spec.ssh, spec.slurm)
    try:
        text = agent.log_tail(str(log.path.parent), log.rank, REMOTE_TAIL_BYTES)
    except Exception as exc:  # unreachable, refused: said in one line, never a traceback
        raise LogsProblem(
            f"rank {log.rank}: cannot read its log on node {log.node} "
            f"({log.node_spec.launcher}): {exc}"
        ) from None
    finally:
        agent.close()
    return last_lines(text, tail)


def _missing(log: RankLog) -> str:
    where = (
        "on this machine; a local node's logs are on the worker's machine"
        if log.node_spec is not None
        else f"here; node {log.node} is not in the spec, so it cannot be reached"
    )
    return f"rank {log.rank}: no log at {log.path} {where} (or the rank has not started)"


def follow(
    logs: list[RankLog],
    tail: int | None,
    emit: Callable[[RankLog, str], None],
    poll_s: float = FOLLOW_POLL_S,
) -> None:
    """Print each log (its last ``tail`` lines) and then every line added to it, until
    the generation ends. Local files only (the module says why); partial lines wait
    for their newline, so two ranks' lines never interleave mid-line."""
    remote = [log for log in logs if not log.local]
    if remote:
        first = remote[0]
        raise LogsProblem(
            f"--follow reads local files only; rank {first.rank} runs on "
            f"{first.node_spec.launcher if first.node_spec else 'an unknown'} node "
            f"{first.node}: leave out --follow for the last {REMOTE_TAIL_BYTES // 1024} KiB",
            bad_input=True,
        )
    gen = GenerationDir(logs[0].path.parent)
    offsets: dict[int, int] = {}
    pending: dict[int, str] = {}
    while True:
        ended = gen.stopped_file.exists() or all(gen.exit_file(log.rank).exists() for log in logs)
        for log in logs:
            _read_new(log, tail, offsets, pending, emit)
        if ended:
            for log in logs:
                if pending.get(log.rank):
                    emit(log, pending.pop(log.rank))
            return
        time.sleep(poll_s)


def _read_new(
    log: RankLog,
    tail: int | None,
    offsets: dict[int, int],
    pending: dict[int, str],
    emit: Callable[[RankLog, str], None],
) -> None:
    try:
        with open(log.path, "rb") as handle:
            start = offsets.get(log.rank)
            if start is None:  # first sight: the tail, then everything after it
                text = last_lines(handle.read().decode(errors="replace"), tail)
            else:
                handle.seek(start)
                text = handle.read().decode(errors="replace")
            offsets[log.rank] = handle.tell()
    except FileNotFoundError:
        return  # not started yet: it will appear
    text = pending.pop(log.rank, "") + text
    complete, _, partial = text.rpartition("\n")
    if partial:
        pending[log.rank] = partial
    if complete:
        emit(log, complete + "\n")


def show(logs: list[RankLog], spec: JobSpec, tail: int | None, follow_: bool) -> list[str]:
    """Print ``logs`` on stdout (followed, with ``follow_``); with several, each line
    starts with ``[rank N]``. Returns the logs that could not be read, one line each
    (the others are printed all the same)."""
    prefixed = len(logs) > 1

    def emit(log: RankLog, text: str) -> None:
        if prefixed:
            text = "".join(f"[rank {log.rank}] {line}" for line in text.splitlines(keepends=True))
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
        sys.stdout.flush()

    if follow_:
        follow(logs, tail, emit)
        return []
    problems: list[str] = []
    for log in logs:
        try:
            emit(log, read_log(log, spec, tail))
        except LogsProblem as exc:
            problems.append(str(exc))
    return problems
