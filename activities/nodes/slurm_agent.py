"""The Slurm node agent: ranks as one job step inside an existing allocation.

Design: the NodeAgent interface is per node, but a Slurm generation is ONE job step
(``srun --jobid=J --overlap -N n -w <nodes> --ntasks-per-node=<nproc>``) spanning
every node of it, and a step cannot be started node by node. So the launcher keeps
calling :meth:`SlurmAgent.start_ranks` on every node's agent at once, and:

- whichever agent first takes the generation's step lock (``slurm-step.lock``)
  starts the step for the whole generation: the node list and ``nproc_per_node``
  come from ``plan.json`` (written by the launcher before any rank starts), and
  the environment from its own first rank, since every rank's environment is the
  same but for its rank variables, which each task computes on its node (see
  :mod:`activities.nodes.slurm_task`). It writes ``slurm-step.json``;
- every agent (the starter included) then waits for its own ranks' pid files,
  which the tasks write on the shared filesystem; an agent that finds
  ``slurm-step.json`` already there adopts the step instead of starting another.

No launcher change is needed for this. The ``srun`` client is started detached
(``slurm_task srun``: fork, setsid; never a child of the worker), with the
generation's environment and none of the worker's own ``SLURM_*`` variables
(which would point ``srun`` at whatever allocation the worker itself runs in)
except ``SLURM_CONF``, which says where the cluster is. ``MASTER_ADDR`` is the
address Slurm knows the generation's first node by (``NodeAddr``), and the port
is the launcher's, fresh per generation.

The run directory must be on a filesystem every node and the controller share
(as on any Slurm cluster): ranks write their pid, exit, heartbeat and log files
there, and :meth:`poll`, :meth:`log_tail` and :meth:`write_file` read and write
them directly. :meth:`poll` adds what Slurm says: the step's state
(``squeue --steps``) and the node's (``scontrol show node``); a node Slurm reports
``DOWN``, ``DRAIN``, ``FAIL`` or ``NOT_RESPONDING`` is unreachable, i.e. lost.

A stop cancels whole steps: ``scancel --signal=TERM J.S`` (and ``CONT``), the
grace, ``scancel --signal=KILL J.S``, then a wait until ``squeue`` no longer shows
the step. Every node's agent may do this for the same step (the workflow stops
all nodes at once); the second finds it gone. A SIGKILL takes down the task that
would have recorded a rank's exit, so the stop records it (``recorded_by``).

Node-local work (preflight, the memory tier, zygotes) runs the ssh agent's shim
through ``srun -w <node> sh -s`` in the allocation; draining (``scontrol update``)
needs Slurm admin rights, so its refusal is returned, never raised.

Around this module: Slurm's client commands and the parsing of their answers are
:mod:`~activities.nodes.slurm_commands`, draining and undraining a node
:mod:`~activities.nodes.slurm_drain`, the holder script and the preemption
notice :mod:`~activities.nodes.slurm_preemption`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from activities.nodes.agent import (
    MemorySnapshot,
    NodeRefused,
    NodeStatus,
    NodeStopResult,
    NodeUnreachable,
    PreflightRequest,
    PreflightResult,
    RankLaunch,
    RankRecord,
    StartedRank,
)
from activities.nodes.local_agent import LocalAgent, RankStartFailed, last_step
from activities.nodes.procfs import read_stat
from activities.nodes.rundir import (
    SRUN_EXIT,
    SRUN_LOG,
    SRUN_PID,
    GenerationDir,
    generation_lock,
    generations_below,
    read_json,
    write_json_atomic,
)
from activities.nodes.shim_agent import ShimAgent, ShimReply
from activities.nodes.slurm_commands import (
    COMMAND_TIMEOUT_S,
    LOST_STATES,
    SlurmCommandFailed,
    client_environment,
    job_steps,
    node_address,
    node_state,
    run_slurm,
    slurm_command,
)
from activities.nodes.slurm_drain import SlurmDrain
from activities.nodes.slurm_preemption import preemption_notice
from lazarus.domain import environment as env_names
from lazarus.domain.contracts import UnkillableGroup
from lazarus.domain.spec import NodeSpec, SlurmSpec

STEP_RECORD = "slurm-step.json"
STEP_LOCK = "slurm-step.lock"
START_WAIT_S = 120.0
"""For every rank's pid file after the step is started: step creation, the task's
interpreter start and the rank's exec, on a loaded machine."""
STEP_GONE_POLL_S = 0.2
PROBE_TIMEOUT_S = 20.0
"""How long a probe task on a node may take to start before its slurmd counts as dead
(a dead slurmd fails the launch after Slurm's MessageTimeout, 10 s by default)."""
PER_RANK_VARIABLES = frozenset(
    {
        env_names.RANK,
        env_names.LOCAL_RANK,
        env_names.GROUP_RANK,
        env_names.NODE,
        env_names.HEARTBEAT_FILE,
    }
)
"""Set by each task on its node; the rest of a rank's environment is the step's."""


