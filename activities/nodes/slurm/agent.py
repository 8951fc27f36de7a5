"""The Slurm node agent: a node's ranks as one job step inside an existing allocation.

Design: a generation is one job step per node (``srun --jobid=J --overlap -N1 -w
<node> --ntasks=<nproc>``), started by that node's agent from
:meth:`SlurmAgent.start_ranks`, so that stopping a node waits for that node only.
One step spanning every node (as before issue 28) tied the stop of the healthy
nodes to the dead one: Slurm lists a step until every node of it answers, and each
``scancel`` of it blocked for ``MessageTimeout`` (33 s of a 38 s node loss).

- the agent takes its node's step lock (``slurm-step-<node>.lock``: a retried
  activity on another worker waits here), and starts the step unless its record
  ``slurm-step-<node>.json`` is there already (then it adopts it, never a second
  step). The node list (the rank order) and ``nproc_per_node`` come from
  ``plan.json`` (written by the launcher before any rank starts), the environment
  from the node's first rank, since every rank's environment is the same but for
  its rank variables, which each task computes from its node's slot in the plan
  and ``SLURM_LOCALID`` (see :mod:`activities.nodes.slurm_task`);
- it then waits for its ranks' pid files, which the tasks write on the shared
  filesystem.

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
``DOWN``, ``DRAIN``, ``FAIL`` or ``NOT_RESPONDING`` is unreachable, i.e. lost. Both
answers are asked for all the job's nodes at once and shared by their agents, at
most every 2 s (:mod:`~activities.nodes.slurm.rounds`: at most 1 command a second
per job, not 2 per node per round).

A stop cancels the node's own steps: ``scancel --signal=TERM J.S`` (and ``CONT``),
the grace, ``scancel --signal=KILL J.S``, then a wait until ``squeue`` no longer
shows the step. Each ``scancel`` is sent, not waited for: Slurm 22.05's returns only
once every node of the *allocation* answered, so with one dead node each one
blocked for ``MessageTimeout`` + 1 s although the signal reached the live node at
once; ``squeue`` is what says the step ended. Before that, a node whose slurmd
refuses connections (:func:`~activities.nodes.slurm.commands.slurmd_silent`) or
that Slurm reports lost is not waited for at all: its step is sent SIGKILL and the
stop reports the node unreachable at once (the workflow replaces it; Slurm ends the
step when it marks the node DOWN, and the preflight drains it). A SIGKILL takes
down the task that would have recorded a rank's exit, so the stop records it
(``recorded_by``).

Node-local work (preflight, the memory tier, stopping the zygote) runs the ssh
agent's shim through ``srun -w <node> sh -s`` in the allocation; draining
(``scontrol update``) needs Slurm admin rights, so its refusal is returned, never
raised. Warm starts run the zygote as a step of its own and fork ranks from it.

Around this module: Slurm's client commands and the parsing of their answers are
:mod:`~activities.nodes.slurm.commands`, the shim as a step and the commands not
waited for :mod:`~activities.nodes.slurm.shim`, warm starts
:mod:`~activities.nodes.slurm.warm`, draining and undraining a node
:mod:`~activities.nodes.slurm.drain`, the holder script and the preemption
notice :mod:`~activities.nodes.slurm.preemption`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from activities.nodes.agent import (
    LogChunk,
    MemorySnapshot,
    NodeRefused,
    NodeStatus,
    NodeUnreachable,
    PreflightRequest,
    PreflightResult,
    RankRecord,
    RankStartFailed,
    RestoreEnd,
)
from activities.nodes.fencing import last_step
from activities.nodes.local.agent import LocalAgent
from activities.nodes.node_records import NodeStopResult, RankLaunch, StartedRank
from activities.nodes.procfs import read_stat
from activities.nodes.rundir import (
    GenerationDir,
    SrunFiles,
    generation_lock,
    generations_below,
    read_json,
    write_json_atomic,
)
from activities.nodes.slurm.commands import (
    COMMAND_TIMEOUT_S,
    LOST_STATES,
    SlurmCommandFailed,
    client_environment,
    job_steps,
    node_address,
    node_state,
    slurm_command,
    slurmd_silent,
)
from activities.nodes.slurm.container import (
    PYXIS_OPTION,
    ContainerRefused,
    srun_options,
    task_argv,
    wrapped,
)
from activities.nodes.slurm.preemption import preemption_notice
from activities.nodes.slurm.rounds import ROUNDS, SlurmRounds, Steps
from activities.nodes.slurm.shim import SrunShim, send, silent_nodes, step_lock_at
from activities.nodes.slurm.warm import ZYGOTE_STEP, SlurmWarm, merged_stop
from activities.nodes.zygote_socket import zygote_dir
from lazarus.domain import environment as env_names
from lazarus.domain.process_groups import UnkillableGroup
from lazarus.domain.spec import NodeSpec, SlurmSpec
from lazarus.rank.hang_evidence import EvidenceTarget, HangEvidence

START_WAIT_S = 120.0
"""For every rank's pid file after the step is started: step creation, the task's
interpreter start and the rank's exec, on a loaded machine."""
STEP_GONE_POLL_S = 0.2
PER_RANK_VARIABLES = frozenset(
    {
        env_names.RANK,
        env_names.LOCAL_RANK,
        env_names.GROUP_RANK,
        env_names.ROLE_RANK,
        env_names.NODE,
        env_names.HEARTBEAT_FILE,
    }
)
"""Set by each task on its node (:func:`lazarus.domain.environment.rank_identity`);
the rest of a rank's environment is the step's."""


