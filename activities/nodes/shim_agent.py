"""A node agent that drives ``shim.sh`` over any transport that can run ``sh -s``.

The rank mechanics live in one POSIX sh script (``shim.sh``) so that a node needs
nothing from Lazarus installed; this class only builds the script's input and
reads its JSON lines. Transports (paramiko for ssh nodes, a local subprocess for
tests and for running the exact remote code path on this machine) implement
:meth:`ShimAgent._run`, and nothing else.

Injection safety: the whole request travels on the shell's stdin as the shim
followed by ``shim_main ARG...`` lines whose every argument is ``shlex.quote``-d,
and the remote login shell only ever sees the fixed command ``sh -s``. A spec
value (command, env, path) is therefore always a single literal word.

Secrecy: a rank's environment (which may carry ``pass_env`` secrets) is never an
argument of any process, since every user on a node can read ``/proc/PID/cmdline``.
It goes to ``shim_main start`` as a quoted here-document on its stdin, and from there
down a pipe into the rank (see ``SHIM_ENV_LOADER`` in ``shim.sh``).

Warm starts (``warm_start``): one round trip runs the shim's ``warm``, which runs
:mod:`activities.nodes.warm` on the node with the request on its stdin: the
run's zygote there is started when needed (detached, like a rank) and the ranks are
forked from it. Ranks it answers cold (a dead or refusing zygote, a failed preload,
Lazarus not importable by the ranks' interpreter) are then started by ``start``
exactly as without ``warm_start``, with the reason recorded.

Rejoin (``rejoin``): the shim's ``rejoin`` runs :mod:`activities.nodes.carry` on the node
the same way (the ranks' interpreter, the :class:`CarryRequest` on stdin), so a
node's survivors are checked, fenced around and asked to rejoin where they run.
Where that cannot run, every older generation on the node is stopped instead and
its ranks start afresh (:meth:`ShimAgent.carry_survivors`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from activities.nodes.agent import (
    HANG_EVIDENCE_TIMEOUT_S,
    LogChunk,
    MemorySnapshot,
    NodeAgent,
    NodeRefused,
    NodeStatus,
    NodeUnreachable,
    PreflightRequest,
    PreflightResult,
    RankRecord,
    RestoreEnd,
    ShimError,
)
from activities.nodes.code_root import RANK_HELPER_INSTALL
from activities.nodes.fencing import fence_this_machine
from activities.nodes.gpu_health import gpu_problems, parse_gpu_health
from activities.nodes.node_records import (
    CarryRequest,
    CarryResult,
    NodeStopResult,
    RankLaunch,
    StartedRank,
    WarmStart,
)
from activities.nodes.rundir import GenerationDir
from activities.nodes.shim_calls import (
    ShimCall,
    ShimReply,
    json_lines,
    node_warm_request,
    rejoin_call,
    shim_script,
    start_call,
    warm_call,
)
from activities.nodes.warm_starts import (
    CLAIM_WAIT_S,
    FIRST_START_WAIT_S,
    FORK_TIMEOUT_S,
    PrewarmAnswer,
    WarmAnswer,
)
from activities.nodes.zygote_socket import zygote_dir
from lazarus.domain.checkpoint_layout import parse_step_dir
from lazarus.domain.process_groups import UnkillableGroup
from lazarus.domain.spec import NodeSpec
from lazarus.rank.hang_evidence import EvidenceTarget, HangEvidence, request_json

STATUS_TIMEOUT_S = 10.0
START_TIMEOUT_S = 30.0
"""Per rank on top of the base: the shim waits up to 30 s for each wrapper's pid file."""
STOP_EXTRA_S = 30.0
"""Beyond the grace: the SIGKILL wait (10 s), the launch-lock wait and the round trip."""
ZYGOTE_STOP_S = 12.0
"""For ``stop-zygote`` on top of the status timeout: SIGTERM, 5 s, SIGKILL, 5 s."""
PREWARM_TIMEOUT_S = 20.0
"""For a spare's prewarm: the node's interpreter starts and starts the zygote, which
returns before its preload (the launch waits for this beside its own ranks' starts)."""
HEALTH_OUTPUT_MAX = 1 << 20
"""``nvidia-smi -q`` on 8 GPUs is ~100 KiB; the GPU count needs all of it."""
LOG_READ_MARK = b'{"log_size":'
"""How the shim's ``read`` answer begins: its JSON line, before the log's bytes."""

