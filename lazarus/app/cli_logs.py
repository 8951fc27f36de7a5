"""``lazarus logs``: the rank logs of one generation of a job (the current one unless
``--generation N`` or ``--previous``).

Each rank writes ``rank-<N>.log`` in its generation's directory (the layout is in
:mod:`activities.nodes.rundir`); the job's status names its run root (``run_dir``),
its generations and incidents, and which node runs each rank, and its spec says how
each node is reached.

- A **local** node's log is a file on the worker's machine: read here directly (when
  this CLI runs on that machine; elsewhere the file is not there, and the message
  says where it is).
- An **ssh** or **slurm** node's log is read through the node's own agent, the one the
  supervisor uses (``NodeAgent.log_read``), on a worker (issue 40: the CLI is a
  client; ``activities/node_logs.py`` answers :class:`RemoteLogs`' calls): by offset,
  a chunk of :data:`READ_CHUNK_BYTES` per round trip, so a log of any size comes whole
  and ``--follow`` neither loses nor repeats a line. A Slurm generation's directory is
  on the shared filesystem, read where the worker runs.

Which generation: ``--generation N`` names it; ``--previous`` is the newest generation
that ended in a failure (the generation of the job's newest crash, hang, vanished or
node_lost incident), which is the one to read after an incident, and the current one
when that is the generation that failed (a job that gave up). A past generation's
ranks may have run on other nodes than today's (a lost node replaced by a spare): its
``plan.json`` says where when it can be read here; otherwise the incident's node is
asked for the failed rank and each node of the spec in turn for the others, until one
holds the file.

Times: a line's time is known when the line starts with one (ISO 8601, as Python's
``logging`` writes it; without a zone it is this machine's local time). ``--since``
drops a log last written before it, and the lines known to be older: a line without
a time of its own is shown unless a later line's time (or the file's) proves it older.

Following ends when the generation does (every followed rank has ended, or the
generation was stopped): a recovery starts the next generation in a new directory,
which ``lazarus logs`` run again shows.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from lazarus.app.client import ClientError, JobClient
from lazarus.app.settings import ConnectionProblem, ConnectionSettings
from lazarus.domain.job_view import JobStatus
from lazarus.domain.run_layout import GenerationDir
from lazarus.domain.spec import JobSpec, NodeSpec
from lazarus.domain.worker_calls import (
    RanksEndedRequest,
    RanksEndedResult,
    ReadLogRequest,
    ReadLogResult,
)

READ_CHUNK_BYTES = 1 << 20
"""What one read of a log brings back, at most."""
REMOTE_CHUNK_BYTES = 256 << 10
"""The same for a remote node's log, read by a worker: one call workflow per chunk,
whose answer (base64) the server keeps in that call's history."""


class RemoteLogs(Protocol):
    """Who reads a log on an ssh or Slurm node: a worker, through its agents
    (``WorkerLogs`` for the CLI; ``activities.node_logs.AgentLogs`` is the worker's own)."""

    def read(self, request: ReadLogRequest) -> ReadLogResult: ...

    def ended(self, request: RanksEndedRequest) -> RanksEndedResult: ...

    def close(self) -> None: ...


FOLLOW_POLL_S = 0.5
FAILURE_KINDS = frozenset({"crash", "hang", "vanished", "node_lost"})
"""Incident kinds that end a generation in a failure (``--previous``)."""
SINCE_BUFFER_BYTES = 8 << 20
"""``--since``: lines without a time wait (in memory) for a later time to say whether
they are older; past this much they are shown rather than held."""


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
    others: tuple[tuple[str, NodeSpec | None], ...] = ()
    """Nodes that may hold the log instead (a past generation whose placement is not
    known here), asked in turn when ``node`` has no such file."""

    @property
    def local(self) -> bool:
        return self.node_spec is None or self.node_spec.transport.runs_here

    @property
    def generation(self) -> int:
        return GenerationDir(self.path.parent).generation


@dataclass(frozen=True)
class Chunk:
    data: bytes = b""
    size: int | None = None
    """None: no such file."""
    mtime: float | None = None