def step_record(node: str) -> str:
    """The file, in the generation directory, recording ``node``'s step of it."""
    return f"slurm-step-{node}.json"


def step_name(gen: GenerationDir, node: str) -> str:
    """Unique per generation directory and node: runs of one job differ in their
    directory."""
    digest = hashlib.sha256(str(gen.path.resolve()).encode()).hexdigest()[:10]
    return f"lazarus-g{gen.generation}-{digest}-{node}"


@contextlib.contextmanager
def _step_lock(gen: GenerationDir, node: str) -> Iterator[None]:
    """Serialises the agents of one node in one launch (a retry on another worker)
    deciding whether to start the node's step. Not the generation lock: the
    launcher holds that one around all of them."""
    with step_lock_at(gen.path / f"slurm-step-{node}.lock"):
        yield


def step_argv(
    *,
    node_name: str,
    job: str,
    name: str,
    gen_dir: str,
    nodes: list[str],
    nproc: int,
    ranks: list[int],
    workdir: str,
    env_file: str | None,
    command: list[str],
    python: str,
    slurm: SlurmSpec | None,
    srun: str,
    check_container: bool = True,
) -> list[str]:
    """The ``srun`` line of one node's step of a generation: its ranks' tasks, each
    the node's own interpreter running ``lazarus.rank.slurm_task`` (``lazarus-rank``
    only), in ``slurm.container`` if any. The dry run shows the same line
    (``check_container`` False: it asks no ``srun --help``)."""
    task = task_argv(
        python,
        [
            "--gen-dir",
            gen_dir,
            "--nodes",
            ",".join(nodes),
            "--nproc",
            str(nproc),
            "--ranks",
            ",".join(str(r) for r in ranks),
            "--workdir",
            workdir,
            *(["--env-file", env_file] if env_file else []),
            "--",
            *command,
        ],
    )
    help_text = None if check_container else PYXIS_OPTION
    return [
        srun,
        f"--jobid={job}",
        "--overlap",
        "-N1",
        "-w",
        node_name,
        f"--ntasks={len(ranks)}",
        "--kill-on-bad-exit=0",
        "--cpu-bind=none",
        f"--job-name={name}",
        "--export=ALL",
        f"--chdir={workdir}",
        *srun_options(slurm, srun_help=help_text),
        *wrapped(slurm, task),
    ]


QUIET_PROBE_S = 1.0
"""A node whose live ranks have all been quiet this long has its slurmd probed."""
PROBE_EVERY_S = 2.0
"""At most one slurmd probe per node this often, and only while the node is quiet."""


