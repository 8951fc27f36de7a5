"""Each rank's Python stack for a hang's incident (issue 38): what it was doing.

A hang's evidence used to say only that a rank went quiet. The person reading the
incident wants to know where: in a collective, in the data loader, in a save.
`py-spy <https://github.com/benfred/py-spy>`_ reads a Python process's stack from
outside, without its help, even while it is stopped (SIGSTOP) or stuck in native
code; ``--nonblocking`` reads the memory without pausing the process (no ptrace
stop, so a rank that is merely slow is not slowed further).

Runs where the ranks run: in the worker for ranks on its own machine, and on an ssh
or Slurm node through the node's interpreter (:mod:`lazarus.rank.hang_evidence`, run
by the shim's ``hang-evidence``), so this module is standard library only.

Best effort and bounded, because it sits between the detection and the stop: at most
:data:`MAX_RANKS` ranks per hang (the culprit first, chosen by the supervisor), all at
once, each within :data:`DUMP_TIMEOUT_S`, each folded into one evidence line of at
most :data:`MAX_LINE_CHARS`. Without py-spy (``pip install py-spy`` beside the
interpreter that reads, or on its PATH), or where the kernel forbids reading another
process (``kernel.yama.ptrace_scope`` 1 for a process that is not a descendant, 2 or
3; a container without ``CAP_SYS_PTRACE``), the line says so and the recovery goes on.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

DUMP_TIMEOUT_S = 1.5
"""How long one ``py-spy dump`` may take (about 20 ms on a small process)."""

MAX_RANKS = 4
"""Stacks read per hang: the culprit and a few peers (they sit in the collective
that waits for it); the evidence has room for twenty lines in all."""

MAX_LINE_CHARS = 1_200
"""One rank's stack, folded into one evidence line, is cut here."""

_THREAD = re.compile(r"^Thread (?P<id>\S+) \((?P<state>[^)]*)\)(?::\s*\"(?P<name>[^\"]*)\")?")


@dataclass(frozen=True)
class StackTarget:
    rank: int
    pid: int
    stopped: bool = False


def py_spy() -> str | None:
    """The py-spy executable: on PATH, or beside the worker's Python (a venv)."""
    found = shutil.which("py-spy")
    if found is not None:
        return found
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else None


def fold(dump: str) -> str:
    """``py-spy dump`` output as one line: each thread, then its frames innermost
    first (``fn (file:line) < caller (file:line)``), the main thread first as py-spy
    lists it. File paths are cut to their last two parts. Pure."""
    threads: list[tuple[str, list[str]]] = []
    for raw in dump.splitlines():
        line = raw.strip()
        match = _THREAD.match(line)
        if match is not None:
            label = match["name"] or f"thread {match['id']}"
            threads.append((f"[{label}, {match['state']}]", []))
        elif threads and line:
            threads[-1][1].append(_short_frame(line))
    if not threads:
        return " ".join(dump.split())
    return " | ".join(f"{head} " + " < ".join(frames) for head, frames in threads)


def _short_frame(frame: str) -> str:
    """``train_step (/a/b/c/train.py:40)`` -> ``train_step (c/train.py:40)``."""
    match = re.match(r"^(?P<fn>.*) \((?P<path>.*):(?P<line>\d+)\)$", frame)
    if match is None:
        return frame
    parts = Path(match["path"]).parts[-2:]
    return f"{match['fn']} ({'/'.join(parts)}:{match['line']})"


def dump_stack(executable: str, target: StackTarget) -> str:
    """One evidence line: ``rank 1 (pid 123, stopped) stack: ...`` or why not."""
    state = ", stopped" if target.stopped else ""
    head = f"rank {target.rank} (pid {target.pid}{state}) stack, innermost first: "
    try:
        done = subprocess.run(
            [executable, "dump", "--pid", str(target.pid), "--nonblocking"],
            capture_output=True,
            text=True,
            timeout=DUMP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"{head}(py-spy took over {DUMP_TIMEOUT_S} s)"[:MAX_LINE_CHARS]
    except OSError as exc:
        return f"{head}(py-spy could not run: {exc})"[:MAX_LINE_CHARS]
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        reason = why[-1] if why else f"exit {done.returncode}"
        return f"{head}(py-spy could not read it: {reason})"[:MAX_LINE_CHARS]
    return (head + fold(done.stdout))[:MAX_LINE_CHARS]


def stack_lines(targets: list[StackTarget], where: str = "the worker") -> list[str]:
    """Evidence lines for the first :data:`MAX_RANKS` targets (the culprit first),
    read at once; one line saying why not when py-spy is missing (``where``: the
    machine that reads, ``the worker`` or ``node NAME``)."""
    if not targets:
        return []
    executable = py_spy()
    if executable is None:
        return [f"rank stacks: py-spy is not installed on {where} (pip install py-spy)"]
    chosen = targets[:MAX_RANKS]
    with ThreadPoolExecutor(max_workers=len(chosen), thread_name_prefix="py-spy") as pool:
        return list(pool.map(lambda t: dump_stack(executable, t), chosen))