_STATUS_PREFIX = re.compile(
    r'^\{"rank":(?P<rank>\d+),"pid":(?P<pid>\d+|null),"alive":(?P<alive>true|false),'
    r'"stopped":(?P<stopped>true|false),'
)


def no_warm_answer_reason(noise: list[str]) -> str:
    """Why a node's warm start answered nothing, for the rank's ``cold_reason``.

    The usual cause is an interpreter that cannot import Lazarus (the ranks run a
    python of their own, without the checkout on its path): say so in those words
    rather than leave the reader to decode a ``ModuleNotFoundError``."""
    said = " | ".join(noise[-3:]) or "no output"
    missing = [m.group(1) for line in noise if (m := _MISSING_MODULE.search(line))]
    if missing and missing[-1].split(".")[0] == "lazarus":
        return (
            f"the ranks' interpreter cannot import lazarus, so no warm start ({said}); "
            f"{RANK_HELPER_INSTALL}"
        )
    if missing or any("ModuleNotFoundError" in line for line in noise):
        # activities, pydantic: the node-side warm start is the controller's code, and
        # ranks never get the controller's site-packages (code_root.lazarus_code_root).
        return (
            f"the ranks' interpreter cannot import lazarus, so no warm start ({said}): "
            "warm starts on this node need lazarus-train in the job's environment, or "
            "a controller run from a checkout"
        )
    return f"no answer from the node's warm start ({said})"


_MISSING_MODULE = re.compile(r"No module named '?([\w.]+)'?")


def carry_through_shim(
    request: CarryRequest,
    call: Callable[[list[list[str] | ShimCall], float], ShimReply],
    extra_timeout_s: float = 0.0,
) -> CarryResult | str:
    """Run the shim's ``rejoin`` for ``request`` through ``call`` (ssh, or ``srun`` on
    a Slurm node, which adds ``extra_timeout_s``): the node's answer, or why there is
    none, for :func:`refused_all`."""
    outcome = _carry_records(request, call, extra_timeout_s)
    return outcome if isinstance(outcome, str) else outcome[0]


def _carry_records(
    request: CarryRequest,
    call: Callable[[list[list[str] | ShimCall], float], ShimReply],
    extra_timeout_s: float = 0.0,
) -> tuple[CarryResult, list[dict[str, Any]]] | str:
    """:func:`carry_through_shim`, with every record the node answered (a carry with
    ``start`` answers its warm starts after the carry)."""
    try:
        invocation = rejoin_call(request)
    except ValueError as exc:
        return str(exc)
    # The fencing's SIGKILL wait, two lock waits and the interpreter's start; with a
    # start, a warm start's own bound per rank.
    timeout = request.kill_wait_s + 2 * request.lock_timeout_s + START_TIMEOUT_S
    if request.start is not None:
        timeout += FIRST_START_WAIT_S + (FORK_TIMEOUT_S + CLAIM_WAIT_S) * len(request.start.ranks)
    reply = call([invocation], timeout + extra_timeout_s)
    records, noise = json_lines(reply.output)
    answer = carry_answer(records)
    if answer is not None:
        return answer, records
    error = next((str(r["error"]) for r in records if "error" in r), None)
    return error or f"no answer ({' | '.join(noise[-3:]) or 'no output'})"


def refused_all(fallback: CarryResult, request: CarryRequest, node: str, why: str) -> CarryResult:
    """``fallback`` (everything older fenced, nothing carried) naming why each asked-for
    rank could not be carried on ``node``."""
    refused = [f"rank {r}: cannot carry it on node {node}: {why}" for r in request.ranks]
    return fallback.model_copy(update={"refused": refused})


def carry_answer(records: list[dict[str, Any]]) -> CarryResult | None:
    """The ``rejoin`` line that is a :class:`CarryResult`, or None."""
    for record in records:
        if "carried" in record:
            with contextlib.suppress(ValueError):  # pydantic's ValidationError is one
                return CarryResult.model_validate(record)
    return None


