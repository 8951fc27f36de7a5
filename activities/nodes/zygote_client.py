"""What the launcher calls to start ranks through a zygote (:mod:`activities.nodes.zygote`).

Every failure to get a warm start is one typed exception, :class:`ZygoteUnavailable`,
whose ``reason`` the launcher records (the incident says why the start was cold)
before it cold-starts the rank through rank_wrapper as before. A rank that
:func:`fork_rank` returns has exactly the files of a cold-started one
(``rank-N.pid``, ``rank-N.log``, ``rank-N.exit.json``), so supervise and stop
need no change.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from activities.nodes.procfs import is_alive, read_stat, signal_group
from activities.nodes.zygote import PID_FILE
from activities.nodes.zygote_socket import SOCKET_FILE, socket_address

PID_FILE_WAIT_S = 10.0
"""After a lost answer, how long to wait for the pid file of a rank the zygote claimed."""


class ZygoteUnavailable(Exception):
    """No warm start: cold-start the rank instead. ``reason`` says why, for the incident."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PreloadResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    ok: bool
    error: str | None
    seconds: float
    optional: bool = False
    """An import the zygote warms on its own (``zygote.IMPLIED_PRELOADS``): a failure
    is recorded and refuses nothing."""


class ZygoteInfo(BaseModel):
    """``zygote.pid``: who the zygote is and whether it serves."""

    model_config = ConfigDict(frozen=True)

    pid: int
    pgid: int
    start_ticks: int
    state: Literal["starting", "serving", "refused"]
    reason: str | None
    socket: str
    preload: list[str]
    preload_results: dict[str, PreloadResult]
    standby: int
    python: str
    native_threads: int | None
    started_at: float
    ready_at: float | None


class ZygoteStatus(BaseModel):
    model_config = ConfigDict(frozen=True)

    state: str
    reason: str | None
    idle_standby_pids: list[int]


class ForkedRank(BaseModel):
    """A rank started by the zygote: the fields of its ``rank-N.pid`` file."""

    model_config = ConfigDict(frozen=True)

    rank: int
    wrapper_pid: int
    pgid: int
    wrapper_start_ticks: int
    pid: int
    start_ticks: int
    started_at: float
    from_standby: bool
    """An idle standby took it (no fork on the critical path); False: forked on demand,
    or adopted from its pid file after a lost answer."""


def start_zygote(
    run_dir: str | Path,
    preload: Sequence[str],
    standby: int,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    python: str = sys.executable,
    verbs: bool = False,
) -> None:
    """Start a zygote for ``run_dir`` (returns at once: it preloads in the background).

    ``env`` should be the ranks' environment minus per-rank variables: requests must
    match it in every start-up-only variable (``zygote.STARTUP_ONLY_ENV``). ``verbs``:
    it serves the node-side verbs too (``zygote.VERBS``: on a node the shim reaches,
    where they would start an interpreter each; a local node's agent runs them in the
    worker, so its zygote, and every rank forked from it, import none of it)."""
    command = [
        python,
        "-m",
        "activities.nodes.zygote",
        "--run-dir",
        str(run_dir),
        "--preload",
        ",".join(preload),
        "--standby",
        str(standby),
        *(["--verbs"] if verbs else []),
    ]
    result = subprocess.run(
        command,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        timeout=30,
        check=False,
    )
    if result.returncode != 0:
        raise ZygoteUnavailable(
            f"zygote did not start (exit {result.returncode}): "
            f"{result.stderr.decode(errors='replace').strip()}"
        )


def read_zygote(run_dir: str | Path) -> ZygoteInfo | None:
    """``zygote.pid`` as written, alive or not; None when absent or unreadable."""
    try:
        return ZygoteInfo.model_validate_json((Path(run_dir) / PID_FILE).read_bytes())
    except (OSError, ValidationError):
        return None


def live_zygote(run_dir: str | Path) -> ZygoteInfo:
    """The zygote of ``run_dir`` if it is alive (start ticks checked), whatever its state."""
    info = read_zygote(run_dir)
    if info is None:
        raise ZygoteUnavailable(f"no zygote in {run_dir} (no readable {PID_FILE})")
    if not is_alive(info.pid, info.start_ticks):
        raise ZygoteUnavailable(f"zygote pid {info.pid} of {run_dir} is dead")
    return info


def serving_zygote(run_dir: str | Path) -> ZygoteInfo:
    info = live_zygote(run_dir)
    if info.state == "starting":
        raise ZygoteUnavailable(f"zygote pid {info.pid} is still preloading {info.preload}")
    if info.state == "refused":
        raise ZygoteUnavailable(f"zygote pid {info.pid} refuses to serve: {info.reason}")
    return info