class SlurmAgent(SlurmWarm):
    def __init__(
        self,
        node: NodeSpec,
        slurm: SlurmSpec | None,
        start_wait_s: float = START_WAIT_S,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        rounds: SlurmRounds | None = None,
    ) -> None:
        super().__init__(node)
        self.slurm = slurm
        self.start_wait_s = start_wait_s
        self.command_timeout_s = command_timeout_s
        self.rounds = rounds or ROUNDS
        """Slurm's answers shared by every node's poll of a round."""
        self._peers: dict[str, list[str]] = {}
        """generation directory -> its nodes (``plan.json``, read once): asked about
        with this node, so one ``scontrol`` answers the whole round."""
        self._probed_at = -PROBE_EVERY_S
        self._probe: str | None = None
        """The last slurmd probe's answer (:meth:`_dead_slurmd`)."""
        self._files = LocalAgent(node)
        """Logs and control files are on the shared filesystem: read and written here."""
        self._gone: set[str] = set()
        """Step ids that an answer asked after their pid files were read did not list:
        gone for good, never asked about again."""

    def _job(self) -> int:
        if self.slurm is None:
            raise ValueError(
                f"node {self.node.name} uses launcher slurm, but no Slurm allocation was "
                "passed to its agent (the job spec's slurm.job_id)"
            )
        return self.slurm.allocation_id

    def node_python(self) -> str:
        return self.node.node_python(self.slurm.python if self.slurm else "python3")

    def _shim(self) -> SrunShim:
        return SrunShim(self.node, self._job(), self.command_timeout_s)

    # --- launch -----------------------------------------------------------------------

    def start_ranks(self, gen_dir: str, ranks: list[RankLaunch]) -> list[StartedRank]:
        if not ranks:
            return []
        gen = GenerationDir(Path(gen_dir))
        gen.path.mkdir(parents=True, exist_ok=True)
        already = {r.rank for r in ranks if gen.pid_file(r.rank).exists()}
        with _step_lock(gen, self.node.name):
            record = gen.path / step_record(self.node.name)
            if read_json(record) is None and len(already) < len(ranks):
                self._start_step(gen, [r for r in ranks if r.rank not in already])
        deadline = time.monotonic() + self.start_wait_s
        return [self._wait_started(gen, r.rank, r.rank in already, deadline) for r in ranks]

    def _start_step(self, gen: GenerationDir, launches: list[RankLaunch]) -> None:
        template = launches[0]
        job = self._job()
        plan = read_json(gen.plan_file)
        if plan is None or not isinstance(plan.get("nodes"), list):
            raise NodeRefused(f"{gen.plan_file}: no plan with the generation's nodes to launch")
        nodes = [str(n) for n in plan["nodes"]]
        nproc = int(plan.get("nproc_per_node", 1))
        if self.node.name not in nodes:
            raise NodeRefused(
                f"{gen.plan_file}: node {self.node.name} is not one of the generation's "
                f"nodes {nodes}"
            )
        env = {k: v for k, v in template.env.items() if k not in PER_RANK_VARIABLES}
        master = node_address(nodes[0])
        if master:
            env[env_names.MASTER_ADDR] = master
        name = step_name(gen, self.node.name)
        try:
            srun = step_argv(
                node_name=self.node.name,
                job=str(job),
                name=name,
                gen_dir=str(gen.path),
                nodes=nodes,
                nproc=nproc,
                ranks=[r.rank for r in launches],
                workdir=template.workdir,
                env_file=template.env_file,
                command=template.command,
                python=self.node_python(),
                slurm=self.slurm,
                srun=slurm_command("srun"),
            )
        except ContainerRefused as exc:
            raise NodeRefused(f"node {self.node.name}: {exc}") from None
        files = SrunFiles.of(self.node.name)
        for stale in (files.pid, files.exit):
            (gen.path / stale).unlink(missing_ok=True)
        write_json_atomic(
            gen.path / step_record(self.node.name),
            {
                "job_id": job,
                "name": name,
                "node": self.node.name,
                "nodes": nodes,
                "nproc_per_node": nproc,
                "ranks": [r.rank for r in launches],
                "master_addr": env.get(env_names.MASTER_ADDR),
                "argv": srun,
                "started_by": self.node.name,
                "launched_at": time.time(),
            },
        )
        self._detach(gen.path, srun, env, template.workdir)

    def _detach(self, directory: Path, srun: list[str], env: dict[str, str], cwd: str) -> None:
        """Start ``srun`` detached (``slurm_task srun``), its files in ``directory``."""
        detach = [sys.executable, "-m", "activities.nodes.slurm_task", "srun"]
        # The helper forks and its parent exits at once; run() reaps that parent only.
        subprocess.run(
            [*detach, "--gen-dir", str(directory), "--node", self.node.name, "--", *srun],
            env=client_environment(env),
            cwd=cwd,
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
            if read_json(gen.path / SrunFiles.of(self.node.name).exit) is not None:
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
            log = gen.path / SrunFiles.of(self.node.name).log
            lines = log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return " | ".join(ln.strip() for ln in lines if ln.strip())[-500:]

    def _step_failed(self, gen: GenerationDir) -> Exception:
        """Why the step could not start: a lost node is a node failure (the workflow
        replaces it), anything else a refusal naming srun's own error."""
        record = read_json(gen.path / step_record(self.node.name)) or {}
        with contextlib.suppress(SlurmCommandFailed):
            words, reason = node_state(self.node.name)
            if words & LOST_STATES:
                return NodeUnreachable(
                    f"node {self.node.name}: Slurm reports it {'+'.join(sorted(words))}"
                    + (f" ({reason})" if reason else "")
                )
        silent = slurmd_silent(self.node.name)
        if silent is not None:
            return NodeUnreachable(f"node {self.node.name}: {silent}")
        return NodeRefused(
            f"node {self.node.name}: srun could not start the step in Slurm job "
            f"{record.get('job_id', '?')}: {self._srun_tail(gen) or 'no output'}"
        )

    # --- supervision ------------------------------------------------------------------

    def poll(self, gen_dir: str, ranks: list[int]) -> NodeStatus:
        started = time.monotonic()
        gen = GenerationDir(Path(gen_dir))
        read_at = self.rounds.now()
        pid_records = {rank: read_json(gen.pid_file(rank)) for rank in ranks}
        step_ids = {str(r["slurm_step"]) for r in pid_records.values() if r and "slurm_step" in r}
        jobs = {s.split(".")[0] for s in step_ids}
        zygote = None
        if any(r and "slurm_step" not in r for r in pid_records.values()):
            # Forked from the zygote: they live as long as its step (or their exit file).
            zygote = read_json(zygote_dir(gen.path.parent, self.node.name) / ZYGOTE_STEP)
            jobs.add(str(zygote.get("job_id")) if zygote else str(self._job()))
        steps, asked = self._steps(jobs)
        if asked < read_at and self._unlisted(gen, pid_records, steps, zygote):
            # The shared answer may predate a pid file: only one asked after we read
            # them may say a step is gone (see activities.nodes.slurm.rounds).
            steps, asked = self._steps(jobs, asked_after=read_at)
        if asked >= read_at:  # asked after the pid files were read: what it lacks is gone
            self._gone |= self._unlisted(gen, pid_records, steps, zygote) - {""}
        records = []
        for rank, pid_record in pid_records.items():
            exit_record = read_json(gen.exit_file(rank))
            step = str(pid_record.get("slurm_step")) if pid_record else None
            if pid_record is not None and "slurm_step" not in pid_record:
                name = zygote.get("name") if zygote else None
                running = steps is None or any(n == name for n, _ in steps.values())
            else:
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
        ended = [
            f"{gen.path}:{r.rank}"
            for r in records
            if r.exit is not None or (r.pid is not None and not r.alive)
        ]
        if ended:
            # Ranks end when their allocation does: the preemption check asks its state.
            for job in jobs:
                self.rounds.rank_ended(job, ended)
        error = None
        try:
            words, reason = self.rounds.node_state(self.node.name, self._plan_nodes(gen))
        except SlurmCommandFailed:
            words, reason = set(), ""  # slurmctld unreachable is not the node's fault
        if words & LOST_STATES:
            error = f"Slurm reports node {self.node.name} {'+'.join(sorted(words))}" + (
                f": {reason}" if reason else ""
            )
        else:
            error = self._dead_slurmd(records)
        return NodeStatus(
            node=self.node.name,
            reachable=error is None,
            error=error,
            declared_lost=error is not None,
            ranks=records,
            observed_at=time.time(),
            round_trip_s=time.monotonic() - started,
        )

    def _dead_slurmd(self, records: list[RankRecord]) -> str | None:
        """Why this node looks dead, when every live rank of it has been quiet for
        :data:`QUIET_PROBE_S`: its slurmd refuses connections. Slurm marks a dead node
        ``NOT_RESPONDING`` only after ``SlurmdTimeout`` (tens of seconds), and until then
        its ranks look running; their peers, blocked on them in a collective, would be
        called hung by a learned hang budget of seconds, and the node's loss handled as
        a hang (a whole restart instead of a rejoin). Probed at most every
        :data:`PROBE_EVERY_S`, and only while the node is quiet."""
        beats = [r.heartbeat.get("time") for r in records if r.alive and r.heartbeat]
        newest = max((float(t) for t in beats if isinstance(t, int | float)), default=None)
        if newest is None or time.time() - newest < QUIET_PROBE_S:
            return None
        now = time.monotonic()
        if now - self._probed_at >= PROBE_EVERY_S:
            self._probed_at = now
            silent = slurmd_silent(self.node.name)
            self._probe = None if silent is None else f"node {self.node.name}: {silent}"
        return self._probe

    def _steps(self, jobs: set[str], asked_after: float | None = None) -> tuple[Steps, float]:
        """The steps of ``jobs`` (None when Slurm cannot be asked), shared with the
        round's other nodes, and when the oldest answer among them was asked."""
        steps: Steps = {}
        oldest = float("inf")
        for job in sorted(jobs):
            found, asked = self.rounds.steps(job, asked_after)
            oldest = min(oldest, asked)
            if found is None or steps is None:
                steps = None
            else:
                steps.update(found)
        return steps, oldest

    def _plan_nodes(self, gen: GenerationDir) -> list[str]:
        key = str(gen.path)
        if key not in self._peers:
            plan = read_json(gen.plan_file)
            nodes = plan.get("nodes") if plan else None
            if not isinstance(nodes, list):
                return []  # not launched yet: ask again next poll
            self._peers[key] = [str(n) for n in nodes]
        return self._peers[key]

    def _unlisted(
        self,
        gen: GenerationDir,
        pid_records: dict[int, dict[str, Any] | None],
        steps: Steps,
        zygote: dict[str, Any] | None,
    ) -> set[str]:
        """The steps (ids; ``""`` for the zygote's) that ``steps`` lacks of ranks with
        a pid file and no exit file: the one case a shared answer could be too old to
        judge. Steps an answer asked after the pid files were read already found gone
        (:attr:`_gone`) are left out: a step id is never reused, so asking again for
        them would only cost a command every round until the workflow acts. Not the
        zygote's: its step is known by name, which a restarted zygote may reuse."""
        if steps is None:
            return set()
        names = {name for name, _ in steps.values()}
        missing: set[str] = set()
        for rank, record in pid_records.items():
            if record is None:
                continue
            if "slurm_step" in record:
                key = str(record["slurm_step"])
                listed = key in steps
            else:
                key = ""
                listed = zygote is not None and zygote.get("name") in names
            if not listed and key not in self._gone and not gen.exit_file(rank).exists():
                missing.add(key)
        return missing

    # --- fencing and stop ---------------------------------------------------------------

    def fence_here(
        self,
        older: list[GenerationDir],
        others: list[GenerationDir],
        keep: frozenset[int],
        kill_wait_s: float,
        lock_timeout_s: float,
    ) -> list[UnkillableGroup]:
        """Nothing on this machine: the ranks run on compute nodes, so the pids in the
        run directory's files mean nothing here (:meth:`fence_older_generations`)."""
        return []

    def fence_older_generations(
        self, run_root: str, generation: int, kill_wait_s: float
    ) -> NodeStopResult | None:
        """An older generation's ranks run on compute nodes: the steps this node took
        part in are cancelled instead (a step is whole: the first node ends it for all)."""
        return self.stop(run_root, generation, 0.0, kill_wait_s)

    def stop(
        self,
        run_root: str,
        keep_generation: int | None,
        grace_s: float,
        kill_wait_s: float = 10.0,
    ) -> NodeStopResult:
        """Stop this node's steps of every generation below ``keep_generation``.

        A node lost mid-generation (the bench's node loss: its slurmd and tasks
        SIGKILLed) goes like this: the workflow stops every node at once; on the
        live node the step ends on SIGTERM/SIGKILL and leaves ``squeue`` within
        a second, whatever the dead node does. On the dead node, Slurm still lists
        the step (until ``SlurmdTimeout`` marks the node DOWN: 300 s by default),
        but its slurmd refuses connections: the step is sent SIGKILL, not waited
        for, and the node is reported unreachable now. The workflow replaces it,
        and it stays quarantined, unfenced, until a later stop reaches it (what
        ran there is then gone). A node whose slurmd still accepts connections
        but whose step outlives SIGKILL is probed (:func:`silent_nodes`) before
        it is reported as ranks that would not die."""
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
        forked = [g for g in touched if self._forked_here(g)]
        if forked:
            with ThreadPoolExecutor(max_workers=1) as pool:
                local = pool.submit(
                    self._stop_forked, run_root, keep_generation, grace_s, kill_wait_s
                )
                stepped = self._stop_steps(by_step, touched, grace_s, kill_wait_s)
                return merged_stop(stepped, local.result())
        return self._stop_steps(by_step, touched, grace_s, kill_wait_s)

    def _stop_older_steps(
        self, run_root: str, generation: int, kill_wait_s: float
    ) -> NodeStopResult:
        """A carry's fencing of the older generations' steps (ranks started cold), no
        grace: the generation has failed. Forked ranks are the carry's own to fence."""
        by_step: dict[str, GenerationDir] = {}
        touched: list[GenerationDir] = []
        for gen in generations_below(Path(run_root), None):
            if gen.generation >= generation:
                continue
            with generation_lock(gen):
                if not self._took_part(gen):
                    continue
                touched.append(gen)
                for step in self._step_ids(gen):
                    by_step[step] = gen
        return self._stop_steps(by_step, touched, 0.0, kill_wait_s)

    def _stop_steps(
        self,
        by_step: dict[str, GenerationDir],
        touched: list[GenerationDir],
        grace_s: float,
        kill_wait_s: float,
    ) -> NodeStopResult:
        try:
            live = self._live(list(by_step))
        except SlurmCommandFailed as exc:
            return NodeStopResult(node=self.node.name, reachable=False, error=str(exc))
        generations = sorted({by_step[s].generation for s in live})
        lost = self._lost_now() if live else None
        if lost is not None:
            for step in live:
                self._scancel("KILL", step)
            return NodeStopResult(
                node=self.node.name,
                reachable=False,
                error=f"Slurm node {self.node.name}: {lost}; its steps "
                f"{', '.join(live)} were sent SIGKILL, not waited for (Slurm ends them "
                "when it marks the node DOWN)",
                killed_groups=len(live),
                generations=generations,
            )
        for step in live:
            self._scancel("TERM", step)
            self._scancel("CONT", step)
        remaining = self._wait_gone(live, grace_s)
        for step in remaining:
            self._scancel("KILL", step)
        survivors = self._wait_gone(remaining, kill_wait_s)
        if survivors and (
            self._lost_now() is not None or silent_nodes({self.node.name}, self._job())
        ):
            # Died during the stop: nothing of the step here can be reached.
            return NodeStopResult(
                node=self.node.name,
                reachable=False,
                error=f"Slurm node {self.node.name} stopped answering during the stop: its "
                "steps end when Slurm marks it DOWN",
                killed_groups=len(remaining),
                generations=generations,
            )
        for gen in touched:
            self._stop_srun_client(gen)
        for gen in {by_step[s] for s in remaining if s not in survivors}:
            self._record_killed(gen)
        steps = [s for g in touched if (s := last_step(g)) is not None]
        return NodeStopResult(
            node=self.node.name,
            reachable=True,
            signalled_groups=len(live),
            killed_groups=len(remaining),
            last_step=max(steps) if steps else None,
            generations=generations,
            unkillable=[self._unkillable(by_step[s], s, kill_wait_s) for s in survivors],
        )

    def _lost_now(self) -> str | None:
        """Why this node is lost, as Slurm reports it or as its slurmd's port shows;
        None when it looks alive."""
        with contextlib.suppress(SlurmCommandFailed):
            words, reason = node_state(self.node.name)
            if words & LOST_STATES:
                return f"Slurm reports it {'+'.join(sorted(words))}" + (
                    f" ({reason})" if reason else ""
                )
        return slurmd_silent(self.node.name)

    def _took_part(self, gen: GenerationDir) -> bool:
        plan = read_json(gen.plan_file)
        nodes = plan.get("nodes") if plan else None
        return not isinstance(nodes, list) or self.node.name in nodes

    def _step_ids(self, gen: GenerationDir) -> set[str]:
        """This node's step of the generation: from its tasks' pid files, else (no
        task has started yet) by its name among the allocation's steps."""
        found = {
            str(record["slurm_step"])
            for pid_file in gen.path.glob("rank-*.pid")
            if (record := read_json(pid_file)) is not None
            and "slurm_step" in record
            and record.get("slurm_node") == self.node.name
        }
        record = read_json(gen.path / step_record(self.node.name))
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
        """Sent, not waited for (see the module's docstring); ``squeue`` judges."""
        send(["scancel", f"--signal={sig}", step])

    def _wait_gone(self, step_ids: list[str], timeout_s: float) -> list[str]:
        """The steps among ``step_ids`` still listed after at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        remaining = list(step_ids)
        while remaining:
            # Slurm unreachable: keep the last answer; the deadline bounds the wait.
            with contextlib.suppress(SlurmCommandFailed):
                remaining = self._live(remaining)
            if not remaining or time.monotonic() >= deadline:
                break
            time.sleep(STEP_GONE_POLL_S)
        return remaining

    def _stop_srun_client(self, gen: GenerationDir) -> None:
        """An ``srun`` still waiting for its step to be created (resources busy) has no
        step to cancel: end it, if it runs on this machine (start ticks checked)."""
        files = SrunFiles.of(self.node.name)
        record = read_json(gen.path / files.pid)
        if record is None or read_json(gen.path / files.exit) is not None:
            return
        pid = int(record["pid"])
        stat = read_stat(pid)
        if stat is not None and stat.start_ticks == int(record["start_ticks"]):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def _own_records(self, gen: GenerationDir) -> list[dict[str, Any]]:
        """The pid records of this node's ranks in the generation."""
        return [
            r
            for p in gen.path.glob("rank-*.pid")
            if (r := read_json(p)) is not None and r.get("slurm_node") == self.node.name
        ]

    def _record_killed(self, gen: GenerationDir) -> None:
        """The step was SIGKILLed, its tasks with it: record the exits they could not."""
        for record in self._own_records(gen):
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
        records = self._own_records(gen)
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
        """The zygote stopped by the shim (start ticks checked), then its step cancelled
        and waited for, so no zygote outlives the run even where the stop could not
        reach it; the memory tier removed."""
        self._shim().end_run(run_root, memory_dirs)
        self._end_zygote_steps(Path(run_root))

    def memory_snapshots(self, root: str) -> list[MemorySnapshot]:
        return self._shim().memory_snapshots(root)

    def memory_snapshots_in(self, roots: list[str]) -> list[list[MemorySnapshot]]:
        return self._shim().memory_snapshots_in(roots)

    def restore_end(self, end: RestoreEnd) -> dict[str, Any]:
        return self._shim().restore_end(end)

    def hang_evidence(self, gen_dir: str, targets: list[EvidenceTarget]) -> HangEvidence:
        """Read on the node, as a one-task step (the ranks' pids are the node's)."""
        if self.slurm is None:
            return HangEvidence(stacks=[f"rank stacks: node {self.node.name} has no allocation"])
        return self._shim().hang_evidence_with(gen_dir, targets, self.node_python())

    def preflight(self, request: PreflightRequest) -> PreflightResult:
        return self._shim().preflight(request)

    def log_tail(self, gen_dir: str, rank: int, max_bytes: int = 65536) -> str:
        return self._files.log_tail(gen_dir, rank, max_bytes)

    def log_read(self, gen_dir: str, rank: int, offset: int, max_bytes: int) -> LogChunk:
        return self._files.log_read(gen_dir, rank, offset, max_bytes)

    def write_file(self, path: str, content: str) -> None:
        self._files.write_file(path, content)

    # --- preemption (drain and undrain: SlurmDrain) ---------------------------------------

    def preemption_notice(
        self, marker: str | None, handled_at: float | None
    ) -> tuple[float, str] | None:
        """:func:`preemption_notice` of this agent's allocation, from the job's shared
        answers; None without an allocation."""
        if self.slurm is None:
            return None
        return preemption_notice(self.slurm, marker, handled_at, self.rounds)