def warm_answers(records: list[dict[str, Any]]) -> dict[int, WarmAnswer]:
    """The ``warm`` lines that are answers, by rank (anything else is ignored)."""
    answers: dict[int, WarmAnswer] = {}
    for record in records:
        with contextlib.suppress(ValueError):  # pydantic's ValidationError is one
            answer = WarmAnswer.model_validate(record)
            started = None not in (answer.pid, answer.pgid, answer.start_ticks)
            if answer.cold_reason is not None or started:
                answers[answer.rank] = answer
    return answers


def _status_record(line: str) -> dict[str, Any] | None:
    """A status line; when an embedded file is not valid JSON (a torn foreign write),
    the fixed prefix still gives liveness, and the files count as absent this poll."""
    try:
        value = json.loads(line, strict=False)
    except json.JSONDecodeError:
        match = _STATUS_PREFIX.match(line)
        if match is None:
            return None
        pid = match.group("pid")
        return {
            "rank": int(match.group("rank")),
            "pid": None if pid == "null" else int(pid),
            "alive": match.group("alive") == "true",
            "stopped": match.group("stopped") == "true",
        }
    return value if isinstance(value, dict) else None


def _unkillable_groups(
    node: str, summary: dict[str, Any], waited_s: float
) -> list[UnkillableGroup]:
    """The stop summary's survivors of SIGKILL, reported rather than retried forever."""
    pids: dict[int, list[int]] = {}
    for pair in summary.get("survivor_pids") or []:
        if isinstance(pair, list) and len(pair) == 2:
            pids.setdefault(int(pair[0]), []).append(int(pair[1]))
    groups = []
    for pgid in (int(g) for g in summary.get("survivors") or []):
        members = sorted(pids.get(pgid, []))
        groups.append(
            UnkillableGroup(
                node=node,
                pgid=pgid,
                pids=members,
                reason=(
                    f"process group {pgid} on node {node} still alive {waited_s:g} s after "
                    f"SIGKILL (pids {', '.join(map(str, members)) or 'unknown'}): a process "
                    "in uninterruptible sleep (state D: a GPU after an Xid, a hung "
                    "filesystem) dies only when the kernel lets it go"
                ),
            )
        )
    return groups


def _object_or_none(value: object) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


