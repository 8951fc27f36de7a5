"""Slurm's client commands, and what their answers say.

One ``squeue``/``scontrol``/``scancel`` call at a time (:func:`run_slurm`), run with
an environment that points at the cluster and not at any allocation the worker
itself runs in (:func:`client_environment`); the parsers of their answers (a node's
state words, a job's steps, a job's state and nodes); and the start check that a
job fits the allocation it names (:func:`allocation_problems`). The agent that runs
ranks through these is :mod:`activities.nodes.slurm.agent`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict

from activities.nodes.secret_env import without_worker_secrets
from lazarus.domain.spec import NodeSpec, SlurmSpec

COMMAND_TIMEOUT_S = 30.0
"""One ``squeue``/``scontrol``/``scancel`` call: the controller daemon answers in
milliseconds, but a loaded one takes seconds."""
LOST_STATES = frozenset({"DOWN", "DRAIN", "FAIL", "NOT_RESPONDING"})
"""Node state words (base state or flag) that make a node lost. ``DRAIN`` included: a
node an admin drains is leaving the job's hands, and the job goes on without it
(replaced, as any lost node; see docs/slurm.md for what that costs)."""
CLIENT_VARIABLES = frozenset({"SLURM_CONF"})
"""The worker's ``SLURM_*`` variables Slurm's commands keep: where the cluster is."""


class SlurmCommandFailed(RuntimeError):
    """A Slurm command could not run or did not answer (no slurmctld, a timeout)."""


def client_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: the worker's environment) without the ``SLURM_*``
    variables of any allocation the worker itself runs in, plus ``SLURM_CONF``, and
    without the worker's own credentials: ``srun`` and ``sbatch`` export this
    environment to what they run on the nodes (the shim, the preflight health
    command, the holder)."""
    source = without_worker_secrets(os.environ if base is None else base)
    env = {k: v for k, v in source.items() if not k.startswith("SLURM_")}
    for name in CLIENT_VARIABLES:
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def slurm_command(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise SlurmCommandFailed(f"{name} is not on PATH: install Slurm's client commands")
    return found


SlurmRunner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]
"""Runs one Slurm client command: :func:`run_slurm`, or a fake in tests."""


