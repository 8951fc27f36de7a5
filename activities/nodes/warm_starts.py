"""Warm starts on a local node: one zygote per node per run, ranks forked through it.

The zygote (:mod:`activities.nodes.zygote`) lives in ``<run_root>/.zygote-<node>/``
(a dot directory, so run and generation scans never mistake it for either). It is
started by the first launch of the run that finds none, with the environment the
ranks share, and reused by every later generation. What happens when it is not
usable, per launch:

- never started for this run and node: start it and wait for it to serve (nothing
  runs yet, so waiting costs what a cold start would, and the framework is imported
  once instead of once per rank);
- dead (killed, crashed): restart it, start this launch's ranks cold, warm again from
  the next launch (a relaunch never waits on a zygote's preload);
- refusing (a preload failed, a guard tripped) or still preloading: cold.

A spare of the pool is prewarmed (:func:`prewarm_zygote`): its zygote is started
when the run launches elsewhere, and not waited for, so the launch that swaps the
spare in after a node loss finds it serving (or still preloading, which that first
launch then waits out as above) instead of starting it then.

Every cold start carries its reason (:class:`ZygoteUnavailable`), which the launcher
reports in ``LaunchResult.warm_start``. A forked rank writes the same pid, log and
exit files as a cold one, so supervise, stop and fencing do not change.

The same code serves ssh nodes, run there: the shim's ``warm`` subcommand runs
``python -m activities.nodes.warm`` on the node (the ranks' own interpreter)
with a :class:`NodeWarmRequest` on stdin (:func:`answer_request`), and it answers one
:class:`WarmAnswer` line per rank; the agent then cold-starts, through the shim, the
ranks answered cold. The request holds the ranks' environments, which may hold
secrets: stdin only, never argv.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, Protocol

from pydantic import BaseModel, ConfigDict

from activities.nodes.node_records import NodeAnswers, NodeWarmRequest, WarmRankRequest
from activities.nodes.rundir import GenerationDir, read_json
from activities.nodes.zygote_client import (
    PID_FILE_WAIT_S,
    ForkedRank,
    ZygoteUnavailable,
    fork_rank,
    live_zygote,
    serving_zygote,
    start_zygote,
    stop_zygote,
    wait_serving,
)
from activities.nodes.zygote_socket import ZYGOTE_DIR_PREFIX, zygote_dir
from lazarus.domain import environment as env_names

FORKED_MARK = "forked"
"""In a zygote directory: some rank of this run was forked here (see :func:`ensure_zygote`)."""
FIRST_START_WAIT_S = 90.0
"""How long a run's first launch on a node waits for its zygote to import ``preload``
(torch takes 2-10 s on a loaded machine)."""
FORK_TIMEOUT_S = 15.0
"""How long one fork request may take before the rank is started cold instead."""
CLAIM_WAIT_S = PID_FILE_WAIT_S
"""A retried launch that finds a rank claimed but without a pid file waits this long
for the claimant to write it before starting the rank cold."""

PER_RANK_ENV = frozenset(
    {
        env_names.RANK,
        env_names.LOCAL_RANK,
        env_names.GROUP_RANK,
        env_names.WORLD_SIZE,
        env_names.LOCAL_WORLD_SIZE,
        env_names.ROLE_RANK,
        env_names.ROLE_WORLD_SIZE,
        env_names.GROUP_WORLD_SIZE,
        env_names.MASTER_ADDR,
        env_names.MASTER_PORT,
        env_names.RESTART_COUNT,
        env_names.GENERATION,
        env_names.HEARTBEAT_FILE,
        env_names.CONTROL_FILE,
        env_names.RUN_DIR,
        env_names.RESUME_FROM,
        env_names.RESUME_STEP,
        env_names.NODE,
    }
)
"""Variables that differ per rank or per generation: not the zygote's to have."""

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")


def zygote_dirs(run_root: str | Path) -> list[Path]:
    """Every node's zygote directory of one run (on this machine)."""
    root = Path(run_root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob(f"{ZYGOTE_DIR_PREFIX}*") if p.is_dir())