class ShimAgent(NodeAgent):
    """Everything but the transport. Subclasses implement :meth:`_run`."""

    status_timeout_s: float = STATUS_TIMEOUT_S
    """For poll, tail and write: a node that cannot answer a few file reads in this long
    is as good as unreachable for supervision."""
    starts_zygote: bool = True
    """Whether the node's ``warm`` starts the run's zygote when there is none (False
    where the agent starts it itself: Slurm, as a job step)."""

    @abstractmethod
    def _run(self, script: bytes, timeout_s: float) -> ShimReply:
        """Run ``sh -s`` on the node with ``script`` as its stdin; one round trip.
        Raises :class:`NodeUnreachable` (network, timeout) or :class:`NodeRefused`
        (host key, authentication)."""

    def _prelude(self) -> str:
        """Shell lines run before the shim (e.g. which sh runs the rank wrapper)."""
        return ""

    def _call(self, invocations: list[list[str] | ShimCall], timeout_s: float) -> ShimReply:
        return self._run(shim_script(invocations, self._prelude()), timeout_s)

    def _where(self) -> str:
        return f"node {self.node.name}"

    # --- NodeAgent -------------------------------------------------------------------

    def start_ranks(self, gen_dir: str, ranks: list[RankLaunch]) -> list[StartedRank]:
        if not ranks:
            return []
        invocations: list[list[str] | ShimCall] = [start_call(gen_dir, r) for r in ranks]
        reply = self._call(invocations, START_TIMEOUT_S * (1 + len(ranks)))
        records, noise = json_lines(reply.output)
        by_rank = {r.get("rank"): r for r in records}
        started: list[StartedRank] = []
        errors: list[str] = []
        for launch in ranks:
            record = by_rank.get(launch.rank)
            if record is None:
                errors.append(f"rank {launch.rank}: no answer from the shim")
            elif "error" in record:
                errors.append(str(record["error"]))
            else:
                started.append(
                    StartedRank(
                        rank=launch.rank,
                        pid=int(record["pid"]),
                        pgid=int(record["pgid"]),
                        start_ticks=int(record["start_ticks"]),
                        log_file=str(record["log_file"]),
                        adopted=bool(record.get("adopted", False)),
                    )
                )
        if errors:
            detail = f" ({'; '.join(noise[:3])})" if noise else ""
            raise ShimError(f"{self._where()}: cannot start ranks: {'; '.join(errors)}{detail}")
        return started

    def start_ranks_warm(
        self, gen_dir: str, ranks: list[RankLaunch], warm: WarmStart
    ) -> list[StartedRank]:
        if not ranks:
            return []
        try:
            call = warm_call(gen_dir, self.node.name, ranks, warm, self.starts_zygote)
        except ValueError as exc:
            return self._start_cold(gen_dir, [(r, str(exc)) for r in ranks])
        # The run's first launch waits for the zygote's preload; each fork is bounded.
        per_rank = FORK_TIMEOUT_S + CLAIM_WAIT_S
        reply = self._call([call], FIRST_START_WAIT_S + per_rank * len(ranks) + START_TIMEOUT_S)
        records, noise = json_lines(reply.output)
        answers = warm_answers(records)
        error = next((str(r["error"]) for r in records if "error" in r), None)
        why = error or no_warm_answer_reason(noise)
        started: dict[int, StartedRank] = {}
        cold: list[tuple[RankLaunch, str]] = []
        for launch in ranks:
            answer = answers.get(launch.rank)
            if answer is None or answer.cold_reason is not None:
                cold.append((launch, answer.cold_reason if answer and answer.cold_reason else why))
                continue
            fields = answer.model_dump(exclude={"cold_reason"})
            log_file = f"{gen_dir.rstrip('/')}/rank-{launch.rank}.log"
            started[launch.rank] = StartedRank(**fields, log_file=log_file)
        for rank in self._start_cold(gen_dir, cold):
            started[rank.rank] = rank
        return [started[r.rank] for r in ranks]

    def prewarm(self, launch: RankLaunch, warm: WarmStart) -> str | None:
        """The shim's ``warm`` with ``prewarm``
        (:func:`activities.nodes.warm_starts.prewarm_zygote`): one round trip that
        starts the zygote detached and does not wait for its preload. It holds the
        zygote directory's lock, not the generation's: on a filesystem the nodes
        share, the generation's is held by the other nodes' launches while their
        zygotes preload."""
        directory = str(zygote_dir(warm.run_root, self.node.name))
        try:
            call = warm_call(directory, self.node.name, [launch], warm, self.starts_zygote, True)
        except ValueError as exc:
            return str(exc)
        try:
            reply = self._call([call], PREWARM_TIMEOUT_S)
        except (NodeUnreachable, NodeRefused) as exc:
            return str(exc)
        records, noise = json_lines(reply.output)
        for record in records:
            with contextlib.suppress(ValueError):  # pydantic's ValidationError is one
                return PrewarmAnswer.model_validate(record).reason
        error = next((str(r["error"]) for r in records if "error" in r), None)
        return error or no_warm_answer_reason(noise)

    def _start_cold(self, gen_dir: str, ranks: list[tuple[RankLaunch, str]]) -> list[StartedRank]:
        """``start`` with each rank's reason for starting cold (none for one adopted:
        its pid file was there, so it was not started now)."""
        reasons = {launch.rank: reason for launch, reason in ranks}
        return [
            r if r.adopted else r.model_copy(update={"cold_reason": reasons[r.rank]})
            for r in self.start_ranks(gen_dir, [launch for launch, _ in ranks])
        ]

    def carry_survivors(self, request: CarryRequest) -> CarryResult:
        outcome = carry_through_shim(request, self._call)
        if isinstance(outcome, CarryResult):
            return outcome
        # Nothing was carried: fence everything older here, so the ranks start afresh.
        return refused_all(super().carry_survivors(request), request, self.node.name, outcome)

    def carry_and_start(
        self, request: CarryRequest, gen_dir: str, launches: list[RankLaunch], warm: WarmStart
    ) -> tuple[CarryResult, dict[int, StartedRank]]:
        """One ``rejoin`` whose node process then forks the other ranks warm
        (``CarryRequest.start``). Ranks it answered cold, or not at all, are left to
        the launcher's usual start; a node that answers no carry (older code that
        refuses ``start``, or one that cannot run it) gets the plain carry."""
        if not launches:
            return self.carry_survivors(request), {}
        try:
            start = node_warm_request(gen_dir, self.node.name, launches, warm, self.starts_zygote)
        except ValueError:
            return self.carry_survivors(request), {}
        outcome = _carry_records(request.model_copy(update={"start": start}), self._call)
        if isinstance(outcome, str):
            # A node whose code predates ``start`` refuses the whole request before it
            # acts: carry alone, as before (idempotent), and start the rest later.
            return self.carry_survivors(request), {}
        result, records = outcome
        started: dict[int, StartedRank] = {}
        for rank, answer in warm_answers(records).items():
            if answer.cold_reason is None and answer.pid is not None:
                fields = answer.model_dump(exclude={"cold_reason"})
                log_file = f"{gen_dir.rstrip('/')}/rank-{rank}.log"
                started[rank] = StartedRank(**fields, log_file=log_file)
        return result, started

    def poll(self, gen_dir: str, ranks: list[int]) -> NodeStatus:
        started = time.monotonic()
        try:
            reply = self._call([["status", gen_dir, *map(str, ranks)]], self.status_timeout_s)
        except (NodeUnreachable, NodeRefused) as exc:
            return NodeStatus(
                node=self.node.name,
                reachable=False,
                error=str(exc),
                observed_at=time.time(),
                round_trip_s=time.monotonic() - started,
            )
        seen: dict[int, RankRecord] = {}
        for line in reply.output.decode("utf-8", errors="replace").splitlines():
            if not line.startswith('{"rank":'):
                continue
            value = _status_record(line)
            if value is None:
                continue
            pid = value.get("pid")
            seen[int(value["rank"])] = RankRecord(
                rank=int(value["rank"]),
                pid=pid if isinstance(pid, int) else None,
                alive=value.get("alive") is True,
                stopped=value.get("stopped") is True,
                exit=_object_or_none(value.get("exit")),
                heartbeat=_object_or_none(value.get("heartbeat")),
            )
        missing = [r for r in ranks if r not in seen]
        if missing:
            _, noise = json_lines(reply.output)
            return NodeStatus(
                node=self.node.name,
                reachable=False,
                error=(
                    f"{self._where()}: incomplete status (no line for ranks {missing}, "
                    f"exit {reply.exit_code}): {' | '.join(noise[:3]) or 'no output'}"
                ),
                observed_at=time.time(),
                round_trip_s=reply.round_trip_s,
            )
        return NodeStatus(
            node=self.node.name,
            reachable=True,
            ranks=[seen[r] for r in ranks],
            observed_at=time.time(),
            round_trip_s=reply.round_trip_s,
        )

    def fence_here(
        self,
        older: list[GenerationDir],
        others: list[GenerationDir],
        keep: frozenset[int],
        kill_wait_s: float,
        lock_timeout_s: float,
    ) -> list[UnkillableGroup]:
        """This machine's net too: the node fences its own run directory when it
        carries survivors or stops, but a node may share the controller's filesystem."""
        return fence_this_machine(older, others, keep, kill_wait_s, lock_timeout_s)

    def stop(
        self,
        run_root: str,
        keep_generation: int | None,
        grace_s: float,
        kill_wait_s: float = 10.0,
    ) -> NodeStopResult:
        keep = "none" if keep_generation is None else str(keep_generation)
        kill_cs = str(max(int(kill_wait_s * 100), 0))
        try:
            reply = self._call(
                [["stop", run_root, keep, f"{max(grace_s, 0.0):.2f}", kill_cs]],
                grace_s + STOP_EXTRA_S + max(kill_wait_s - 10.0, 0.0),
            )
        except (NodeUnreachable, NodeRefused) as exc:
            return NodeStopResult(node=self.node.name, reachable=False, error=str(exc))
        records, noise = json_lines(reply.output)
        summary = next((r for r in records if "signalled" in r), None)
        if summary is None:
            error = next((str(r["error"]) for r in records if "error" in r), None)
            raise ShimError(
                f"{self._where()}: stop failed: {error or ' | '.join(noise[:3]) or 'no output'}"
            )
        unkillable = _unkillable_groups(self.node.name, summary, kill_wait_s)
        last_step = summary.get("last_step")
        return NodeStopResult(
            node=self.node.name,
            reachable=True,
            signalled_groups=int(summary["signalled"]),
            killed_groups=int(summary["killed"]),
            last_step=last_step if isinstance(last_step, int) else None,
            generations=[int(g) for g in summary.get("generations", [])],
            unkillable=unkillable,
        )

    def end_run(self, run_root: str, memory_dirs: list[str]) -> None:
        calls: list[list[str] | ShimCall] = [["stop-zygote", run_root, self.node.name]]
        calls += [["end-run", d] for d in memory_dirs]
        reply = self._call(calls, self.status_timeout_s + ZYGOTE_STOP_S)
        records, noise = json_lines(reply.output)
        removed = {r.get("removed") for r in records}
        if not any("zygotes_stopped" in r for r in records):
            error = next((str(r["error"]) for r in records if "error" in r), None)
            raise ShimError(
                f"{self._where()}: cannot stop the zygote of {run_root}: "
                f"{error or ' | '.join(noise[:3]) or 'no output'}"
            )
        if not removed.issuperset(memory_dirs):
            error = next((str(r["error"]) for r in records if "error" in r), None)
            raise ShimError(
                f"{self._where()}: cannot remove the memory tier {', '.join(memory_dirs)}: "
                f"{error or ' | '.join(noise[:3]) or 'no output'}"
            )

    def log_tail(self, gen_dir: str, rank: int, max_bytes: int = 65536) -> str:
        reply = self._call(
            [["tail", gen_dir, str(rank), str(max(max_bytes, 0))]], self.status_timeout_s
        )
        return reply.output.decode("utf-8", errors="replace")

    def log_read(self, gen_dir: str, rank: int, offset: int, max_bytes: int) -> LogChunk:
        """The shim's ``read``: a JSON line with the file's size and time, then the
        raw bytes."""
        argv = ["read", gen_dir, str(rank), str(max(offset, 0)), str(max(max_bytes, 0))]
        output = self._call([argv], self.status_timeout_s).output
        start = output.find(LOG_READ_MARK)
        head, newline, data = output[max(start, 0) :].partition(b"\n")
        try:
            record = json.loads(head) if start >= 0 and newline else None
        except ValueError:
            record = None
        if not isinstance(record, dict) or "error" in record:
            said = record.get("error") if isinstance(record, dict) else output[:200]
            raise ShimError(f"{self._where()}: cannot read the log of rank {rank}: {said!r}")
        size, mtime = record.get("log_size"), record.get("mtime")
        return LogChunk(
            data=data,
            size=size if isinstance(size, int) else None,
            mtime=float(mtime) if isinstance(mtime, int | float) else None,
        )

    def preflight(self, request: PreflightRequest) -> PreflightResult:
        timeout = max(1, int(request.timeout_s + 0.999))
        argv = [
            "preflight",
            request.interpreter,
            request.workdir,
            request.disk_path,
            str(timeout),
            str(HEALTH_OUTPUT_MAX),
        ]
        if request.health_command:
            # Like the local checks: the command learns which node it is checking.
            health = list(request.health_command)
            if "=" in health[0]:
                health = ["/bin/sh", "-c", 'exec "$@"', "lazarus-health", *health]
            argv += ["--", "env", "--", f"LAZARUS_NODE={self.node.name}", *health]
        prelude = self._prelude()
        if request.search_path:
            prelude += f"PATH={shlex.quote(request.search_path)}; export PATH\n"
        reply = self._run(shim_script([argv], prelude), timeout + self.status_timeout_s + 5)
        records, noise = json_lines(reply.output)
        report = next((r for r in records if "workdir_exists" in r), None)
        if report is None:
            raise ShimError(
                f"{self._where()}: preflight failed: {' | '.join(noise[:3]) or 'no output'}"
            )
        problems: list[str] = []
        name = self.node.name
        if report.get("interpreter") is None:
            problems.append(
                f"interpreter: {request.interpreter!r} not found on node {name} (PATH of a "
                "non-interactive session there); install it or give an absolute path"
            )
        if report.get("workdir_exists") is not True:
            problems.append(
                f"workdir: {request.workdir} does not exist on node {name}; create it or "
                "sync the code there"
            )
        free_kb = report.get("free_kb")
        # Decimal GB, as the local checks measure it.
        free_gb = free_kb * 1024 / 1e9 if isinstance(free_kb, int) else None
        if free_gb is None:
            problems.append(
                f"disk: cannot measure free space of {request.disk_path} on node {name}"
            )
        elif free_gb < request.min_free_disk_gb:
            problems.append(
                f"disk: {free_gb:.1f} GB free under {report.get('disk_path')} on node {name}, "
                f"need {request.min_free_disk_gb:g} GB; free space or lower "
                "preflight.min_free_disk_gb"
            )
        gpus = None
        output = str(report.get("health_output") or "")
        if request.health_command:
            code = report.get("health_exit")
            if report.get("health_timed_out") is True:
                problems.append(
                    f"health_command: timed out after {timeout} s on node {name}; "
                    "raise preflight.timeout_s or fix the check"
                )
            elif code != 0:
                last = next((ln for ln in reversed(output.splitlines()) if ln.strip()), "")
                problems.append(
                    f"health_command: exited {code} on node {name}"
                    + (f": {last.strip()[:200]}" if last else "")
                )
            gpus = parse_gpu_health(output)
            if gpus is not None:
                problems.extend(gpu_problems(gpus, name))
        return PreflightResult(
            node=name,
            ok=not problems,
            problems=problems,
            free_disk_gb=free_gb,
            gpus=gpus,
            round_trip_s=reply.round_trip_s,
            program_missing=report.get("interpreter") is None,
        )

    def write_file(self, path: str, content: str) -> None:
        reply = self._call([["write", path, content]], self.status_timeout_s)
        records, noise = json_lines(reply.output)
        if not any("written" in r for r in records):
            error = next((str(r["error"]) for r in records if "error" in r), None)
            raise ShimError(
                f"{self._where()}: cannot write {path}: "
                f"{error or ' | '.join(noise[:3]) or 'no output'}"
            )

    def memory_snapshots(self, root: str) -> list[MemorySnapshot]:
        return self.memory_snapshots_in([root])[0]

    def memory_snapshots_in(self, roots: list[str]) -> list[list[MemorySnapshot]]:
        """One shim call with a ``memory`` per root; each line names its root."""
        reply = self._call([["memory", root] for root in roots], self.status_timeout_s)
        records, noise = json_lines(reply.output)
        error = next((str(r["error"]) for r in records if "error" in r), None)
        if error is not None or reply.exit_code != 0:
            raise ShimError(
                f"{self._where()}: cannot list memory snapshots in {', '.join(roots)}: "
                f"{error or ' | '.join(noise[:3]) or f'exit {reply.exit_code}'}"
            )
        return [memory_snapshot_records(root, records) for root in roots]

    def restore_end(self, end: RestoreEnd) -> dict[str, Any]:
        """The shim's ``replica-restore``: the node's own interpreter runs the end,
        the request (its key) on stdin; the bytes go node to node, not through here."""
        for text in (end.search_path, end.python_path):
            if "\n" in text:
                return {"error": "the ranks' PATH or PYTHONPATH holds a newline"}
        call = ShimCall(
            argv=["replica-restore", end.verb, end.python, end.workdir],
            stdin=f"{end.search_path}\n{end.python_path}\n{end.request_json()}\n",
        )
        reply = self._call([call], end.timeout_s + START_TIMEOUT_S)
        return end.answer(reply.output.decode("utf-8", errors="replace"))

    def hang_evidence(self, gen_dir: str, targets: list[EvidenceTarget]) -> HangEvidence:
        return self.hang_evidence_with(gen_dir, targets, self.node_python())

    def hang_evidence_with(
        self, gen_dir: str, targets: list[EvidenceTarget], python: str
    ) -> HangEvidence:
        """The shim's ``hang-evidence``: ``python`` (the node's interpreter, with
        ``lazarus-rank``) runs :mod:`lazarus.rank.hang_evidence` on the node, on the
        ranks' PATH (a node's ``env.PATH``, else its own), so py-spy reads the ranks
        there and the flight recorder is asked in the node's generation directory.
        One round trip within :data:`HANG_EVIDENCE_TIMEOUT_S`; whatever goes wrong is
        one line."""
        where = f"node {self.node.name}"
        search_path = self.node.env.get("PATH", "")
        if "\n" in search_path:
            return HangEvidence(stacks=[f"rank stacks on {where}: its PATH holds a newline"])
        call = ShimCall(
            argv=["hang-evidence", python, "/"],
            stdin=f"{search_path}\n\n{request_json(gen_dir, targets, where)}\n",
        )
        try:
            reply = self._call([call], HANG_EVIDENCE_TIMEOUT_S)
        except (NodeUnreachable, NodeRefused, OSError) as exc:
            return HangEvidence(stacks=[f"rank stacks on {where}: no answer ({exc})"[:400]])
        records, noise = json_lines(reply.output)
        answer = next((r for r in reversed(records) if "hang_evidence" in r), None)
        try:
            evidence = HangEvidence.from_json(answer["hang_evidence"] if answer else None)
        except ValueError:
            said = next((str(r["error"]) for r in records if "error" in r), None)
            said = said or " | ".join(noise[-3:]) or f"exit {reply.exit_code}, no output"
            return HangEvidence(stacks=[f"rank stacks on {where}: not read ({said})"[:400]])
        evidence.node = self.node.name
        return evidence