class WorkerLogs:
    """:class:`RemoteLogs` through a worker, for the CLI: a client of its own, on an
    event loop of its own (the printing below is synchronous), connected at the first
    remote read (a job of local nodes never connects)."""

    def __init__(self, settings: ConnectionSettings) -> None:
        self._settings = settings
        self._loop = asyncio.new_event_loop()
        self._jobs: JobClient | None = None

    def _ask(self, call: Callable[[JobClient], Any]) -> Any:
        try:
            if self._jobs is None:
                self._jobs = self._loop.run_until_complete(JobClient.connect(self._settings))
            return self._loop.run_until_complete(call(self._jobs))
        except (ClientError, ConnectionProblem) as exc:
            raise LogsProblem(str(exc)) from None

    def read(self, request: ReadLogRequest) -> ReadLogResult:
        answer: ReadLogResult = self._ask(lambda jobs: jobs.read_log(request))
        return answer

    def ended(self, request: RanksEndedRequest) -> RanksEndedResult:
        answer: RanksEndedResult = self._ask(lambda jobs: jobs.ranks_ended(request))
        return answer

    def close(self) -> None:
        self._loop.close()


# --- which generation, which ranks, which nodes -------------------------------------------


def pick_generation(status: JobStatus, generation: int | None, previous: bool) -> int:
    """The generation ``--generation``/``--previous`` name (the current one without)."""
    newest = status.generation
    if newest < 1:
        raise LogsProblem(f"job '{status.job_id}' has launched no generation yet")
    if generation is not None and previous:
        raise LogsProblem("--generation and --previous name a generation each: give one", True)
    if generation is not None:
        if not 1 <= generation <= newest:
            raise LogsProblem(
                f"--generation {generation}: job '{status.job_id}' has generations 1 to {newest}",
                bad_input=True,
            )
        return generation
    if not previous:
        return newest
    failed = [i.generation for i in status.incidents if i.kind in FAILURE_KINDS]
    if not failed:
        raise LogsProblem(
            f"--previous: no generation of job '{status.job_id}' ended in a failure "
            f"(generations 1 to {newest}); name one with --generation N"
        )
    return max(failed)


def previous_note(status: JobStatus, generation: int) -> str:
    """One line for stderr: which generation ``--previous`` chose, and why."""
    incident = max(
        (i for i in status.incidents if i.generation == generation and i.kind in FAILURE_KINDS),
        key=lambda i: i.id,
    )
    what = incident.kind if incident.rank is None else f"{incident.kind} of rank {incident.rank}"
    if incident.exit_code is not None:
        what += f" (exit {incident.exit_code})"
    elif incident.signal:
        what += f" ({incident.signal})"
    where = f" on node {incident.node}" if incident.node else ""
    return f"generation {generation} of job '{status.job_id}': ended in a {what}{where}"