def stop_run_zygotes(run_root: str | Path, nodes: Sequence[str] | None = None) -> list[str]:
    """Stop the zygotes of one run (all, or those of ``nodes``); the nodes whose zygote
    was alive. Ranks already forked are untouched: they live in their own sessions."""
    stopped = []
    for directory in zygote_dirs(run_root):
        node = directory.name.removeprefix(ZYGOTE_DIR_PREFIX)
        if (nodes is None or node in nodes) and stop_zygote(directory):
            stopped.append(node)
    return stopped


def zygote_environment(rank_env: Mapping[str, str]) -> dict[str, str]:
    """The environment every rank of the node shares: a rank's, minus what is its own.
    A fork request must match it in the variables read only at start-up."""
    return {k: v for k, v in rank_env.items() if k not in PER_RANK_ENV}


def warm_argv(command: Sequence[str], env: Mapping[str, str], workdir: str) -> list[str]:
    """The command with its interpreter spelled as the worker's (the zygote's) own.

    Only ``python``-named programs that resolve, on the ranks' PATH, to the worker's
    interpreter or to a ``python*`` beside it (the same environment) can be forked: a
    zygote runs the script in its own interpreter, with its own site-packages. Raises
    :class:`ZygoteUnavailable` (start cold) for anything else."""
    program = command[0]
    if os.sep in program:
        found: str | None = os.path.normpath(os.path.join(workdir, program))
    else:
        found = shutil.which(program, path=env.get("PATH", os.defpath))
    python = os.path.abspath(sys.executable)
    if found is None:
        raise ZygoteUnavailable(f"command {program!r} is not on the ranks' PATH")
    found = os.path.abspath(found)
    same_environment = _PYTHON_NAME.match(os.path.basename(found)) is not None and (
        os.path.dirname(found) == os.path.dirname(python)
    )
    if found != python and not same_environment:
        raise ZygoteUnavailable(
            f"command {program!r} (resolved: {found}) is not the worker's interpreter "
            f"{python}: only python scripts run by it can be forked"
        )
    return [python, *command[1:]]


def ensure_zygote(
    run_root: str | Path,
    node: str,
    preload: Sequence[str],
    standby: int,
    env: Mapping[str, str],
    cwd: str,
    start: bool = True,
    verbs: bool = False,
) -> Path:
    """The serving zygote's directory for ``node`` in this run, starting it when
    needed; :class:`ZygoteUnavailable` (with the reason) when this launch must start
    cold. With ``start`` False (Slurm: the zygote is a job step the node's agent
    starts) a zygote that is not alive is waited for on the run's first launch and
    otherwise answered cold, never started here.

    Until a rank of this run has been forked on the node (the run's first launch, or
    its retry), the launch waits for the zygote to serve: nothing is running, and the
    framework is then imported once instead of once per rank. Later launches never
    wait: a dead zygote is restarted for the next launch and this one starts cold."""
    directory = zygote_dir(run_root, node)
    directory.mkdir(parents=True, exist_ok=True)
    first = not (directory / FORKED_MARK).exists()
    try:
        live_zygote(directory)
    except ZygoteUnavailable as exc:
        if not start:
            if not first:
                raise
        else:
            env = zygote_environment(env)
            start_zygote(directory, preload, standby, env=env, cwd=cwd, verbs=verbs)
        if not first:
            raise ZygoteUnavailable(
                f"{exc.reason}; restarted it: warm starts resume from the next launch"
            ) from None
    if first:
        wait_serving(directory, FIRST_START_WAIT_S)
    serving_zygote(directory)
    return directory