def memory_snapshot_records(root: str, records: list[dict[str, Any]]) -> list[MemorySnapshot]:
    """The shim's ``memory`` lines of ``root`` as records (a line that is not one, or
    is another root's, is ignored)."""
    found: list[MemorySnapshot] = []
    for record in records:
        if record.get("root", root) != root:
            continue
        name = record.get("memory_step")
        step = parse_step_dir(name) if isinstance(name, str) else None
        sizes = record.get("sizes")
        if step is None or not isinstance(sizes, dict):
            continue
        found.append(
            MemorySnapshot(
                step=step,
                path=f"{root.rstrip('/')}/{name}",
                manifest=_object_or_none(record.get("manifest")),
                sizes={str(k): v for k, v in sizes.items() if isinstance(v, int)},
            )
        )
    return sorted(found, key=lambda snapshot: snapshot.step)


_EXEC_WITH_DEFAULT_SIGNALS = (
    "import os, signal, sys\n"
    "for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP):\n"
    "    signal.signal(s, signal.SIG_DFL)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)
"""Starts the shell with default signal dispositions, as sshd does for the ssh agent.
A signal ignored when sh starts can never be reset by it (POSIX), so a worker (or a
test runner) that ignores SIGINT would hand that to every rank the shim starts."""


class LocalShimAgent(ShimAgent):
    """The shim run on this machine through ``sh -s``: the ssh agent's exact code path
    without a network, for tests and for nodes where ssh would only add latency."""

    def __init__(self, node: NodeSpec, shell: str = "/bin/sh") -> None:
        super().__init__(node)
        self.shell = shell

    def _prelude(self) -> str:
        # The wrapper runs under the same shell, so a dash test covers it too.
        return f"LAZARUS_SHIM_SH={shlex.quote(self.shell)}\n"

    def _run(self, script: bytes, timeout_s: float) -> ShimReply:
        started = time.monotonic()
        if not os.access(self.shell, os.X_OK):
            raise NodeUnreachable(f"{self._where()}: cannot run {self.shell}: not an executable")
        try:
            proc = subprocess.Popen(
                [sys.executable, "-S", "-c", _EXEC_WITH_DEFAULT_SIGNALS, self.shell, "-s"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise NodeUnreachable(f"{self._where()}: cannot run {self.shell}: {exc}") from exc
        try:
            output, _ = proc.communicate(script, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise NodeUnreachable(f"{self._where()}: no answer within {timeout_s:.0f} s") from None
        return ShimReply(proc.returncode, output, time.monotonic() - started)