def wait_serving(run_dir: str | Path, timeout_s: float) -> ZygoteInfo:
    """Wait until the zygote serves; ZygoteUnavailable if it refuses, dies or is late."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = read_zygote(run_dir)
        if info is not None and info.state != "starting":
            return serving_zygote(run_dir)
        if time.monotonic() > deadline:
            raise ZygoteUnavailable(f"zygote of {run_dir} not serving within {timeout_s:g} s")
        if info is not None:
            live_zygote(run_dir)  # raises at once when it died while preloading
        time.sleep(0.05)


def zygote_status(run_dir: str | Path, timeout_s: float = 5.0) -> ZygoteStatus:
    """Ask the zygote itself (its state and idle standbys)."""
    live_zygote(run_dir)
    reply = _ask(Path(run_dir), {"op": "status"}, timeout_s)
    if not reply.get("ok"):
        raise ZygoteUnavailable(str(reply.get("reason")))
    return ZygoteStatus.model_validate(reply)


def fork_rank(
    run_dir: str | Path,
    rank: int,
    gen_dir: str | Path,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | Path,
    timeout_s: float,
) -> ForkedRank:
    """Start ``argv`` as rank ``rank`` of ``gen_dir`` from the zygote of ``run_dir``.

    Raises :class:`ZygoteUnavailable` when the zygote is absent, dead, still
    starting, refusing (a failed preload, a guard, a non-python command, an
    environment it cannot honour) or silent for ``timeout_s``: the rank was then not
    started and the caller cold-starts it. When the answer is lost after the zygote
    took the request, the ``rank-N.zygote.claim`` file decides who owns the start
    (the zygote's standby or this caller), so a rank is never started twice."""
    serving_zygote(run_dir)
    request = {
        "op": "fork",
        "rank": rank,
        "gen_dir": str(Path(gen_dir).absolute()),
        "argv": list(argv),
        "env": dict(env),
        "cwd": str(Path(cwd).absolute()),
    }
    try:
        reply = _ask(Path(run_dir), request, timeout_s)
    except ZygoteUnavailable:
        adopted = _settle_lost_answer(Path(gen_dir), rank)
        if adopted is None:
            raise
        return adopted
    if not reply.get("ok"):
        raise ZygoteUnavailable(f"zygote refused rank {rank}: {reply.get('reason')}")
    try:
        return ForkedRank.model_validate(
            {**reply["record"], "from_standby": reply.get("from_standby", False)}
        )
    except (KeyError, TypeError, ValidationError) as exc:
        raise ZygoteUnavailable(f"zygote answered rank {rank} without a pid record: {exc}") from exc


def _ask(run_dir: Path, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    address, dir_fd = socket_address(run_dir)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout_s)
            conn.connect(address)
            conn.sendall(json.dumps(request).encode() + b"\n")
            buffer = bytearray()
            while b"\n" not in buffer:
                conn.settimeout(max(deadline - time.monotonic(), 0.001))
                chunk = conn.recv(65536)
                if not chunk:
                    raise ZygoteUnavailable("zygote closed the connection without an answer")
                buffer += chunk
    except TimeoutError as exc:
        raise ZygoteUnavailable(f"zygote gave no answer within {timeout_s:g} s") from exc
    except OSError as exc:
        raise ZygoteUnavailable(f"cannot reach zygote at {run_dir / SOCKET_FILE}: {exc}") from exc
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    try:
        reply = json.loads(buffer[: buffer.index(b"\n")])
    except ValueError as exc:
        raise ZygoteUnavailable(f"zygote answered malformed JSON: {exc}") from exc
    if not isinstance(reply, dict):
        raise ZygoteUnavailable(f"zygote answered {reply!r}, not an object")
    return reply


def _settle_lost_answer(gen_dir: Path, rank: int) -> ForkedRank | None:
    """Claim the rank for a cold start (None), or adopt the zygote's if it claimed first."""
    claim = gen_dir / f"rank-{rank}.zygote.claim"
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL, 0o644))
        return None  # ours: the zygote will refuse it from now on
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            return None
    deadline = time.monotonic() + PID_FILE_WAIT_S
    pid_file = gen_dir / f"rank-{rank}.pid"
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValidationError, ValueError):
            record = json.loads(pid_file.read_text())
            return ForkedRank.model_validate({**record, "from_standby": False})
        time.sleep(0.02)
    raise ZygoteUnavailable(
        f"rank {rank}: the zygote claimed it but wrote no pid file within {PID_FILE_WAIT_S:g} s; "
        "do not cold-start it blindly"
    )


def stop_zygote(run_dir: str | Path, grace_s: float = 5.0) -> bool:
    """Stop the zygote of ``run_dir``: SIGTERM, then SIGKILL after ``grace_s``, to its
    process group, and only if the group's leader is still the recorded zygote (start
    ticks checked: a reused pid is never signalled). Idle standbys exit on their own
    when the zygote's channel closes; ranks already handed out are untouched (their
    own sessions). True when a live zygote was stopped."""
    info = read_zygote(run_dir)
    if info is None or not _is_our_zygote(info):
        _remove_files(Path(run_dir))
        return False
    signal_group(info.pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _is_our_zygote(info) and time.monotonic() < deadline:
        time.sleep(0.02)
    if _is_our_zygote(info):
        signal_group(info.pgid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while _is_our_zygote(info) and time.monotonic() < deadline:
            time.sleep(0.02)
    _remove_files(Path(run_dir))
    return True


def _is_our_zygote(info: ZygoteInfo) -> bool:
    stat = read_stat(info.pid)
    return (
        stat is not None
        and stat.state not in ("Z", "X")
        and stat.start_ticks == info.start_ticks
        and stat.pgrp == info.pgid
    )


def _remove_files(run_dir: Path) -> None:
    for name in (SOCKET_FILE, PID_FILE):
        (run_dir / name).unlink(missing_ok=True)