def run_slurm(
    argv: list[str], timeout_s: float = COMMAND_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run one Slurm client command (no check of its exit status)."""
    try:
        return subprocess.run(
            [slurm_command(argv[0]), *argv[1:]],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=client_environment(),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise SlurmCommandFailed(f"{argv[0]}: no answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise SlurmCommandFailed(f"{argv[0]}: cannot run: {exc}") from None


def one_line(text: str) -> str:
    """A Slurm command's answer as one short line, for messages and evidence."""
    return " ".join(text.split())[:300]


def node_state(node: str, runner: SlurmRunner | None = None) -> tuple[set[str], str]:
    """The state words of ``node`` (``{"IDLE", "DRAIN"}``) and its reason, from
    ``scontrol show node``. Raises :class:`SlurmCommandFailed`."""
    done = (runner or run_slurm)(["scontrol", "show", "node", "-o", node])
    if done.returncode != 0:
        raise SlurmCommandFailed(
            f"scontrol show node {node}: {one_line(done.stderr or done.stdout)}"
        )
    return state_words(_fields(done.stdout))


def state_words(fields: dict[str, str]) -> tuple[set[str], str]:
    """A node's state words and reason from its ``scontrol show node -o`` fields."""
    raw = [w for w in fields.get("State", "").split("+") if w]
    words = {w.rstrip("*") for w in raw}
    if any(w.endswith("*") for w in raw):  # "ALLOCATED*": the node does not answer
        words.add("NOT_RESPONDING")
    return words, fields.get("Reason", "")


def node_states(
    nodes: list[str], runner: SlurmRunner | None = None
) -> dict[str, tuple[set[str], str]]:
    """The state words and reason of each of ``nodes`` that ``scontrol`` knows, in one
    call (``scontrol show node -o n1,n2,...``: one line per node). A node missing
    from the answer (unknown to Slurm, or the answer cut short) is missing from the
    result, and its caller asks :func:`node_state` for the one-line error. Raises
    :class:`SlurmCommandFailed` when Slurm cannot be asked at all."""
    done = (runner or run_slurm)(["scontrol", "show", "node", "-o", ",".join(nodes)])
    found: dict[str, tuple[set[str], str]] = {}
    for line in done.stdout.splitlines():
        fields = _fields(line)
        name = fields.get("NodeName")
        if name:
            found[name] = state_words(fields)
    if not found and done.returncode != 0:
        raise SlurmCommandFailed(
            f"scontrol show node {','.join(nodes)}: {one_line(done.stderr or done.stdout)}"
        )
    return found


def node_address(node: str) -> str | None:
    """The address Slurm knows ``node`` by (``NodeAddr``), or None."""
    try:
        done = run_slurm(["scontrol", "show", "node", "-o", node])
    except SlurmCommandFailed:
        return None
    return _fields(done.stdout).get("NodeAddr") if done.returncode == 0 else None


SLURMD_CONNECT_S = 3.0
"""How long a TCP connect to a node's slurmd may take before the node counts as
dead. The kernel accepts a connection into the listen backlog without slurmd being
scheduled, so a loaded but live node answers in milliseconds."""


def slurmd_silent(node: str, timeout_s: float = SLURMD_CONNECT_S) -> str | None:
    """Why ``node``'s slurmd cannot be reached (its port refuses connections, or
    nothing answers within ``timeout_s``), or None when it accepts a TCP connection
    or Slurm does not say where it listens (the caller then judges by other means).

    The cheap test of a dead node: ``srun`` itself connects to that port to launch
    tasks, so a worker that can run ``srun`` there can connect to it, while any
    Slurm call that needs the dead slurmd waits ``MessageTimeout`` (10 s by
    default) before it fails. A hung slurmd that still accepts connections passes:
    what then blocks is found by the stop's wait and probe
    (:func:`~activities.nodes.slurm.agent.silent_nodes`)."""
    try:
        done = run_slurm(["scontrol", "show", "node", "-o", node])
    except SlurmCommandFailed:
        return None
    fields = _fields(done.stdout) if done.returncode == 0 else {}
    address, port = fields.get("NodeAddr"), fields.get("Port", "")
    if not address or not port.isdigit():
        return None
    try:
        with socket.create_connection((address, int(port)), timeout=timeout_s):
            return None
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        return f"its slurmd ({address}:{port}) does not accept connections: {why}"


def _fields(line: str) -> dict[str, str]:
    """``Key=Value`` words of one ``scontrol -o`` line (Reason may hold spaces: it is
    the last field scontrol prints it as ``Reason=... [user@time]``)."""
    fields: dict[str, str] = {}
    head, _, reason = line.partition(" Reason=")
    for word in head.split():
        key, sep, value = word.partition("=")
        if sep:
            fields[key] = value
    if reason:
        fields["Reason"] = reason.strip()
    return fields


def job_steps(job_id: str, runner: SlurmRunner | None = None) -> dict[str, tuple[str, str]] | None:
    """The job's steps now: ``"J.S" -> (name, state)``; empty when the job has none
    or is gone; None when Slurm cannot be asked."""
    try:
        done = (runner or run_slurm)(
            ["squeue", "--steps", "-j", job_id, "-h", "-O", "StepId:|,StepName:|,StepState:|"]
        )
    except SlurmCommandFailed:
        return None
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:
            return {}
        return None
    steps: dict[str, tuple[str, str]] = {}
    for line in done.stdout.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 3 and parts[0]:
            steps[parts[0]] = (parts[1], parts[2])
    return steps


class Allocation(BaseModel):
    """A Slurm job as ``squeue`` shows it: its state and its nodes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: int
    state: str
    nodes: list[str]
    nodelist: str
    """Slurm's compact form (``n[1-3]``), for messages."""


def job_state(job_id: int, runner: SlurmRunner | None = None) -> str | None:
    """The job's state word (``RUNNING``, ``TIMEOUT``...), None when Slurm no longer
    lists it: one ``squeue`` call. Raises :class:`SlurmCommandFailed` when Slurm
    cannot be asked."""
    done = (runner or run_slurm)(["squeue", "-j", str(job_id), "-h", "-o", "%T"])
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:
            return None
        raise SlurmCommandFailed(f"squeue -j {job_id}: {one_line(done.stderr or done.stdout)}")
    return next((ln.strip() for ln in done.stdout.splitlines() if ln.strip()), None)


def allocation(job_id: int) -> Allocation | None:
    """The job ``job_id`` now, or None when Slurm does not know it (ended long ago,
    or never). Raises :class:`SlurmCommandFailed` when Slurm cannot be asked."""
    done = run_slurm(["squeue", "-j", str(job_id), "-h", "-o", "%T|%N"])
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:
            return None
        raise SlurmCommandFailed(f"squeue -j {job_id}: {one_line(done.stderr or done.stdout)}")
    line = next((ln for ln in done.stdout.splitlines() if "|" in ln), None)
    if line is None:
        return None
    state, _, nodelist = line.strip().partition("|")
    nodes: list[str] = []
    if nodelist:
        names = run_slurm(["scontrol", "show", "hostnames", nodelist])
        nodes = names.stdout.split() if names.returncode == 0 else []
    return Allocation(job_id=job_id, state=state, nodes=nodes, nodelist=nodelist)


def allocation_problems(
    slurm: SlurmSpec, nodes: list[NodeSpec], spares: list[NodeSpec]
) -> list[str]:
    """Why the job cannot run in ``slurm.job_id``, one line per problem naming the
    spec field; empty when it can. Asked before anything is submitted, so a typo in
    the job id or a node list larger than the allocation never starts a workflow."""
    job = slurm.allocation_id
    try:
        found = allocation(job)
    except SlurmCommandFailed as exc:
        return [f"slurm.job_id: cannot ask Slurm about job {job}: {exc}"]
    if found is None:
        return [f"slurm.job_id: Slurm job {job} does not exist (squeue does not list it)"]
    if found.state != RUNNING:
        return [f"slurm.job_id: Slurm job {job} is {found.state}, not RUNNING"]
    wanted = [n for n in (*nodes, *spares) if n.launcher == "slurm"]
    if len(wanted) > len(found.nodes):
        return [
            f"nodes: {len(wanted)} Slurm nodes and spares, but Slurm job {job} holds "
            f"{len(found.nodes)} ({found.nodelist})"
        ]
    held = set(found.nodes)
    problems = []
    for field, group in (("nodes", nodes), ("spares", spares)):
        for index, node in enumerate(group):
            if node.launcher == "slurm" and node.name not in held:
                problems.append(
                    f"{field}[{index}]: node {node.name} is not in Slurm job {job}'s "
                    f"allocation ({found.nodelist})"
                )
    return problems


RUNNING = "RUNNING"
