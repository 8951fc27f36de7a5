"""Warm starts on a local node: one zygote per node per run, ranks forked through it.

The zygote (:mod:`lazarus.activities.zygote`) lives in ``<run_root>/.zygote-<node>/``
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

Every cold start carries its reason (:class:`ZygoteUnavailable`), which the launcher
reports in ``LaunchResult.warm_start``. A forked rank writes the same pid, log and
exit files as a cold one, so supervise, stop and fencing do not change.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from lazarus.activities.rundir import GenerationDir, read_json
from lazarus.activities.zygote_client import (
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
from lazarus.domain import environment as env_names

ZYGOTE_DIR_PREFIX = ".zygote-"
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


def zygote_dir(run_root: str | Path, node: str) -> Path:
    return Path(run_root) / f"{ZYGOTE_DIR_PREFIX}{node}"


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
) -> Path:
    """The serving zygote's directory for ``node`` in this run, starting it when
    needed; :class:`ZygoteUnavailable` (with the reason) when this launch must start
    cold.

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
        start_zygote(directory, preload, standby, env=zygote_environment(env), cwd=cwd)
        if not first:
            raise ZygoteUnavailable(
                f"{exc.reason}; restarted it: warm starts resume from the next launch"
            ) from None
    if first:
        wait_serving(directory, FIRST_START_WAIT_S)
    serving_zygote(directory)
    return directory


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