def prewarm_zygote(
    run_root: str | Path,
    node: str,
    preload: Sequence[str],
    standby: int,
    launch: _Launch,
    verbs: bool = False,
) -> str | None:
    """Start ``node``'s zygote of the run unless one is alive, and return at once,
    before it serves: a spare's, started when the run's first generation launches
    elsewhere, so the launch that swaps the spare in finds it serving (or still
    preloading, which that launch then waits out, as any first launch on a node does:
    :func:`ensure_zygote`). ``launch`` is a rank as the node would start it; its
    environment, less the per-rank variables, is the zygote's.

    Returns None when the zygote runs, otherwise why it could not be started: a
    command that cannot be forked, a zygote that would not start. Nothing else
    changes: the spare's first launch then starts its zygote itself and waits, or
    starts cold with the same reason."""
    directory = zygote_dir(run_root, node)
    try:
        warm_argv(launch.command, launch.env, launch.workdir)
        directory.mkdir(parents=True, exist_ok=True)
        try:
            live_zygote(directory)
            return None  # started before: by an earlier launch, or a retried one
        except ZygoteUnavailable:
            pass
        env = zygote_environment(launch.env)
        start_zygote(directory, preload, standby, env=env, cwd=launch.workdir, verbs=verbs)
    except ZygoteUnavailable as exc:
        return exc.reason
    except (OSError, subprocess.SubprocessError) as exc:
        return f"zygote did not start in {directory}: {exc}"
    return None


def fork_one(
    directory: Path,
    gen: GenerationDir,
    rank: int,
    argv: list[str],
    env: Mapping[str, str],
    cwd: str,
) -> ForkedRank:
    """Fork ``rank`` of ``gen`` from the zygote in ``directory`` (its pid file written
    before this returns); :class:`ZygoteUnavailable` when it must start cold."""
    gen.exit_file(rank).unlink(missing_ok=True)
    forked = fork_rank(directory, rank, gen.path, argv, env, cwd, FORK_TIMEOUT_S)
    (directory / FORKED_MARK).touch()
    return forked


def await_claimed(gen: GenerationDir, rank: int) -> dict[str, object] | None:
    """The pid record of a rank an earlier, interrupted launch claimed (a fork request
    whose answer was lost), once its claimant writes it; None when it never comes (the
    claimant died before starting it, so a cold start cannot duplicate it) or when the
    rank was never claimed."""
    claim = gen.path / f"rank-{rank}.zygote.claim"
    if not claim.exists():
        return None
    deadline = time.monotonic() + CLAIM_WAIT_S
    while True:
        record = read_json(gen.pid_file(rank))
        if record is not None or time.monotonic() > deadline:
            return record
        time.sleep(0.02)


# --------------------------------------------------------------------------- a node's launch


class _Launch(Protocol):
    """One rank to start: :class:`activities.nodes.node_records.RankLaunch` or
    :class:`WarmRankRequest` (this module stays free of the agent's imports: it runs
    on every warm launch on an ssh node, where start-up time is relaunch time)."""

    @property
    def rank(self) -> int: ...
    @property
    def command(self) -> list[str]: ...
    @property
    def env(self) -> dict[str, str]: ...
    @property
    def workdir(self) -> str: ...


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WarmAnswer(_Model):
    """How one rank was started warm (forked, or adopted from its pid file), or why
    it must be started cold (``cold_reason``; then nothing of it runs)."""

    rank: int
    pid: int | None = None
    pgid: int | None = None
    start_ticks: int | None = None
    started_at: float | None = None
    adopted: bool = False
    warm: bool = False
    from_standby: bool = False
    cold_reason: str | None = None


class PrewarmAnswer(_Model):
    """A prewarm's outcome on the node: the zygote runs (``reason`` None), or why not."""

    prewarmed: bool
    reason: str | None = None


def _from_record(
    rank: int, record: Mapping[str, object], *, adopted: bool, warm: bool
) -> WarmAnswer:
    started_at = record.get("started_at")
    return WarmAnswer(
        rank=rank,
        pid=int(str(record["pid"])),
        pgid=int(str(record["pgid"])),
        start_ticks=int(str(record["start_ticks"])),
        started_at=float(started_at) if isinstance(started_at, (int, float)) else None,
        adopted=adopted,
        warm=warm,
    )