def rank_logs(
    status: JobStatus, spec: JobSpec, rank: int | None, generation: int | None = None
) -> list[RankLog]:
    """The logs of ``rank`` (or of every rank) in ``generation`` (default: the job's
    current one)."""
    if not status.run_dir:
        raise LogsProblem(f"job '{status.job_id}' reports no run directory (not launched yet?)")
    current = generation is None or generation == status.generation
    gen = GenerationDir.of(status.run_dir, status.generation if current else generation or 0)
    known = {n.name: n for n in (*spec.nodes, *spec.spares)}
    planned = None if current else _plan_nodes(gen)
    world = status.world_size
    if planned is not None:
        world = len(planned) * spec.nproc_per_node
    if rank is not None and not 0 <= rank < world:
        raise LogsProblem(f"--rank {rank}: the job has ranks 0 to {world - 1}", bad_input=True)
    nodes: dict[int, str] = {}
    if planned is not None:
        nodes = {r: planned[r // spec.nproc_per_node] for r in range(world)}
    elif not current:  # the failed rank's node is known; the others are searched
        for incident in sorted(status.incidents, key=lambda i: i.id):
            if incident.generation == gen.generation and incident.rank is not None:
                nodes[incident.rank] = incident.node or nodes.get(incident.rank, "local")
    for running in status.ranks:  # a past generation's: today's placement, a first guess
        nodes.setdefault(running.rank, running.node)
    active = status.nodes.active
    for r in range(world):  # not launched yet: the plan's placement
        if r not in nodes and r // spec.nproc_per_node < len(active):
            nodes[r] = active[r // spec.nproc_per_node]
    wanted = [rank] if rank is not None else list(range(world))
    search = planned is None and not current
    found = []
    for r in wanted:
        node = nodes.get(r, "local")
        others = tuple((n, s) for n, s in known.items() if n != node) if search else ()
        found.append(
            RankLog(
                rank=r, node=node, path=gen.log_file(r), node_spec=known.get(node), others=others
            )
        )
    return found


def _plan_nodes(gen: GenerationDir) -> list[str] | None:
    """The generation's nodes from its ``plan.json``, where it can be read here."""
    try:
        plan = json.loads(gen.plan_file.read_text())
    except (OSError, ValueError):
        return None
    nodes = plan.get("nodes") if isinstance(plan, dict) else None
    if isinstance(nodes, list) and nodes and all(isinstance(n, str) for n in nodes):
        return nodes
    return None


# --- reading ------------------------------------------------------------------------------


def _read_file(path: Path, offset: int, max_bytes: int) -> Chunk:
    try:
        with open(path, "rb") as handle:
            stat = os.fstat(handle.fileno())
            handle.seek(max(offset, 0))
            return Chunk(handle.read(max(max_bytes, 0)), stat.st_size, stat.st_mtime)
    except FileNotFoundError:
        return Chunk()


class Reader:
    """Reads rank logs by offset, wherever they are; one agent per remote node, kept
    open for the reader's life (:meth:`close`)."""

    def __init__(self, spec: JobSpec, remote: RemoteLogs | None = None) -> None:
        self.spec = spec
        self.remote = remote
        """Reads remote nodes' logs (None: only logs on this machine can be read)."""
        self._where: dict[int, tuple[str, NodeSpec | None]] = {}

    def close(self) -> None:
        if self.remote is not None:
            self.remote.close()

    def _remote(self, node: str, node_spec: NodeSpec) -> RemoteLogs:
        if self.remote is None:
            raise LogsProblem(
                f"node {node} ({node_spec.launcher}): its logs are read by a worker, and "
                "none was asked"
            )
        return self.remote

    def node_of(self, log: RankLog) -> str:
        return self._where.get(log.rank, (log.node, None))[0]

    def read(self, log: RankLog, offset: int, max_bytes: int = READ_CHUNK_BYTES) -> Chunk:
        """Bytes of ``log`` from ``offset``; a missing file (size None) when no node
        that may hold it does."""
        if log.rank in self._where:
            return self._read_on(log, *self._where[log.rank], offset, max_bytes)
        for node, node_spec in ((log.node, log.node_spec), *log.others):
            chunk = self._read_on(log, node, node_spec, offset, max_bytes)
            if chunk.size is not None:
                self._where[log.rank] = (node, node_spec)
                return chunk
        return Chunk()

    def _read_on(
        self, log: RankLog, node: str, node_spec: NodeSpec | None, offset: int, max_bytes: int
    ) -> Chunk:
        if node_spec is None or node_spec.transport.runs_here:
            try:
                return _read_file(log.path, offset, max_bytes)
            except OSError as exc:
                raise LogsProblem(f"rank {log.rank}: cannot read {log.path}: {exc}") from None
        got = self._remote(node, node_spec).read(
            ReadLogRequest(
                node=node_spec,
                ssh=self.spec.ssh,
                slurm=self.spec.slurm,
                gen_dir=str(log.path.parent),
                rank=log.rank,
                offset=offset,
                max_bytes=min(max_bytes, REMOTE_CHUNK_BYTES),
            )
        )
        if got.error is not None:  # unreachable, refused: said in one line, never a traceback
            raise LogsProblem(
                f"rank {log.rank}: cannot read its log on node {node} "
                f"({node_spec.launcher}): {got.error}"
            )
        return Chunk(got.data, got.size, got.mtime)

    def ended(self, logs: list[RankLog]) -> bool:
        """Whether every rank of ``logs`` has ended (or their generation was stopped)."""
        gen = GenerationDir(logs[0].path.parent)
        local = [log for log in logs if log.local]
        stopped = gen.stopped_file.exists()
        if not stopped and not all(gen.exit_file(log.rank).exists() for log in local):
            return False
        by_node: dict[str, list[int]] = {}
        specs: dict[str, NodeSpec] = {}
        for log in logs:
            if not log.local and log.node_spec is not None:
                node, spec = self._where.get(log.rank, (log.node, log.node_spec))
                assert spec is not None
                by_node.setdefault(node, []).append(log.rank)
                specs[node] = spec
        for node, ranks in by_node.items():
            answer = self._remote(node, specs[node]).ended(
                RanksEndedRequest(
                    node=specs[node],
                    ssh=self.spec.ssh,
                    slurm=self.spec.slurm,
                    gen_dir=str(gen.path),
                    ranks=ranks,
                )
            )
            if answer.error is not None:
                raise LogsProblem(f"node {node} stopped answering: {answer.error}")
            if not answer.ended:
                return False
        return True

    def tail_offset(self, log: RankLog, size: int, count: int) -> int:
        """Where the last ``count`` lines of ``log`` (``size`` bytes) begin: read
        backwards a chunk at a time, so a short tail of a big log costs little."""
        if count <= 0:
            return size
        end = size
        newlines = 0
        while end > 0:
            # A remote read brings back REMOTE_CHUNK_BYTES at most: ask no more, so
            # the bytes read always end at ``end``.
            start = max(0, end - REMOTE_CHUNK_BYTES)
            data = self.read(log, start, end - start).data
            if end == size and data.endswith(b"\n"):
                data = data[:-1]  # the last line's own newline
            at = len(data)
            while (at := data.rfind(b"\n", 0, at)) >= 0:
                newlines += 1
                if newlines == count:
                    return start + at + 1
            end = start
        return 0


def lines_of(
    reader: Reader, log: RankLog, offset: int, pending: bytes = b""
) -> Iterator[tuple[Chunk, list[bytes], int, bytes]]:
    """``log`` from ``offset`` to its end, a chunk at a time: each chunk's complete
    lines (newline dropped), the next offset, and the partial line left over."""
    while True:
        chunk = reader.read(log, offset)
        offset += len(chunk.data)
        text = pending + chunk.data
        complete, newline, pending = text.rpartition(b"\n")
        yield chunk, (complete.split(b"\n") if newline else []), offset, pending
        # The end: nothing more, or the file's size reached. Not "a short chunk": a
        # remote node's chunks are shorter than a local one's (REMOTE_CHUNK_BYTES).
        if not chunk.data or (chunk.size is not None and offset >= chunk.size):
            return


# --- times --------------------------------------------------------------------------------

_STAMP = re.compile(
    r"^\[?(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(?:[.,](\d{1,6})\d*)?"
    r"(?:\s?(Z|[+-]\d{2}:?\d{2}))?(?![\d:])"
)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def line_time(line: str) -> float | None:
    """The time a line starts with (seconds since the epoch), if it starts with one."""
    match = _STAMP.match(line)
    if match is None:
        return None
    day, clock, fraction, zone = match.groups()
    text = f"{day}T{clock}" + (f".{fraction.ljust(6, '0')}" if fraction else "")
    if zone:
        text += "+00:00" if zone == "Z" else zone
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        return None
    return (stamp if stamp.tzinfo else stamp.astimezone()).timestamp()


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``: a duration back from now (``90s``, ``5m``, ``1h30m``, ``2d``) or a
    time (ISO 8601; without a zone, this machine's local time). Seconds since the epoch."""
    value = text.strip()
    now = time.time() if now is None else now
    if value and _DURATION.sub("", value) == "":
        return now - sum(float(n) * _UNITS[u] for n, u in _DURATION.findall(value))
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise LogsProblem(
            f"--since {text!r}: give a duration (90s, 5m, 1h30m, 2d) or a time "
            "(2026-12-07T10:00:00, with or without a zone)",
            bad_input=True,
        ) from None
    return (stamp if stamp.tzinfo else stamp.astimezone()).timestamp()


@dataclass
class SinceFilter:
    """Drops the lines known to be older than ``since``: those before a line whose
    time is older. Lines without a time wait for the next time that says; at the end
    of the log, they are shown (the file was written since)."""

    since: float | None
    passing: bool = False
    held: list[tuple[bytes, float | None]] = field(default_factory=list)
    held_bytes: int = 0

    def __post_init__(self) -> None:
        self.passing = self.since is None

    def feed(self, line: bytes, stamp: float | None) -> list[tuple[bytes, float | None]]:
        if self.passing:
            return [(line, stamp)]
        assert self.since is not None
        if stamp is None:
            self.held.append((line, stamp))
            self.held_bytes += len(line)
            return self.flush() if self.held_bytes > SINCE_BUFFER_BYTES else []
        if stamp < self.since:
            self.held.clear()
            self.held_bytes = 0
            return []
        return [*self.flush(), (line, stamp)]

    def flush(self) -> list[tuple[bytes, float | None]]:
        self.passing = True
        out, self.held, self.held_bytes = self.held, [], 0
        return out


def older_than(chunk: Chunk, since: float | None) -> bool:
    """The whole log was last written before ``since`` (mtime to the second)."""
    return since is not None and chunk.mtime is not None and chunk.mtime + 1 < since


# --- printing -----------------------------------------------------------------------------


Emit = Callable[[RankLog, list[tuple[bytes, float | None]]], None]


def printer(logs: list[RankLog], reader: Reader, as_json: bool) -> Emit:
    """Lines to stdout: plain (each starting with ``[rank N]`` when there are several
    logs) or, with ``as_json``, one JSON object per line."""
    prefixed = len(logs) > 1

    def emit(log: RankLog, lines: list[tuple[bytes, float | None]]) -> None:
        out = []
        for raw, stamp in lines:
            line = raw.decode(errors="replace")
            if as_json:
                when = None
                if stamp is not None:
                    when = datetime.fromtimestamp(stamp, UTC).isoformat()
                    when = when.replace("+00:00", "Z")
                document = {
                    "generation": log.generation,
                    "rank": log.rank,
                    "node": reader.node_of(log),
                    "line": line,
                    "time": when,
                }
                out.append(json.dumps(document, ensure_ascii=False) + "\n")
            else:
                out.append(f"[rank {log.rank}] {line}\n" if prefixed else f"{line}\n")
        if out:
            sys.stdout.write("".join(out))
            sys.stdout.flush()

    return emit


@dataclass
class _Position:
    offset: int = 0
    pending: bytes = b""
    filter: SinceFilter = field(default_factory=lambda: SinceFilter(None))
    started: bool = False


def _dated(lines: list[bytes]) -> list[tuple[bytes, float | None]]:
    return [(line, line_time(line[:64].decode(errors="replace"))) for line in lines]


def _start(
    reader: Reader, log: RankLog, tail: int | None, since: float | None, position: _Position
) -> bool:
    """Place ``position`` where ``log``'s printing begins; False while there is no file."""
    head = reader.read(log, 0, 0)
    if head.size is None:
        return False
    position.started = True
    position.filter = SinceFilter(since)
    if older_than(head, since):
        position.offset = head.size  # nothing before now is new enough
        position.filter.flush()
    elif tail is not None:
        position.offset = reader.tail_offset(log, head.size, tail)
    return True


def _advance(reader: Reader, log: RankLog, position: _Position, emit: Emit) -> None:
    for _, lines, offset, pending in lines_of(reader, log, position.offset, position.pending):
        position.offset, position.pending = offset, pending
        kept = [kept for line, stamp in _dated(lines) for kept in position.filter.feed(line, stamp)]
        emit(log, kept)


def _finish(log: RankLog, position: _Position, emit: Emit) -> None:
    """The end of ``log``: the lines still held for a time (shown: the file was
    written since), and a last line without its newline."""
    rest = position.filter.flush()
    if position.pending:
        rest.append((position.pending, None))
        position.pending = b""
    emit(log, rest)


def follow(
    logs: list[RankLog],
    reader: Reader,
    tail: int | None,
    since: float | None,
    emit: Emit,
    poll_s: float = FOLLOW_POLL_S,
) -> None:
    """Print each log (its last ``tail`` lines, those since ``since``) and then every
    line added to it, until the generation ends; partial lines wait for their newline,
    so two ranks' lines never interleave mid-line."""
    positions = {log.rank: _Position() for log in logs}
    while True:
        ended = reader.ended(logs)
        for log in logs:
            position = positions[log.rank]
            if position.started or _start(reader, log, tail, since, position):
                _advance(reader, log, position, emit)
                # Caught up: what is held is shown, and every line from now on is new.
                emit(log, position.filter.flush())
        if ended:
            for log in logs:
                _finish(log, positions[log.rank], emit)
            return
        time.sleep(poll_s)


def show(
    logs: list[RankLog],
    spec: JobSpec,
    tail: int | None,
    follow_: bool,
    *,
    since: float | None = None,
    as_json: bool = False,
    remote: RemoteLogs | None = None,
) -> list[str]:
    """Print ``logs`` on stdout (followed, with ``follow_``). Returns the logs that
    could not be read, one line each (the others are printed all the same).
    ``remote`` reads the logs on ssh and Slurm nodes (closed at the end)."""
    reader = Reader(spec, remote)
    try:
        emit = printer(logs, reader, as_json)
        if follow_:
            follow(logs, reader, tail, since, emit)
            return []
        problems: list[str] = []
        for log in logs:
            try:
                position = _Position()
                if not _start(reader, log, tail, since, position):
                    problems.append(_missing(log))
                    continue
                _advance(reader, log, position, emit)
                _finish(log, position, emit)
            except LogsProblem as exc:
                problems.append(str(exc))
        return problems
    finally:
        reader.close()


def _missing(log: RankLog) -> str:
    if not log.local or log.others:
        asked = ", ".join([log.node, *(n for n, _ in log.others)])
        return (
            f"rank {log.rank}: no log at {log.path} on node {asked} (or the rank has not started)"
        )
    where = (
        "on this machine; a local node's logs are on the worker's machine"
        if log.node_spec is not None
        else f"here; node {log.node} is not in the spec, so it cannot be reached"
    )
    return f"rank {log.rank}: no log at {log.path} {where} (or the rank has not started)"
