"""What goes down to a node's shim and what comes back: the script of one round trip
(:func:`shim_script`), the invocations it runs (start, warm, rejoin) with their
secrets on stdin, never in argv, and the JSON lines a reply holds. No agent here:
:mod:`activities.nodes.shim_agent` runs these over ssh, ``srun`` or a local ``sh``."""

from __future__ import annotations

import json
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from activities.nodes.node_records import (
    CarryRequest,
    NodeWarmRequest,
    RankLaunch,
    WarmRankRequest,
    WarmStart,
)
from lazarus.domain.spec import ENV_NAME_PATTERN

SHIM_PATH = Path(__file__).with_name("shim.sh")
SHIM_TEXT = SHIM_PATH.read_text()


@dataclass(frozen=True)
class ShimReply:
    exit_code: int
    output: bytes
    """stdout and stderr interleaved: JSON lines plus any diagnostics."""
    round_trip_s: float


@dataclass(frozen=True)
class ShimCall:
    """One ``shim_main`` call with ``stdin`` as its standard input (a quoted
    here-document: never expanded, never an argument). A plain argument list
    gets ``/dev/null``."""

    argv: list[str]
    stdin: str


def _here_document(text: str) -> str:
    """``<<'DELIM'`` + ``text`` + ``DELIM``, with a delimiter no line of ``text`` equals."""
    body = text if not text or text.endswith("\n") else text + "\n"
    lines = set(body.split("\n"))
    while True:
        delimiter = f"LAZARUS_STDIN_{secrets.token_hex(8)}"
        if delimiter not in lines:
            return f"<<'{delimiter}'\n{body}{delimiter}\n"


def shim_script(invocations: list[list[str] | ShimCall], prelude: str = "") -> bytes:
    """The stdin of ``sh -s``: the shim, then one quoted call per invocation."""
    calls = []
    for call in invocations:
        argv, stdin = (call.argv, call.stdin) if isinstance(call, ShimCall) else (call, None)
        for arg in [*argv, stdin or ""]:
            if "\x00" in arg:
                raise ValueError(f"argument {arg[:40]!r}... contains a NUL byte")
        line = "shim_main " + " ".join(shlex.quote(a) for a in argv)
        calls.append(f"{line} </dev/null\n" if stdin is None else f"{line} {_here_document(stdin)}")
    return (prelude + SHIM_TEXT + "\n" + "".join(calls)).encode()


def rank_env_script(launch: RankLaunch) -> str:
    """The rank's whole environment as ``KEY='VALUE'`` lines for the shim's stdin.

    Values are ``shlex.quote``-d, so the rank's ``sh`` assigns them literally; names
    must be plain variable names, which is all an ``sh`` assignment can set.
    """
    lines = []
    for key, value in sorted(launch.env.items()):
        if not ENV_NAME_PATTERN.fullmatch(key) or "\x00" in value:
            raise ValueError(f"rank {launch.rank}: environment variable {key!r} cannot be passed")
        lines.append(f"{key}={shlex.quote(value)}\n")
    return "".join(lines)


def start_call(gen_dir: str, launch: RankLaunch) -> ShimCall:
    """``start`` for one rank: its command as arguments, its environment on stdin."""
    if not launch.command:
        raise ValueError(f"rank {launch.rank}: empty command")
    env_file = ["--env-file", launch.env_file] if launch.env_file else []
    argv = ["start", gen_dir, str(launch.rank), launch.workdir, *env_file, "--", *launch.command]
    return ShimCall(argv=argv, stdin=rank_env_script(launch))


def warm_call(
    gen_dir: str,
    node: str,
    ranks: list[RankLaunch],
    warm: WarmStart,
    start_zygote: bool = True,
    prewarm: bool = False,
) -> ShimCall:
    """``warm`` for every rank of one node: the interpreter and workdir as arguments;
    the ranks' PATH and PYTHONPATH (to find and import Lazarus there) and the
    :class:`NodeWarmRequest`, environments included, on stdin. Raises ValueError for
    a launch the shim cannot express (then every rank starts cold). With ``prewarm``
    only the zygote is started (one rank: its environment), and ``gen_dir`` is the
    zygote's directory, whose lock the shim takes instead of a generation's."""
    first = ranks[0]
    search_path = first.env.get("PATH", "")
    python_path = first.env.get("PYTHONPATH", "")
    if "\n" in search_path or "\n" in python_path:
        raise ValueError("the ranks' PATH or PYTHONPATH holds a newline")
    request = node_warm_request(gen_dir, node, ranks, warm, start_zygote, prewarm)
    # Without ``prewarm`` the request is what a node running an older Lazarus (which
    # refuses unknown fields) accepts: only a prewarm needs the node's new code.
    body = request.model_dump_json(exclude=None if prewarm else {"prewarm"})
    return ShimCall(
        argv=["warm", gen_dir, first.command[0], first.workdir],
        stdin=f"{search_path}\n{python_path}\n{body}\n",
    )


def node_warm_request(
    gen_dir: str,
    node: str,
    ranks: list[RankLaunch],
    warm: WarmStart,
    start_zygote: bool = True,
    prewarm: bool = False,
) -> NodeWarmRequest:
    """The :class:`NodeWarmRequest` for ``ranks`` of one node (``warm``, or a carry's
    ``start``). Raises ValueError for a launch without a command."""
    first = ranks[0]
    if not first.command:
        raise ValueError(f"rank {first.rank}: empty command")
    return NodeWarmRequest(
        gen_dir=gen_dir,
        node=node,
        run_root=warm.run_root,
        preload=warm.preload,
        standby=warm.standby,
        env_file=first.env_file,
        start_zygote=start_zygote,
        ranks=[
            WarmRankRequest(rank=r.rank, command=r.command, env=r.env, workdir=r.workdir)
            for r in ranks
        ],
        prewarm=prewarm,
    )


def rejoin_call(request: CarryRequest) -> ShimCall:
    """``rejoin`` for one node: the ranks' interpreter and workdir as arguments; their
    PATH and PYTHONPATH, then the :class:`CarryRequest`, on stdin. Raises ValueError
    for a request the shim cannot express."""
    if "\n" in request.search_path or "\n" in request.python_path:
        raise ValueError("the ranks' PATH or PYTHONPATH holds a newline")
    return ShimCall(
        argv=["rejoin", request.gen_dir, request.program, request.workdir],
        stdin=(
            f"{request.search_path}\n{request.python_path}\n"
            f"{request.model_dump_json(exclude=None if request.start else {'start'})}\n"
        ),
    )


def json_lines(output: bytes) -> tuple[list[dict[str, Any]], list[str]]:
    """Objects from the lines that hold one, and the other lines (diagnostics)."""
    records: list[dict[str, Any]] = []
    noise: list[str] = []
    for line in output.decode("utf-8", errors="replace").splitlines():
        if line.startswith("{"):
            try:
                value = json.loads(line, strict=False)
            except json.JSONDecodeError:
                noise.append(line)
                continue
            if isinstance(value, dict):
                records.append(value)
                continue
        if line.strip():
            noise.append(line)
    return records, noise
