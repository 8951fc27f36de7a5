"""Running the example job under plain ``torchrun``, watched from outside, for comparison.

torchrun runs the very same script and arguments and gets its best chance: restarts
allowed, a 0.5 s monitor. Setups: ``best`` (``--standalone`` with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: on torch 2.13 a restarted generation otherwise
often hangs on the agent's shared store) and ``default``. Multi-node (:class:`Rendezvous`):
one agent per test host, c10d on the first (``is_host=true``: every test host has the same
hostname). Nothing trusts torchrun's own account: a reader thread timestamps every line
and a poller finds every rank process, to inject faults and kill them all at cleanup.
The method: docs/results/2026-12-bench-notebook.md, "The systems" and "How it measures".
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, ClassVar, Literal

from activities.nodes.procfs import is_alive, read_stat
from bench.jobs import REPO, flags
from bench.measure import STEP_LINE, StepTrace

TorchrunSetup = Literal["best", "default"]
POLL_INTERVAL_S = 0.05
MONITOR_INTERVAL_S = 0.5
UNSHARED_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
"""What ``/proc/<pid>/stat``'s times count in (a process's start, its CPU time)."""

AGENT_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")
"""glog-style prefix of the elastic agent's log lines (``W1130 15:02:51.889000 5036 ...``)."""
AGENT_DETECTION = re.compile(
    r"closing signal|failed \(exitcode|Worker group FAILED|Restarting|will restart worker group"
)
"""What the agent prints once its monitor has seen a rank fail, or (multi-node, with
``LOGLEVEL=INFO``) a node waiting to join, which restarts the worker group."""
GATED_AGENT = (
    "import importlib, os, runpy, sys, time\n"
    "gate, module = sys.argv[1], sys.argv[2]\n"
    "importlib.import_module(module)\n"
    "while not os.path.exists(gate):\n"
    "    time.sleep(0.02)\n"
    "sys.argv = [module, *sys.argv[3:]]\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
)
"""``python -c`` for a standby agent held at a gate file (:meth:`TorchrunJob.start_agent`):
the launcher's module (torchrun's, or NVRx's ``ft_launcher``) imported, then run as
``python -m`` would, with the same arguments."""
AGENT_LOGLEVEL = "INFO"
"""Multi-node agents log at INFO: membership changes are INFO lines."""
RESUMED_LINE = re.compile(r"^resumed from step (\d+)")


@dataclass(frozen=True)
class Line:
    t: float
    text: str
    label: str = ""
    """Which process printed it, where a job has several kinds (a peer's members)."""


