"""Node-local commands on a Slurm node, and Slurm commands not waited for.

:class:`SrunShim` runs the ssh agent's shim (``sh -s``) on a node as a one-task job
step in the allocation (preflight, the memory tier, the zygote's forks, the stop of
forked ranks); :func:`silent_nodes` asks nodes whether their slurmd still runs a
task; :func:`send` starts a Slurm command without waiting for it. Used by
:mod:`activities.nodes.slurm.agent` and :mod:`activities.nodes.slurm.warm`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from activities.nodes.agent import NodeRefused, NodeUnreachable
from activities.nodes.node_records import RankLaunch, StartedRank
from activities.nodes.shim_agent import ShimAgent
from activities.nodes.shim_calls import ShimReply
from activities.nodes.slurm.commands import (
    SlurmCommandFailed,
    client_environment,
    slurm_command,
    slurmd_silent,
)
from lazarus.domain.spec import NodeSpec

SCANCEL_REAP_S = 60.0
"""How long a ``scancel`` sent and not waited for may run before it is killed (it
blocks ``MessageTimeout`` + 1 s while a node of the allocation is dead)."""
PROBE_TIMEOUT_S = 20.0
"""How long a probe task on a node may take to start before its slurmd counts as dead
(a dead slurmd fails the launch after Slurm's MessageTimeout, 10 s by default)."""


class SrunShim(ShimAgent):
    """The ssh agent's shim on a Slurm node: ``sh -s`` as a one-task step there.

    Its warm start forks ranks from the zygote the node's agent started as its own
    step (``starts_zygote`` False: a process the shim started would die, or escape,
    with the shim's step), and ranks it cannot fork go to ``cold``: the agent's
    step for them, never a process of the shim's step."""

    starts_zygote = False

    def __init__(
        self,
        node: NodeSpec,
        job_id: int,
        timeout_s: float,
        cold: Callable[[str, list[RankLaunch]], list[StartedRank]] | None = None,
    ) -> None:
        super().__init__(node)
        self.job_id = job_id
        self.status_timeout_s = timeout_s
        self.cold = cold

    def start_ranks(self, gen_dir: str, ranks: list[RankLaunch]) -> list[StartedRank]:
        if self.cold is None:
            raise NodeRefused(f"{self._where()}: ranks start as Slurm steps, not in the shim")
        return self.cold(gen_dir, ranks)

    def _where(self) -> str:
        return f"node {self.node.name} (Slurm job {self.job_id})"

    def _run(self, script: bytes, timeout_s: float) -> ShimReply:
        started = time.monotonic()
        silent = slurmd_silent(self.node.name)
        if silent is not None:
            # srun would wait MessageTimeout (10 s by default) to say the same.
            raise NodeUnreachable(f"{self._where()}: {silent}")
        argv = [
            f"--jobid={self.job_id}",
            "--overlap",
            "-N1",
            "-n1",
            "-w",
            self.node.name,
            "--job-name=lazarus-shim",
            "sh",
            "-s",
        ]
        try:
            proc = subprocess.Popen(
                [slurm_command("srun"), *argv],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=client_environment(),
            )
        except (OSError, SlurmCommandFailed) as exc:
            raise NodeUnreachable(f"{self._where()}: cannot run srun: {exc}") from exc
        try:
            output, _ = proc.communicate(script, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise NodeUnreachable(f"{self._where()}: no answer within {timeout_s:.0f} s") from None
        text = output.decode("utf-8", errors="replace")
        if proc.returncode != 0 and "{" not in text and "srun: error" in text:
            error = next(ln for ln in text.splitlines() if "srun: error" in ln)
            raise NodeUnreachable(f"{self._where()}: {error.strip()}")
        return ShimReply(proc.returncode, output, time.monotonic() - started)


@contextlib.contextmanager
def step_lock_at(path: Path) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def send(argv: list[str]) -> None:
    """Start a Slurm command and do not wait for it: a thread reaps it (and kills it
    after :data:`SCANCEL_REAP_S`). What it did is judged by ``squeue`` instead."""
    try:
        proc = subprocess.Popen(
            [slurm_command(argv[0]), *argv[1:]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=client_environment(),
        )
    except (OSError, SlurmCommandFailed):
        return  # the wait by squeue that follows says what did not happen

    def reap() -> None:
        try:
            proc.wait(SCANCEL_REAP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    threading.Thread(target=reap, name=f"reap {argv[0]}", daemon=True).start()


def silent_nodes(names: set[str], job_id: int, timeout_s: float = PROBE_TIMEOUT_S) -> set[str]:
    """Those of ``names`` whose slurmd cannot run a trivial task in job ``job_id``
    within ``timeout_s``: dead, whatever Slurm's node state says yet. Asked in
    parallel, and only after a step outlived its SIGKILL, so the cost (at most
    ``timeout_s``) is paid only where the alternative is escalating to a person."""

    def answers(name: str) -> bool:
        probe = SrunShim(NodeSpec(name=name, launcher="slurm", host=name), job_id, timeout_s)
        try:
            return probe._run(b"exit 0\n", timeout_s).exit_code == 0
        except NodeUnreachable:
            return False

    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        answered = dict(zip(sorted(names), pool.map(answers, sorted(names)), strict=True))
    return {name for name, ok in answered.items() if not ok}