def warm_start_ranks(
    gen: GenerationDir,
    node: str,
    run_root: str,
    preload: Sequence[str],
    standby: int,
    launches: Sequence[_Launch],
    may_start: bool = True,
    verbs: bool = False,
) -> list[WarmAnswer]:
    """Start ``launches`` of ``node`` on this machine from the run's zygote: one answer
    per launch, in order. A retry adopts what an earlier attempt started, forked or
    cold (a rank claimed by a fork whose answer was lost gets its pid file within
    seconds); a rank answered with ``cold_reason`` was not started, and only the
    caller's cold start may start it."""
    gen.path.mkdir(parents=True, exist_ok=True)
    answers: list[WarmAnswer] = []
    zygote: Path | None = None
    reason: str | None = None
    for launch in launches:
        record = read_json(gen.pid_file(launch.rank)) or await_claimed(gen, launch.rank)
        if record is not None:
            claimed = (gen.path / f"rank-{launch.rank}.zygote.claim").exists()
            answers.append(_from_record(launch.rank, record, adopted=True, warm=claimed))
            continue
        try:
            argv = warm_argv(launch.command, launch.env, launch.workdir)
            if zygote is None and reason is None:
                zygote = ensure_zygote(
                    run_root, node, preload, standby, launch.env, launch.workdir, may_start, verbs
                )
            if zygote is None:
                raise ZygoteUnavailable(reason or "no zygote")
            forked = fork_one(zygote, gen, launch.rank, argv, launch.env, launch.workdir)
        except ZygoteUnavailable as exc:
            if zygote is None:
                reason = exc.reason  # the same for every rank of this node
            record = read_json(gen.pid_file(launch.rank))
            if record is not None:  # the zygote started it after all
                answers.append(_from_record(launch.rank, record, adopted=False, warm=True))
            else:
                answers.append(WarmAnswer(rank=launch.rank, cold_reason=exc.reason))
            continue
        answers.append(
            WarmAnswer(
                rank=launch.rank,
                pid=forked.pid,
                pgid=forked.pgid,
                start_ticks=forked.start_ticks,
                started_at=forked.started_at,
                warm=True,
                from_standby=forked.from_standby,
            )
        )
    return answers


def answer_start(request: NodeWarmRequest) -> list[WarmAnswer]:
    """Start the request's ranks warm (not a prewarm): one answer per rank, in order.
    Also run by a carry that starts its node's other ranks in the same process
    (``CarryRequest.start``, :mod:`activities.nodes.carry`)."""
    ranks = _with_env_file(request)
    if isinstance(ranks, str):
        return [WarmAnswer(rank=r.rank, cold_reason=ranks) for r in request.ranks]
    return warm_start_ranks(
        GenerationDir(Path(request.gen_dir)),
        request.node,
        request.run_root,
        request.preload,
        request.standby,
        ranks,
        request.start_zygote,
        verbs=True,
    )


def _with_env_file(request: NodeWarmRequest) -> list[WarmRankRequest] | str:
    """The ranks with ``env_from_file``'s values under their own (as the shim's cold
    start sets them), or why the file cannot be used."""
    if request.env_file is None:
        return request.ranks
    from activities.nodes.secret_env import SecretEnvError, read_env_file

    try:
        values = read_env_file(request.env_file)
    except SecretEnvError as exc:
        return str(exc)
    return [r.model_copy(update={"env": {**values, **r.env}}) for r in request.ranks]


def answer_request(stdin: bytes, out: BinaryIO) -> int:
    """The node side of the shim's ``warm`` (:mod:`activities.nodes.warm`): a
    :class:`NodeWarmRequest`, one :class:`WarmAnswer` JSON line per rank on ``out``, or
    one :class:`PrewarmAnswer` for a prewarm (``{"error": ...}`` for a bad request)."""
    answers = NodeAnswers("warm", out)
    request = answers.request(NodeWarmRequest, stdin)
    if request is None:
        return 2
    if request.prewarm:
        ranks = _with_env_file(request)
        if isinstance(ranks, str) or len(ranks) != 1:
            why = ranks if isinstance(ranks, str) else "prewarm: give exactly one rank"
            answers.say(PrewarmAnswer(prewarmed=False, reason=why).model_dump_json())
            return 0
        reason = prewarm_zygote(
            request.run_root, request.node, request.preload, request.standby, ranks[0], True
        )
        answers.say(PrewarmAnswer(prewarmed=reason is None, reason=reason).model_dump_json())
        return 0
    for answer in answer_start(request):
        answers.say(answer.model_dump_json())
    return 0