class ProcessWatch:
    """What the bench's outside watch of a job shares, torchrun's and the peers'
    (:class:`bench.peers.jobs.MemberJob`): each process's output read and timestamped
    by a thread into :attr:`lines` and one log file, a poller thread remembering every
    process ever seen, and all of them killed at the end, orphans included."""

    log_path: Path

    def _watch_init(self) -> None:
        self.lines: list[Line] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._threads: list[threading.Thread] = []
        self._log: IO[str] | None = None

    def _thread(self, target: Callable[..., None], name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _open_log(self) -> None:
        """The log file, and the poller, once."""
        if self._log is None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "a")  # noqa: SIM115 - closed by stop()
            self._thread(self._poll_loop, "bench-poll")

    def _popen(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """``argv`` in a session of its own, from the repository, its output piped."""
        return subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _read_loop(self, proc: subprocess.Popen[bytes], label: str = "") -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = Line(time.time(), raw.decode(errors="replace").rstrip("\n"), label)
            with self._lock:
                self.lines.append(line)
                if self._log is not None:
                    self._log.write(f"{line.t:.3f} {_prefix(label)}{line.text}\n")
                self._on_line(line)
        proc.stdout.close()

    def _on_line(self, line: Line) -> None:
        """Called with the lock held for each line read."""

    def _poll_loop(self) -> None:
        while not self._done.is_set():
            self._poll_once()
            self._done.wait(POLL_INTERVAL_S)

    def start(self) -> None:
        raise NotImplementedError

    def _poll_once(self) -> None:
        raise NotImplementedError

    def _started(self) -> list[subprocess.Popen[bytes]]:
        """The processes the bench started itself."""
        raise NotImplementedError

    def _seen(self) -> dict[int, int]:
        """Every process ever seen (pid -> start ticks), called with the lock held."""
        raise NotImplementedError

    def kill_processes(self) -> None:
        """SIGKILL every process started and every one ever seen under them (a stopped
        one too: they run in sessions of their own, and an orphan is no exception) and
        wait until they are gone; the job can be started again afterwards."""
        for proc in self._started():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        self._poll_once()  # a process started in the last few ms
        with self._lock:
            seen = self._seen()
        for pid, start_ticks in seen.items():
            if is_alive(pid, start_ticks):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for proc in self._started():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10.0)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and any(map(is_alive, seen.keys(), seen.values())):
            time.sleep(0.02)

    def stop(self) -> None:
        """Kill everything (:meth:`kill_processes`) and stop the threads. Idempotent."""
        self.kill_processes()
        self._done.set()
        for thread in self._threads:
            thread.join(timeout=5.0)
        if self._log is not None:
            self._log.close()
            self._log = None

    def line_after(self, pattern: re.Pattern[str], t: float) -> float | None:
        """When a line matching ``pattern`` was first printed after ``t``."""
        with self._lock:
            lines = list(self.lines)
        return next((line.t for line in lines if line.t >= t and pattern.search(line.text)), None)

    def tail(self, lines: int = 40) -> str:
        with self._lock:
            return "\n".join(_prefix(line.label) + line.text for line in self.lines[-lines:])


def job_env(extra: dict[str, str]) -> dict[str, str]:
    """This environment less Lazarus's variables, with the repository on ``PYTHONPATH``,
    and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAZARUS_")}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def _prefix(label: str) -> str:
    return f"[{label}] " if label else ""


@dataclass
class RankProcess:
    """One rank process the agent started."""

    pid: int
    start_ticks: int
    rank: int
    generation: int
    """1 for the first agent's first workers, +1 for every restart (or new agent)."""
    seen_at: float
    agent: int = 0
    """The pid of the agent that started it."""

    @property
    def alive(self) -> bool:
        return is_alive(self.pid, self.start_ticks)

    @property
    def started_at(self) -> float:
        """When the kernel started the process (unix time, 10 ms resolution): from its
        start ticks, more exact than ``seen_at`` (the bench's next poll)."""
        age_s = time.clock_gettime(time.CLOCK_BOOTTIME) - self.start_ticks / CLOCK_TICKS
        return time.time() - age_s


@dataclass(frozen=True)
class Rendezvous:
    """A multi-node job's c10d rendezvous (torchrun's ``--rdzv-*`` and ``--nnodes``)."""

    endpoint: str
    """``host:port`` of the store; the agent started with ``is_host`` serves it."""
    run_id: str
    nnodes: str
    """``N`` or elastic ``MIN:MAX``."""
    conf: tuple[str, ...] = ()
    """More ``--rdzv-conf`` entries (``key=value``), e.g. the keep-alive."""