def step_name(gen: GenerationDir) -> str:
    """Unique per generation directory: runs of one job differ in their directory."""
    digest = hashlib.sha256(str(gen.path.resolve()).encode()).hexdigest()[:10]
    return f"lazarus-g{gen.generation}-{digest}"


@contextlib.contextmanager
def _step_lock(gen: GenerationDir) -> Iterator[None]:
    """Serialises the node agents of one launch (threads of one activity, or a retry
    on another worker) deciding who starts the step. Not the generation lock: the
    launcher holds that one around all of them."""
    with open(gen.path / STEP_LOCK, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class _SrunShim(ShimAgent):
    """The ssh agent's shim on a Slurm node: ``sh -s`` as a one-task step there."""

    def __init__(self, node: NodeSpec, job_id: int, timeout_s: float) -> None:
        super().__init__(node)
        self.job_id = job_id
        self.status_timeout_s = timeout_s

    def _where(self) -> str:
        return f"node {self.node.name} (Slurm job {self.job_id})"

    def _run(self, script: bytes, timeout_s: float) -> ShimReply:
        started = time.monotonic()
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


def step_nodes(gen: GenerationDir) -> list[str]:
    """The nodes of the generation's step, as its record (or the launch plan) names them."""
    record = read_json(gen.path / STEP_RECORD) or read_json(gen.plan_file) or {}
    return [str(name) for name in record.get("nodes") or []]


def silent_nodes(names: set[str], job_id: int, timeout_s: float = PROBE_TIMEOUT_S) -> set[str]:
    """Those of ``names`` whose slurmd cannot run a trivial task in job ``job_id``
    within ``timeout_s``: dead, whatever Slurm's node state says yet. Asked in
    parallel, and only after a step outlived its SIGKILL, so the cost (at most
    ``timeout_s``) is paid only where the alternative is escalating to a person."""

    def answers(name: str) -> bool:
        probe = _SrunShim(NodeSpec(name=name, launcher="slurm", host=name), job_id, timeout_s)
        try:
            return probe._run(b"exit 0\n", timeout_s).exit_code == 0
        except NodeUnreachable:
            return False

    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        answered = dict(zip(sorted(names), pool.map(answers, sorted(names)), strict=True))
    return {name for name, ok in answered.items() if not ok}


class SlurmAgent(SlurmDrain):
    warm_unsupported = "warm start is not supported on Slurm nodes yet: the step starts cold"

    def __init__(
        self,
        node: NodeSpec,
        slurm: SlurmSpec | None,
        start_wait_s: float = START_WAIT_S,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
    ) -> None:
        super().__init__(node)
        self.slurm = slurm
        self.start_wait_s = start_wait_s
        self.command_timeout_s = command_timeout_s
        self._files = LocalAgent(node)
        """Logs and control files are on the shared filesystem: read and written here."""

    def _job(self) -> int:
        if self.slurm is None:
            raise ValueError(
                f"node {self.node.name} uses launcher slurm, but no Slurm allocation was "
                "passed to its agent (the job spec's slurm.job_id)"
            )
        return self.slurm.allocation_id

    def _shim(self) -> _SrunShim:
        return _SrunShim(self.node, self._job(), self.command_timeout_s)

    # --- launch -----------------------------------------------------------------------

    def start_ranks(self, gen_dir: str, ranks: list[RankLaunch]) -> list[StartedRank]:
        if not ranks:
            return []
        gen = GenerationDir(Path(gen_dir))
        gen.path.mkdir(parents=True, exist_ok=True)
        already = {r.rank for r in ranks if gen.pid_file(r.rank).exists()}
        with _step_lock(gen):
            if read_json(gen.path / STEP_RECORD) is None and len(already) < len(ranks):
                self._start_step(gen, ranks[0])
        deadline = time.monotonic() + self.start_wait_s
        return [self._wait_started(gen, r.rank, r.rank in already, deadline) for r in ranks]

    def _start_step(self, gen: GenerationDir, template: RankLaunch) -> None:
        job = self._job()
        plan = read_json(gen.plan_file)
        if plan is None or not isinstance(plan.get("nodes"), list):
            raise NodeRefused(f"{gen.plan_file}: no plan with the generation's nodes to launch")
        nodes = [str(n) for n in plan["nodes"]]
        nproc = int(plan.get("nproc_per_node", 1))
        env = {k: v for k, v in template.env.items() if k not in PER_RANK_VARIABLES}
        master = node_address(nodes[0])
        if master:
            env[env_names.MASTER_ADDR] = master
        name = step_name(gen)
        task = [
            sys.executable,
            "-m",
            "activities.nodes.slurm_task",
            "task",
            "--gen-dir",
            str(gen.path),
            "--nodes",
            ",".join(nodes),
            "--nproc",
            str(nproc),
            "--workdir",
            template.workdir,
            *(["--env-file", template.env_file] if template.env_file else []),
            "--",
            *template.command,
        ]
        srun = [
            slurm_command("srun"),
            f"--jobid={job}",
            "--overlap",
            "-N",
            str(len(nodes)),
            "-w",
            ",".join(nodes),
            f"--ntasks-per-node={nproc}",
            f"--ntasks={len(nodes) * nproc}",
            "--distribution=block",
            "--kill-on-bad-exit=0",
            "--cpu-bind=none",
            f"--job-name={name}",
            "--export=ALL",
            f"--chdir={template.workdir}",
            *task,
        ]
        for stale in (SRUN_PID, SRUN_EXIT):
            (gen.path / stale).unlink(missing_ok=True)
        write_json_atomic(
            gen.path / STEP_RECORD,
            {
                "job_id": job,
                "name": name,
                "nodes": nodes,
                "nproc_per_node": nproc,
                "master_addr": env.get(env_names.MASTER_ADDR),
                "started_by": self.node.name,
                "launched_at": time.time(),
            },
        )
        detach = [sys.executable, "-m", "activities.nodes.slurm_task", "srun"]
        # The helper forks and its parent exits at once; run() reaps that parent only.
        subprocess.run(
            [*detach, "--gen-dir", str(gen.path), "--", *srun],
            env=client_environment(env),
            cwd=template.workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
            start_new_session=True,
            timeout=60,
        )

    def _wait_started(
        self, gen: GenerationDir, rank: int, adopted: bool, deadline: float
    ) -> StartedRank:
        while True:
            record = read_json(gen.pid_file(rank))
            if record is not None:
                started_at = record.get("started_at")
                return StartedRank(
                    rank=rank,
                    pid=int(record["pid"]),
                    pgid=int(record["pgid"]),
                    start_ticks=int(record["start_ticks"]),
                    log_file=str(gen.log_file(rank)),
                    adopted=adopted,
                    started_at=float(started_at) if isinstance(started_at, int | float) else None,
                )
            exit_record = read_json(gen.exit_file(rank))
            if exit_record is not None and exit_record.get("error"):
                raise RankStartFailed(f"rank {rank}: {exit_record['error']}")
            if read_json(gen.path / SRUN_EXIT) is not None:
                # srun ended and this rank never started: say why, once more files
                # cannot appear (a task writes its pid file before srun can end).
                if read_json(gen.pid_file(rank)) is None:
                    raise self._step_failed(gen)
                continue
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"rank {rank}: no pid file within {self.start_wait_s:.0f} s of the Slurm "
                    f"step; srun says: {self._srun_tail(gen) or 'nothing'}"
                )
            time.sleep(0.05)

    def _srun_tail(self, gen: GenerationDir) -> str:
        try:
            lines = (gen.path / SRUN_LOG).read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return " | ".join(ln.strip() for ln in lines if ln.strip())[-500:]

    def _step_failed(self, gen: GenerationDir) -> Exception:
        """Why the step could not start: a lost node is a node failure (the workflow
        replaces it), anything else a refusal naming srun's own error."""
        record = read_json(gen.path / STEP_RECORD) or {}
        for name in record.get("nodes") or [self.node.name]:
            with contextlib.suppress(SlurmCommandFailed):
                words, reason = node_state(str(name))
                if words & LOST_STATES:
                    return NodeUnreachable(
                        f"node {name}: Slurm reports it {'+'.join(sorted(words))}"
                        + (f" ({reason})" if reason else "")
                    )
        return NodeRefused(
            f"node {self.node.name}: srun could not start the step in Slurm job "
            f"{record.get('job_id', '?')}: {self._srun_tail(gen) or 'no output'}"
        )

    # --- supervision ------------------------------------------------------------------

    def poll(self, gen_dir: str, ranks: list[int]) -> NodeStatus:
        started = time.monotonic()
        gen = GenerationDir(Path(gen_dir))
        pid_records = {rank: read_json(gen.pid_file(rank)) for rank in ranks}
        step_ids = {str(r["slurm_step"]) for r in pid_records.values() if r and "slurm_step" in r}
        steps: dict[str, tuple[str, str]] | None = {}
        for job in {s.split(".")[0] for s in step_ids}:
            found = job_steps(job)
            if found is None or steps is None:
                steps = None
            else:
                steps.update(found)
        records = []
        for rank, pid_record in pid_records.items():
            exit_record = read_json(gen.exit_file(rank))
            step = str(pid_record.get("slurm_step")) if pid_record else None
            running = steps is None or (step is not None and step in steps)
            records.append(
                RankRecord(
                    rank=rank,
                    pid=int(pid_record["pid"]) if pid_record else None,
                    alive=pid_record is not None and exit_record is None and running,
                    exit=exit_record,
                    heartbeat=read_json(gen.heartbeat_file(rank)),
                )
            )
        error = None
        try:
            words, reason = node_state(self.node.name)
        except SlurmCommandFailed:
            words, reason = set(), ""  # slurmctld unreachable is not the node's fault
        if words & LOST_STATES:
            error = f"Slurm reports node {self.node.name} {'+'.join(sorted(words))}" + (
                f": {reason}" if reason else ""
            )
        return NodeStatus(
            node=self.node.name,
            reachable=error is None,
            error=error,
            declared_lost=error is not None,
            ranks=records,
            observed_at=time.time(),
            round_trip_s=time.monotonic() - started,
        )

    # --- stop -------------------------------------------------------------------------

    def stop(
        self,
        run_root: str,
        keep_generation: int | None,
        grace_s: float,
        kill_wait_s: float = 10.0,
    ) -> NodeStopResult:
        root = Path(run_root)
        targets = generations_below(root, keep_generation)
        by_step: dict[str, GenerationDir] = {}
        touched: list[GenerationDir] = []
        for gen in targets:
            with generation_lock(gen):  # wait out a launch in progress, then fence it
                if not self._took_part(gen):
                    continue
                touched.append(gen)
                if not gen.stopped_file.exists():
                    write_json_atomic(gen.stopped_file, {"reason": "stopping", "at": time.time()})
                for step in self._step_ids(gen):
                    by_step[step] = gen
        try:
            live = self._live(list(by_step))
        except SlurmCommandFailed as exc:
            return NodeStopResult(node=self.node.name, reachable=False, error=str(exc))
        for step in live:
            self._scancel("TERM", step)
            self._scancel("CONT", step)
        remaining = self._wait_gone(live, grace_s)
        for step in remaining:
            self._scancel("KILL", step)
        survivors = self._wait_gone(remaining, kill_wait_s, by_step)
        silent: set[str] = set()
        if survivors:
            # Slurm lists a step until every node of it answers. A node whose slurmd
            # died is marked lost only after SlurmdTimeout (300 s by default): ask the
            # step's nodes directly, so a dead node reads as lost, not as ranks that
            # would not die on every node of the step.
            silent = silent_nodes(
                {n for s in survivors for n in step_nodes(by_step[s])}, self._job()
            )
            survivors = [s for s in survivors if not set(step_nodes(by_step[s])) & silent]
        if self.node.name in silent or any(
            self.node.name in self._lost_nodes(by_step[s]) for s in remaining
        ):
            # This node is the dead one: nothing of the step here can be reached.
            why = "does not answer" if self.node.name in silent else "is reported lost"
            return NodeStopResult(
                node=self.node.name,
                reachable=False,
                error=f"Slurm node {self.node.name} {why}: its part of the step ends "
                "when Slurm marks it DOWN",
                killed_groups=len(remaining),
                generations=sorted({by_step[s].generation for s in live}),
            )
        for gen in touched:
            self._stop_srun_client(gen)
        killed = {by_step[s] for s in remaining if s not in survivors}
        for gen in killed:
            self._record_killed(gen)
        stopped = sorted({by_step[s].generation for s in live})
        steps = [s for g in touched if (s := last_step(g)) is not None]
        return NodeStopResult(
            node=self.node.name,
            reachable=True,
            signalled_groups=len(live),
            killed_groups=len(remaining),
            last_step=max(steps) if steps else None,
            generations=stopped,
            unkillable=[self._unkillable(by_step[s], s, kill_wait_s) for s in survivors],
        )

    def _took_part(self, gen: GenerationDir) -> bool:
        plan = read_json(gen.plan_file)
        nodes = plan.get("nodes") if plan else None
        return not isinstance(nodes, list) or self.node.name in nodes

    def _step_ids(self, gen: GenerationDir) -> set[str]:
        """The generation's step: from the tasks' pid files, else (no task has started
        yet) by its name among the allocation's steps."""
        found = {
            str(record["slurm_step"])
            for pid_file in gen.path.glob("rank-*.pid")
            if (record := read_json(pid_file)) is not None and "slurm_step" in record
        }
        record = read_json(gen.path / STEP_RECORD)
        if not found and record is not None:
            steps = job_steps(str(record["job_id"])) or {}
            found = {step for step, (name, _) in steps.items() if name == record.get("name")}
        return found

    def _live(self, step_ids: list[str]) -> list[str]:
        live: list[str] = []
        for job in sorted({s.split(".")[0] for s in step_ids}):
            steps = job_steps(job)
            if steps is None:
                raise SlurmCommandFailed(f"squeue cannot list the steps of Slurm job {job}")
            live += [s for s in step_ids if s.split(".")[0] == job and s in steps]
        return sorted(live)

    def _scancel(self, sig: str, step: str) -> None:
        # scancel's exit status is not reliable for steps: the wait judges by squeue.
        with contextlib.suppress(SlurmCommandFailed):
            run_slurm(["scancel", f"--signal={sig}", step], self.command_timeout_s)

    def _wait_gone(
        self,
        step_ids: list[str],
        timeout_s: float,
        killed: dict[str, GenerationDir] | None = None,
    ) -> list[str]:
        """The steps among ``step_ids`` still listed after at most ``timeout_s``. With
        ``killed`` (the steps were sent SIGKILL): a step that spans a node Slurm
        reports lost counts as gone, since Slurm lists it until it marks that node
        DOWN, while every live node's part died with the SIGKILL."""
        deadline = time.monotonic() + timeout_s
        remaining = list(step_ids)
        while remaining:
            # Slurm unreachable: keep the last answer; the deadline bounds the wait.
            with contextlib.suppress(SlurmCommandFailed):
                remaining = self._live(remaining)
            if killed is not None:
                remaining = [s for s in remaining if not self._lost_nodes(killed[s])]
            if not remaining or time.monotonic() >= deadline:
                break
            time.sleep(STEP_GONE_POLL_S)
        return remaining

    def _lost_nodes(self, gen: GenerationDir) -> list[str]:
        """The generation's nodes that Slurm reports lost (see :data:`LOST_STATES`)."""
        lost = []
        for name in step_nodes(gen):
            with contextlib.suppress(SlurmCommandFailed):
                if node_state(str(name))[0] & LOST_STATES:
                    lost.append(str(name))
        return lost

    def _stop_srun_client(self, gen: GenerationDir) -> None:
        """An ``srun`` still waiting for its step to be created (resources busy) has no
        step to cancel: end it, if it runs on this machine (start ticks checked)."""
        record = read_json(gen.path / SRUN_PID)
        if record is None or read_json(gen.path / SRUN_EXIT) is not None:
            return
        pid = int(record["pid"])
        stat = read_stat(pid)
        if stat is not None and stat.start_ticks == int(record["start_ticks"]):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def _record_killed(self, gen: GenerationDir) -> None:
        """The step was SIGKILLed, its tasks with it: record the exits they could not."""
        for pid_file in gen.path.glob("rank-*.pid"):
            record = read_json(pid_file)
            if record is None:
                continue
            rank = int(record["rank"])
            if not gen.exit_file(rank).exists():
                write_json_atomic(
                    gen.exit_file(rank),
                    {
                        "rank": rank,
                        "exit_code": -signal.SIGKILL,
                        "signal": "SIGKILL",
                        "ended_at": time.time(),
                        "recorded_by": f"stop on node {self.node.name}: scancel --signal=KILL",
                    },
                )

    def _unkillable(self, gen: GenerationDir, step: str, waited_s: float) -> UnkillableGroup:
        records = [r for p in gen.path.glob("rank-*.pid") if (r := read_json(p)) is not None]
        return UnkillableGroup(
            node=self.node.name,
            pgid=int(records[0]["pgid"]) if records else 0,
            pids=sorted(int(r["pid"]) for r in records),
            reason=(
                f"Slurm step {step} still listed {waited_s:g} s after scancel --signal=KILL: "
                "a task in uninterruptible sleep, or a node that no longer answers "
                "(Slurm ends the step when the node is marked DOWN)"
            ),
        )

    # --- node-local state, files ------------------------------------------------------

    def end_run(self, run_root: str, memory_dirs: list[str]) -> None:
        self._shim().end_run(run_root, memory_dirs)

    def memory_snapshots(self, root: str) -> list[MemorySnapshot]:
        return self._shim().memory_snapshots(root)

    def read_memory_snapshot(self, path: str) -> dict[str, bytes]:
        return self._shim().read_memory_snapshot(path)

    def write_memory_snapshot(self, path: str, files: dict[str, bytes]) -> None:
        self._shim().write_memory_snapshot(path, files)

    def preflight(self, request: PreflightRequest) -> PreflightResult:
        return self._shim().preflight(request)

    def log_tail(self, gen_dir: str, rank: int, max_bytes: int = 65536) -> str:
        return self._files.log_tail(gen_dir, rank, max_bytes)

    def write_file(self, path: str, content: str) -> None:
        self._files.write_file(path, content)

    # --- preemption (drain and undrain: SlurmDrain) ---------------------------------------

    def preemption_notice(
        self, marker: str | None, handled_at: float | None
    ) -> tuple[float, str] | None:
        """:func:`preemption_notice` of this agent's allocation; None without one."""
        if self.slurm is None:
            return None
        return preemption_notice(self.slurm, marker, handled_at)
