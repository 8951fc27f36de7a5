"""A real Slurm on this machine, for tests: munged, one slurmctld and three slurmd.

Why real: the Slurm launcher talks to Slurm only through its commands (``srun``,
``squeue``, ``scancel``, ``scontrol``), and what matters is how real Slurm answers
them: step ids, node states after a slurmd dies, what ``scancel --signal`` does to
a step's tasks. A fake would test our assumptions, not Slurm.

Everything lives in one session directory (state, spool, pids, logs, the munge
socket and a key made for the session), and the ports are picked free, so nothing
of the machine's own configuration is used or changed and two sessions never share
a controller. Every daemon runs in the foreground as our child in its own session:
we know each pid, and :meth:`TestSlurm.stop` ends each one by pid (SIGTERM, then
SIGKILL), after cancelling every job of the test cluster so no step outlives it.
Each daemon also carries ``LAZARUS_TEST_SLURM=<dir>`` in its environment, which
the ``slurmstepd`` processes it forks inherit: :meth:`TestSlurm.leftovers` finds
anything of this cluster still alive.

Each slurmd runs in a mount namespace of its own with a private tmpfs on
``/dev/shm`` (the node's memory: the memory checkpoint tier lives there). Every
``slurmstepd`` it forks, and so every task and rank of a step on that node, inherits
it: what one node keeps in ``/dev/shm`` the other nodes and this machine never see.
The namespace lives as long as something of the node does: after
:meth:`TestSlurm.kill_slurmd` the node's steps (if not killed too) still hold it, as
a node whose daemon crashed keeps its RAM; once the last of them is gone the tmpfs
goes, as a lost node's does. A killed slurmd is not restarted.

The directory is made under ``/tmp`` with mode 0755, not under pytest's tmp_path:
munged runs as the ``munge`` user and must traverse every parent of its socket.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

from lazarus.app.lifecycle import StartStop
from lazarus.domain.ports import free_port

__all__ = ["NODES", "TEMPLATE", "TestSlurm", "unavailable_reason"]

TEMPLATE = Path(__file__).with_name("slurm.conf.template")
NODES = ("n1", "n2", "n3")
MARKER = "LAZARUS_TEST_SLURM"
SBIN_PATH = "/usr/sbin:/sbin"
DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("srun", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
READY_TIMEOUT_S = 120.0
"""For every node to read idle: generous, a loaded 2-core machine starts slowly."""
STOP_TIMEOUT_S = 15.0


def _which(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), SBIN_PATH]))


def unavailable_reason() -> str | None:
    """Why a test Slurm cannot run here (one line naming what is missing), or None.
    Tests skip on it (or fail under CI)."""
    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append("needs root (slurmd runs as root; munged as the munge user)")
    missing = [n for n in (*DAEMONS, *COMMANDS) if _which(n) is None]
    if missing:
        problems.append(
            f"missing {', '.join(missing)}: install the Debian packages slurm-wlm and munge "
            "(sudo bash infra/install-test-prereqs.sh)"
        )
    try:
        pwd.getpwnam("munge")
    except KeyError:
        problems.append("no munge user: install the Debian package munge")
    return "; ".join(problems) if problems else None


@dataclass
class _Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class TestSlurm(StartStop):
    """``with TestSlurm() as slurm:`` nodes n1..n3 idle inside; nothing left after.

    ``env`` is what a Slurm command needs to reach this cluster (``SLURM_CONF``)."""

    __test__ = False  # not a pytest test class, despite the name

    slurmd_timeout_s: int = 10
    cred_expire_s: int | None = None
    """``AuthInfo=cred_expire``: a job step credential's lifetime, and how long Slurm
    holds a requeued job before it may start again (None: Slurm's default, 120 s)."""
    ready_timeout_s: float = READY_TIMEOUT_S
    root: Path | None = None
    host: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    _daemons: list[_Daemon] = field(default_factory=list)
    _slurmd: dict[str, _Daemon] = field(default_factory=dict)
    _own_root: bool = False

    @property
    def conf(self) -> Path:
        assert self.root is not None, "not started"
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    # --- start ------------------------------------------------------------------------

    def start(self) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"cannot start a test Slurm: {reason}")
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="lazarus-slurm-", dir="/tmp"))
            self._own_root = True
        self.root.chmod(0o755)
        for sub in ("state", "spool", "log", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._write_config()
        self._start_munged()
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        for node in NODES:
            self._slurmd[node] = self._spawn(
                f"slurmd-{node}",
                ["slurmd", "-D", "-f", str(self.conf), "-N", node],
                private_shm=self.shm_source(node),
            )
        self.wait_idle(NODES, self.ready_timeout_s)

    def _write_config(self) -> None:
        assert self.root is not None
        ports = {f"N{i}_PORT": str(free_port()) for i in range(1, len(NODES) + 1)}
        text = Template(TEMPLATE.read_text()).substitute(
            SLURM_DIR=str(self.root),
            HOST=self.host,
            MUNGE_SOCKET=str(self.root / "munge" / "munge.socket"),
            SLURM_USER="root",
            CTLD_PORT=str(free_port()),
            SLURMD_PORT=str(free_port()),
            SLURMD_TIMEOUT=str(self.slurmd_timeout_s),
            CRED_EXPIRE="" if self.cred_expire_s is None else f",cred_expire={self.cred_expire_s}",
            CPUS=str(os.cpu_count() or 1),
            **ports,
        )
        self.conf.write_text(text)

    def _start_munged(self) -> None:
        """munged as the munge user with a key made for this session (0400, owned by
        munge): the machine's own key and socket are never touched."""
        assert self.root is not None
        munge = pwd.getpwnam("munge")
        folder = self.root / "munge"
        key = folder / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        os.chown(key, munge.pw_uid, munge.pw_gid)
        key.chmod(0o400)
        os.chown(folder, munge.pw_uid, munge.pw_gid)
        folder.chmod(0o755)
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                f"--socket={folder / 'munge.socket'}",
                f"--key-file={key}",
                f"--pid-file={folder / 'munged.pid'}",
                f"--log-file={folder / 'munged.log'}",
                f"--seed-file={folder / 'munged.seed'}",
            ],
            user=munge.pw_uid,
            group=munge.pw_gid,
        )
        deadline = time.monotonic() + 30.0
        while not (folder / "munge.socket").exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged made no socket within 30 s; see {folder}")
            time.sleep(0.05)

    def shm_source(self, node: str) -> str:
        """How ``node``'s private ``/dev/shm`` reads in ``/proc/*/mountinfo``."""
        assert self.root is not None, "not started"
        return f"{self.root.name}-{node}-shm"

    def _spawn(
        self,
        name: str,
        argv: list[str],
        user: int | None = None,
        group: int | None = None,
        private_shm: str | None = None,
    ) -> _Daemon:
        """Start a daemon in the foreground, as our child; with ``private_shm`` (a
        mount source name) in a mount namespace of its own with a fresh tmpfs on
        ``/dev/shm``. ``unshare`` and ``sh`` exec in place: the pid is the daemon's."""
        assert self.root is not None
        binary = _which(argv[0])
        if binary is None:
            raise RuntimeError(f"{argv[0]} not found")
        command = [binary, *argv[1:]]
        if private_shm is not None:
            unshare = _which("unshare")
            if unshare is None:
                raise RuntimeError("unshare not found: install the Debian package util-linux")
            command = [
                unshare,
                "--mount",
                "--propagation",
                "slave",  # the shared filesystem stays live; nothing leaks out
                "--",
                "/bin/sh",
                "-c",
                f'mount -t tmpfs -o mode=1777,nosuid,nodev {private_shm} /dev/shm && exec "$@"',
                "sh",
                *command,
            ]
        log = self.root / "log" / f"{name}.out"
        env = {
            "PATH": os.pathsep.join([os.environ.get("PATH", "/usr/bin:/bin"), SBIN_PATH]),
            "SLURM_CONF": str(self.conf),
            MARKER: str(self.root),
        }
        with open(log, "ab") as out:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.root,
                start_new_session=True,
                user=user,
                group=group,
            )
        daemon = _Daemon(name, process, log)
        self._daemons.append(daemon)
        return daemon

    def _check_alive(self) -> None:
        for daemon in self._daemons:
            if daemon.process.poll() is not None:
                tail = daemon.log.read_text(errors="replace").strip().splitlines()[-3:]
                raise RuntimeError(
                    f"{daemon.name} exited ({daemon.process.returncode}): {' | '.join(tail)}"
                )

    # --- use --------------------------------------------------------------------------

    def command(self, *argv: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster (exit status not checked)."""
        binary = _which(argv[0]) or argv[0]
        return subprocess.run(
            [binary, *argv[1:]],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**_without_slurm(os.environ), **self.env},
            stdin=subprocess.DEVNULL,
        )

    def node_states(self) -> dict[str, str]:
        """``sinfo``'s long state of each node (``idle``, ``down*``, ``drained``...)."""
        done = self.command("sinfo", "-h", "-N", "-o", "%N %T")
        states: dict[str, str] = {}
        for line in done.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def wait_idle(self, nodes: tuple[str, ...] | list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        while True:
            self._check_alive()
            with contextlib.suppress(subprocess.TimeoutExpired):
                states = self.node_states()
                if all(states.get(n) == "idle" for n in nodes):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Slurm nodes not idle within {timeout_s:g} s: {states or 'no answer'}; "
                    f"see {self.root}/log"
                )
            time.sleep(0.25)

    def allocate(
        self,
        nodes: int = len(NODES),
        timeout_s: float = 60.0,
        extra_args: tuple[str, ...] = (),
        holder: str = "exec sleep 100000",
    ) -> int:
        """A holder allocation, as a user would make one (``sbatch --no-kill
        --no-requeue`` running ``holder``, plus ``extra_args`` such as
        ``--signal=B:USR1@60``): its job id once it runs."""
        done = self.command(
            "sbatch",
            "--parsable",
            "--no-kill",
            "--no-requeue",
            *extra_args,
            "-N",
            str(nodes),
            "--job-name=lazarus-holder",
            f"--output={self.root}/log/holder-%j.out",
            "--wrap",
            holder,
        )
        if done.returncode != 0:
            raise RuntimeError(f"sbatch failed: {done.stderr.strip()}")
        job = int(done.stdout.strip().split(";")[0])
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.command("squeue", "-h", "-j", str(job), "-o", "%T").stdout.strip()
            if state == "RUNNING":
                return job
            if time.monotonic() > deadline:
                raise RuntimeError(f"allocation {job} not running within {timeout_s:g} s: {state}")
            time.sleep(0.2)

    def kill_slurmd(self, node: str) -> None:
        """SIGKILL one node's slurmd (its running steps' slurmstepd survive, as on a
        node whose daemon crashed, and hold the node's ``/dev/shm`` until they end)."""
        daemon = self._slurmd[node]
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon.process.pid, signal.SIGKILL)
        daemon.process.wait(timeout=STOP_TIMEOUT_S)

    def kill_node(self, node: str) -> list[int]:
        """``node`` dies: its slurmd and every process of its steps, SIGKILLed; returns
        the pids killed besides slurmd. The steps' processes are those whose environment
        names this node (``SLURMD_NODENAME``, which forks inherit: a warm node's zygote
        and the ranks forked from it) of this cluster (``SLURM_CONF``: a private
        cluster's nodes have the session cluster's names; the nodes share this host),
        their ``slurmstepd`` and everything under them (a rank under a Lazarus task)."""
        marks = {f"SLURMD_NODENAME={node}".encode(), f"SLURM_CONF={self.conf}".encode()}
        parents: dict[int, int] = {}
        victims: set[int] = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError):
                    stat = (entry / "stat").read_text()
                    parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
                    if marks <= set((entry / "environ").read_bytes().split(b"\0")):
                        victims.add(int(entry.name))
        for pid in list(victims):
            with contextlib.suppress(OSError, KeyError):
                if Path(f"/proc/{parents[pid]}/comm").read_text().startswith("slurmstepd"):
                    victims.add(parents[pid])
        while more := {p for p, parent in parents.items() if parent in victims} - victims:
            victims |= more  # every descendant of a victim
        self.kill_slurmd(node)
        for pid in sorted(victims):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return sorted(victims)

    def mount_namespace(self, node: str) -> str | None:
        """``node``'s mount namespace (``mnt:[inode]``) while its slurmd runs, else None."""
        daemon = self._slurmd.get(node)
        if daemon is None or daemon.process.poll() is not None:
            return None
        try:
            return os.readlink(f"/proc/{daemon.process.pid}/ns/mnt")
        except OSError:
            return None

    # --- stop -------------------------------------------------------------------------

    def leftovers(self) -> list[int]:
        """Pids of processes still carrying this cluster's marker (daemons, stepds)."""
        if self.root is None:
            return []
        needle = f"{MARKER}={self.root}".encode()
        found: list[int] = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if stat[stat.rindex(")") + 2] == "Z":
                    continue  # a zombie holds nothing and dies with its reaper
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
        return sorted(found)

    def stop(self) -> None:
        """Cancel every job (so no step outlives the cluster), stop every daemon we
        started by pid (SIGTERM, then SIGKILL), then anything left with our marker.
        Idempotent; safe after a partial start."""
        if self._daemons and self._daemons[-1].process.poll() is None:
            with contextlib.suppress(Exception):
                self.command("scancel", "--user=root", "--full", timeout_s=15.0)
                deadline = time.monotonic() + STOP_TIMEOUT_S
                while time.monotonic() < deadline:
                    if not self.command("squeue", "-h", timeout_s=10.0).stdout.strip():
                        break
                    time.sleep(0.2)
        for daemon in reversed(self._daemons):
            _end(daemon.process)
        self._daemons.clear()
        for pid in self.leftovers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self.leftovers() and time.monotonic() < deadline:
            time.sleep(0.1)

    def remove(self) -> None:
        """Remove the session directory (only one this object made)."""
        if self._own_root and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


def _end(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the daemon's group, SIGKILL it after a while; always reaped."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # helpers of the daemon (slurmscriptd)


def _without_slurm(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if not k.startswith("SLURM_")}