@dataclass
class TorchrunJob(ProcessWatch):
    """One job under torchrun: possibly several agents in a row (an operator restart)."""

    example_args: list[str]
    log_path: Path
    setup: TorchrunSetup = "best"
    nproc: int = 2
    max_restarts: int = 3
    monitor_interval_s: float = MONITOR_INTERVAL_S
    extra_env: dict[str, str] = field(default_factory=dict)
    rendezvous: Rendezvous | None = None
    """None: one node, ``--standalone``; else one agent per host (:meth:`start_agent`)."""
    DETECTIONS: ClassVar[tuple[tuple[re.Pattern[str], re.Pattern[str]], ...]] = (
        (AGENT_LINE, AGENT_DETECTION),
    )
    """(prefix, text) of the lines that say a worker failed: the agent's glog lines."""

    def __post_init__(self) -> None:
        self._watch_init()
        self.trace = StepTrace(started_at=time.time())
        self.ranks: list[RankProcess] = []
        self.resumed_from: dict[int, int] = {}
        """Generation -> the step its ranks said they resumed from."""
        self.max_live_ranks = 0
        self.agents: list[subprocess.Popen[bytes]] = []
        self.agent_hosts: dict[int, str] = {}
        """Multi-node: agent pid -> the host it runs on."""
        self._generation_keys: dict[tuple[int, int], int] = {}
        self._descendants: dict[int, int] = {}
        """Every process ever seen under an agent (ranks, NVRx's rank monitors,
        helpers) -> its start ticks: killed with the job even once orphaned."""

    # ------------------------------------------------------------------ lifecycle

    def command(self, local_addr: str | None = None, is_host: bool = False) -> list[str]:
        """The agent's command line; multi-node: the rendezvous flags, and this
        agent's address and whether it serves the store."""
        rdzv = self.rendezvous
        where = (
            ["--standalone"]
            if rdzv is None
            else flags(
                nnodes=rdzv.nnodes,
                rdzv_backend="c10d",
                rdzv_endpoint=rdzv.endpoint,
                rdzv_id=rdzv.run_id,
                rdzv_conf=",".join([f"is_host={str(is_host).lower()}", *rdzv.conf]),
            )
            + (flags(local_addr=local_addr) if local_addr else [])
        )
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *where,
            *flags(
                nproc_per_node=self.nproc,
                max_restarts=self.max_restarts,
                monitor_interval=self.monitor_interval_s,
            ),
            *self.example_args,
        ]

    def env(self) -> dict[str, str]:
        env = job_env({})
        env.pop(UNSHARED_STORE_ENV, None)
        if self.setup == "best":
            env[UNSHARED_STORE_ENV] = "1"
        if self.rendezvous is not None:
            env["LOGLEVEL"] = AGENT_LOGLEVEL
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        """Start (or, after an operator's kill, start again) an agent."""
        self._spawn(self.command())

    def start_agent(
        self,
        host: str,
        prefix: list[str],
        local_addr: str,
        is_host: bool = False,
        gate: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Multi-node: start ``host``'s agent, ``prefix`` running it inside that host
        (:meth:`infra.testhosts.TestHosts.command_inside`).

        ``gate``: a standby agent, started with the others (so that it has imported
        torch, as a standby that has waited since the job began has) but held before
        its rendezvous until the file exists: released early, it could take a worker
        host's place in the first round."""
        if self.rendezvous is None:
            raise ValueError("start_agent is for multi-node jobs (a Rendezvous)")
        command = self.command(local_addr, is_host)
        if gate is not None:
            # [python, -m, module, *args] -> [python, -c, GATED_AGENT, gate, module, *args]
            command = [command[0], "-c", GATED_AGENT, str(gate), *command[2:]]
        agent = self._spawn([*prefix, *command])
        self.agent_hosts[agent.pid] = host
        return agent

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        self._open_log()
        if not self.agents:
            self.trace.started_at = time.time()
        agent = self._popen(argv, self.env())
        self.agents.append(agent)
        self._thread(self._read_loop, "torchrun-read", agent)
        return agent

    @property
    def agent(self) -> subprocess.Popen[bytes]:
        return self.agents[-1]

    @property
    def agent_running(self) -> bool:
        return bool(self.agents) and self.agent.poll() is None

    def _started(self) -> list[subprocess.Popen[bytes]]:
        return self.agents

    def _seen(self) -> dict[int, int]:
        return {**self._descendants, **{r.pid: r.start_ticks for r in self.ranks}}

    # ------------------------------------------------------------------ observation

    def _on_line(self, line: Line) -> None:
        if match := STEP_LINE.match(line.text):
            self.trace.add(line.t, self._current_generation(), int(match.group(1)))
        elif match := RESUMED_LINE.match(line.text):
            self.resumed_from.setdefault(self._current_generation(), int(match.group(1)))

    def _current_generation(self) -> int:
        return max((r.generation for r in self.ranks), default=0)

    def _poll_once(self) -> None:
        now = time.time()
        for agent in list(self.agents):
            if agent.poll() is not None:
                continue
            self._remember_descendants(agent.pid)
            for pid in _children(agent.pid):
                with self._lock:
                    if any(r.pid == pid for r in self.ranks):
                        continue
                env = process_environ(pid)
                stat = read_stat(pid)
                if env is None or stat is None or "RANK" not in env:
                    continue  # not exec'ed yet: next poll
                with self._lock:
                    generation = self._generation_of(agent.pid, env)
                    self.ranks.append(
                        RankProcess(
                            pid, stat.start_ticks, int(env["RANK"]), generation, now, agent.pid
                        )
                    )
        live = len(self.live_ranks())
        self.max_live_ranks = max(self.max_live_ranks, live)

    def _remember_descendants(self, root: int) -> None:
        frontier = [root]
        while frontier:
            found = [child for pid in frontier for child in _children(pid)]
            frontier = []
            for pid in found:
                stat = read_stat(pid)
                if stat is None:
                    continue  # gone already
                with self._lock:
                    self._descendants[pid] = stat.start_ticks
                frontier.append(pid)

    def _generation_of(self, agent_pid: int, env: dict[str, str]) -> int:
        """A new rank process's generation (called with the lock held). One node: by
        the agent and its restart count. Multi-node: the current generation, or the
        next once a rank number it already holds is seen again (agents restart at
        different counts, and a standby agent starts at 0)."""
        if self.rendezvous is None:
            key = (agent_pid, int(env.get("TORCHELASTIC_RESTART_COUNT", "0")))
            return self._generation_keys.setdefault(key, len(self._generation_keys) + 1)
        current = self._current_generation()
        rank = int(env["RANK"])
        if current == 0:
            return 1
        if any(r.rank == rank and r.generation == current for r in self.ranks):
            return current + 1
        return current

    def live_ranks(self) -> list[RankProcess]:
        with self._lock:
            ranks = list(self.ranks)
        return [r for r in ranks if r.alive]

    def rank_process(self, rank: int) -> RankProcess:
        """The newest live process of ``rank``."""
        found = [r for r in self.live_ranks() if r.rank == rank]
        if not found:
            raise LookupError(f"torchrun: no live process for rank {rank}")
        return max(found, key=lambda r: r.generation)

    def signal_rank(self, rank: int, sig: signal.Signals) -> RankProcess:
        proc = self.rank_process(rank)
        os.kill(proc.pid, sig)
        return proc

    def agents_exited(self) -> bool:
        """Every agent started has exited (killed with its host, or done)."""
        return all(agent.poll() is not None for agent in self.agents)

    def kill_agent(self) -> None:
        """SIGKILL the agent alone (its ranks live in their own sessions)."""
        self.agent.send_signal(signal.SIGKILL)
        self.agent.wait()

    @property
    def generation(self) -> int:
        with self._lock:
            return self._current_generation()

    def current_step(self) -> int | None:
        with self._lock:
            return self.trace.max_step()

    def agent_detection_after(self, t: float) -> float | None:
        """When the agent first said, after ``t``, that a worker failed (:attr:`DETECTIONS`)."""
        with self._lock:
            lines = list(self.lines)
        for line in lines:
            if line.t >= t and any(
                p.match(line.text) and d.search(line.text) for p, d in self.DETECTIONS
            ):
                return line.t
        return None

    def snapshot(self) -> StepTrace:
        with self._lock:
            return self.trace.model_copy(deep=True)


def _children(pid: int) -> list[int]:
    """Children of every thread of ``pid`` (``/proc/PID/task/TID/children``)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except OSError:
            continue
        found += [int(p) for p in text.split()]
    return found


def process_environ(pid: int) -> dict[str, str] | None:
    """``/proc/PID/environ`` as a dict; None once the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env
