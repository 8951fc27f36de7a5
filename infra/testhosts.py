"""Real test hosts: one Linux network namespace per host, each running its own OpenSSH sshd.

Why this exists: multi-node support talks to nodes over SSH, starts ranks there and must
survive a node dying or dropping off the network. Mocking SSH would test our assumptions,
not OpenSSH; VMs or containers are slow and need images. A network namespace is the
cheapest thing that behaves like a separate machine *on the network*: its own interface,
address, routes and listening sockets, reachable from the controller through a bridge,
killable (SIGKILL everything in it) and partitionable (link down) independently.

Each host also has its own memory: a private tmpfs on ``/dev/shm``, in a mount namespace
of the host's own. A stand-in for the machine's init (``sleep infinity``, started first)
creates that namespace and holds it; sshd, and so every login, rank and zygote, is
started inside it. So what a node keeps in ``/dev/shm`` (the memory checkpoint tier) is
seen by that node only, and when the host is killed (every process in its network
namespace SIGKILLed, the holder included) the last reference to the mount namespace
goes and the tmpfs with it, as a real machine's RAM goes: :meth:`TestHosts.restart_sshd`
after :meth:`TestHosts.kill_host` boots the host with an empty ``/dev/shm``.

What it deliberately shares with the root namespace: every other mount (the filesystem),
users, hostname and PID space. Sharing the filesystem is the point — the repo and the
venv are at the same paths on every "node", exactly as the product expects ("nodes need
only the training environment"). It also means every host reports the same
``hostname``; use the address (``hostname -I``) to tell hosts apart.

Topology for one run (``k`` is picked per run so concurrent runs do not clash)::

    root ns:  lzb-<rid>  10.231.k.1/24   (bridge; the controller runs here)
               |-- lzv-<rid>-1 <veth> eth0 10.231.k.11/24 in ns lzt-<rid>-h1  (sshd :22)
               |-- lzv-<rid>-2 <veth> eth0 10.231.k.12/24 in ns lzt-<rid>-h2  (sshd :22)
               ...

Leftovers from crashed runs are found by name and removed by :func:`cleanup_stale`. To
never remove a *concurrent* run's hosts, every run registers itself (pid + process start
time) under ``/run/lazarus-testhosts`` before creating anything; only resources whose
owner is dead are stale.

Known pitfalls:

* Hosts reach each other through the root-namespace bridge. If ``br_netfilter`` is loaded
  with ``bridge-nf-call-iptables=1`` *and* iptables has a FORWARD DROP policy (Docker
  does this), host-to-host traffic is dropped while root-to-host works.
* With ``UsePAM no`` OpenSSH refuses any login (even with a key) to an account whose
  shadow password starts with ``!`` (locked). :meth:`TestHosts.start` checks this.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import secrets
import select
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, ClassVar

from infra.testhost_network import (
    _IFNAMSIZ,
    _RUN_ID_RE,
    _SHM_SIZE_RE,
    BRIDGE_HOST_OCTET,
    BRIDGE_PREFIX,
    DEFAULT_INTERFACE,
    FIRST_HOST_OCTET,
    KILL_TIMEOUT_S,
    MAX_HOSTS,
    NS_PREFIX,
    PRIVSEP_DIR,
    READY_TIMEOUT_S,
    SHM,
    SHM_SOURCE_SUFFIX,
    SSH_PORT,
    SSHD,
    SUBNET_PREFIX,
    VETH_PREFIX,
    _choose_third_octet,
    _ip,
    _ip_binary,
    _kill_netns_processes,
    _link_exists,
    _list_netns,
    _login_locked,
    _netns_exists,
    _ns_pids,
    _process_start_time,
    _quietly,
    _read_record,
    _record_alive,
    _record_path,
    _registry_lock,
    _run,
    _ssh_keygen_binary,
    _util_binary,
    cleanup_stale,
    ensure_prerequisites,
    nameservers,
)
from lazarus.app.lifecycle import StartStop

__all__ = [
    "SSHD",
    "TestHost",
    "TestHosts",
    "cleanup_stale",
    "ensure_prerequisites",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TestHost:
    """One simulated machine: a network namespace reachable at ``address:port`` over SSH."""

    __test__: ClassVar[bool] = False  # not a pytest test class, despite the name

    name: str
    netns: str
    address: str
    port: int
    interface: str


_ACTIVE: set[TestHosts] = set()
_ACTIVE_LOCK = threading.Lock()


def _stop_all_active() -> None:
    """atexit hook: the last line of defence if a caller forgot ``stop()``."""
    with _ACTIVE_LOCK:
        active = list(_ACTIVE)
    for hosts in active:
        # A forked child exiting through atexit must not tear down its parent's hosts.
        if hosts._owner_pid == os.getpid():
            hosts.stop()


atexit.register(_stop_all_active)


class TestHosts(StartStop):
    """``count`` SSH-reachable hosts in network namespaces. Use as a context manager.

    ``hosts`` is filled by :meth:`start` (addresses depend on the subnet chosen then).
    ``known_hosts`` and ``identity_file`` are fixed paths from construction and exist
    once :meth:`start` has returned. ``user`` must exist on this machine; root is the
    tested configuration (key files live in a root-owned directory).
    """

    __test__: ClassVar[bool] = False  # not a pytest test class, despite the name

    def __init__(
        self,
        count: int,
        workdir: Path,
        user: str = "root",
        run_id: str | None = None,
        *,
        interface: str = DEFAULT_INTERFACE,
        shm_size: str | None = None,
    ) -> None:
        """``shm_size``: each host's ``/dev/shm`` (tmpfs ``size=``, e.g. ``"2g"`` or
        ``"10%"`` of this machine's RAM); None for the kernel's default, half the RAM,
        as on most machines. Every host's is counted against the same RAM."""
        if not 1 <= count <= MAX_HOSTS:
            raise ValueError(f"count must be between 1 and {MAX_HOSTS}, got {count}")
        rid = run_id if run_id is not None else secrets.token_hex(3)
        if not _RUN_ID_RE.match(rid):
            raise ValueError(f"run_id must match {_RUN_ID_RE.pattern} (IFNAMSIZ), got {rid!r}")
        if not 1 <= len(interface) <= _IFNAMSIZ or "/" in interface or " " in interface:
            raise ValueError(f"invalid interface name {interface!r}")
        if shm_size is not None and not _SHM_SIZE_RE.match(shm_size):
            raise ValueError(f"shm_size must be a tmpfs size such as 2g or 10%, got {shm_size!r}")
        self.shm_size = shm_size
        self.count = count
        self.user = user
        self.run_id = rid
        self.interface = interface
        self.workdir = Path(workdir)
        self.dir = self.workdir / f"{NS_PREFIX}{rid}"
        self.bridge = f"{BRIDGE_PREFIX}{rid}"
        self.known_hosts = self.dir / "known_hosts"
        self.identity_file = self.dir / "id_ed25519"
        self.hosts: list[TestHost] = []
        self.bridge_address: str | None = None
        self._third_octet: int | None = None
        self._sshd: dict[str, subprocess.Popen[bytes]] = {}
        # Per host, the process holding its mount namespace (and so its /dev/shm):
        # alive from boot until the host is killed or stopped.
        self._machines: dict[str, subprocess.Popen[bytes]] = {}
        self._sshd_logs: dict[str, IO[bytes]] = {}
        self._lock = threading.RLock()
        self._registered = False  # start() was called and stop() has not run since
        # True from the moment our registry record exists until stop(): only then may
        # stop() delete namespaces/links/dirs named after our run id. Guards against
        # destroying another live run's hosts when run ids collide.
        self._owns_resources = False
        self._owner_pid = os.getpid()

    # -- names ------------------------------------------------------------------------

    def _names(self) -> list[str]:
        return [f"h{i}" for i in range(1, self.count + 1)]

    def _netns_name(self, name: str) -> str:
        return f"{NS_PREFIX}{self.run_id}-{name}"

    def _veth_name(self, name: str) -> str:
        return f"{VETH_PREFIX}{self.run_id}-{name.removeprefix('h')}"

    def _host_dir(self, name: str) -> Path:
        return self.dir / name

    def host(self, name: str) -> TestHost:
        """The host called ``name`` (``h1``...); KeyError if there is no such host."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no test host {name!r} (have {[h.name for h in self.hosts]})")

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Create the network, start one sshd per host and wait until all accept TCP.

        On any failure everything created so far is torn down before the error propagates.
        """
        if os.geteuid() != 0:
            raise RuntimeError("TestHosts needs root (network namespaces, veths, sshd)")
        ensure_prerequisites()
        if _login_locked(self.user):
            raise RuntimeError(
                f"account {self.user!r} is locked ('!' in /etc/shadow); sshd with UsePAM no "
                f"rejects even key logins for it. Unlock with: usermod -p '*' {self.user}"
            )
        cleanup_stale()
        with self._lock:
            if self._registered:
                raise RuntimeError("TestHosts.start() called twice")
            with _ACTIVE_LOCK:
                _ACTIVE.add(self)
            self._registered = True
            self.hosts = []
            try:
                self._start()
            except BaseException:
                self.stop()
                raise

    def _start(self) -> None:
        started = time.monotonic()
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)

        with _registry_lock():
            if (
                _record_alive(_read_record(self.run_id))
                or _link_exists(self.bridge)
                or any(ns.startswith(f"{NS_PREFIX}{self.run_id}-") for ns in _list_netns())
            ):
                raise RuntimeError(f"test-host run id {self.run_id!r} is already in use")
            k = _choose_third_octet(self.run_id)
            # Register *before* creating anything, so cleanup_stale in a concurrent run
            # never mistakes our half-built hosts for leftovers.
            start_time = _process_start_time(os.getpid())
            record = {
                "pid": os.getpid(),
                "start_time": start_time,
                "third_octet": k,
                "tmpdir": str(self.dir),
            }
            _record_path(self.run_id).write_text(json.dumps(record))
            self._owns_resources = True
            self._owner_pid = os.getpid()
            self._third_octet = k
            self.bridge_address = f"{SUBNET_PREFIX}.{k}.{BRIDGE_HOST_OCTET}"
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")

        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o711)  # traversable, so a non-root user's sshd child can read keys
        self._write_client_key()
        for i, name in enumerate(self._names()):
            self.hosts.append(
                self._create_host(name, f"{SUBNET_PREFIX}.{k}.{FIRST_HOST_OCTET + i}")
            )
        for host in self.hosts:
            self._start_sshd(host)
        for host in self.hosts:
            self._wait_ready(host)
            self._fail_dns_fast(host)
        self._write_known_hosts()
        log.info(
            "testhosts %s: %d hosts on %s.%d.0/24 ready in %.2fs",
            self.run_id,
            self.count,
            SUBNET_PREFIX,
            k,
            time.monotonic() - started,
        )

    def _write_client_key(self) -> None:
        _run(
            [
                _ssh_keygen_binary(),
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                f"lazarus-testhosts-{self.run_id}",
                "-f",
                str(self.identity_file),
            ]
        )
        pub = Path(f"{self.identity_file}.pub").read_text()
        authorized = self.dir / "authorized_keys"
        authorized.write_text(pub)
        os.chmod(authorized, 0o644)  # a public key; readable so non-root logins work too

    def _create_host(self, name: str, address: str) -> TestHost:
        ns, veth = self._netns_name(name), self._veth_name(name)
        _ip("netns", "add", ns)
        # Create the peer directly inside the namespace under its final name: no
        # temporary name in the root ns, so no clash with the host's own eth0.
        _ip("link", "add", veth, "type", "veth", "peer", "name", self.interface, "netns", ns)
        _ip("link", "set", veth, "master", self.bridge, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", self.interface)
        _ip("-n", ns, "link", "set", self.interface, "up")
        assert self.bridge_address is not None
        _ip("-n", ns, "route", "add", "default", "via", self.bridge_address)

        hdir = self._host_dir(name)
        hdir.mkdir(mode=0o700, exist_ok=True)
        host_key = hdir / "ssh_host_ed25519_key"
        _run(
            [
                _ssh_keygen_binary(),
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                f"{name}.{self.run_id}",
                "-f",
                str(host_key),
            ]
        )
        config = "\n".join(
            [
                f"ListenAddress {address}",
                f"Port {SSH_PORT}",
                f"HostKey {host_key}",
                f"PidFile {hdir / 'sshd.pid'}",
                f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "UseDNS no",
                "PrintMotd no",
                "PrintLastLog no",
                "Subsystem sftp internal-sftp",
                "AcceptEnv *",
                # A clean HOME: the machine user's ~/.bashrc (sourced by bash for every
                # ssh command) may be slow or, after a host is killed mid-login, block on
                # a stale lock; test hosts must not depend on it.
                f"SetEnv HOME={self._clean_home()}",
                "LogLevel ERROR",
                "MaxStartups 100",
                "MaxSessions 100",
                "",
            ]
        )
        (hdir / "sshd_config").write_text(config)
        return TestHost(
            name=name, netns=ns, address=address, port=SSH_PORT, interface=self.interface
        )

    def _fail_dns_fast(self, host: TestHost) -> None:
        """Make DNS fail at once inside a host, as a cluster's DNS answers at once.

        The namespaces reach nothing beyond the bridge, so a lookup waits out the
        resolver's timeouts (10 s with glibc's defaults), and c10d's rendezvous does a
        reverse lookup of each peer: every generation would start 20 s late. An
        ``unreachable`` route to each nameserver, inside the namespace only, makes
        those lookups fail in microseconds (c10d logs a warning and carries on)."""
        for server in nameservers():
            _ip("-n", host.netns, "route", "replace", "unreachable", f"{server}/32")

    def _clean_home(self) -> Path:
        home = self.dir / "home"
        home.mkdir(parents=True, exist_ok=True)
        return home

    def _machine_up(self, name: str) -> int | None:
        """The pid holding the host's mount namespace, or None when the host is down."""
        machine = self._machines.get(name)
        return machine.pid if machine is not None and machine.poll() is None else None

    def _boot(self, host: TestHost) -> int:
        """Start the host's stand-in init: in the host's network namespace, a mount
        namespace of its own with a fresh tmpfs on /dev/shm, held by ``sleep infinity``.

        ``ip netns exec`` already gives the command a mount namespace (to show the
        namespace's own /sys), but one that dies with that command: ``unshare`` makes
        the one that lasts, with every mount a *slave* of this machine's (the shared
        filesystem stays live; nothing mounted inside leaks out). ``ip``, ``unshare``
        and ``sh`` each exec in place, so the Popen pid is the holder's."""
        machine = self._machines.pop(host.name, None)
        if machine is not None:
            self._reap(machine)
        options = "mode=1777,nosuid,nodev" + (f",size={self.shm_size}" if self.shm_size else "")
        source = f"{host.netns}{SHM_SOURCE_SUFFIX}"
        script = (
            f"mount -t tmpfs -o {options} {source} {SHM} && echo up && "
            f"exec {_util_binary('sleep', 'coreutils')} infinity"
        )
        with open(self._host_dir(host.name) / "machine.log", "ab") as log_file:
            machine = subprocess.Popen(
                [
                    _ip_binary(),
                    "netns",
                    "exec",
                    host.netns,
                    _util_binary("unshare", "util-linux"),
                    "--mount",
                    "--propagation",
                    "slave",
                    "--",
                    "/bin/sh",
                    "-c",
                    script,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log_file,
                start_new_session=True,  # a Ctrl-C for pytest is not for the hosts
            )
        self._machines[host.name] = machine
        assert machine.stdout is not None
        with machine.stdout:
            ready, _, _ = select.select([machine.stdout], [], [], READY_TIMEOUT_S)
            line = machine.stdout.readline() if ready else b""
        if line.strip() != b"up":
            self._reap(machine)
            try:
                why = (self._host_dir(host.name) / "machine.log").read_text()[-2000:].strip()
            except OSError:
                why = "<no log>"
            raise RuntimeError(f"test host {host.name} did not boot (tmpfs on {SHM}): {why}")
        return machine.pid

    def _start_sshd(self, host: TestHost) -> None:
        """sshd inside the host (its network and mount namespaces), booting the host
        first if it is down."""
        hdir = self._host_dir(host.name)
        machine = self._machine_up(host.name)
        if machine is None:
            machine = self._boot(host)
        old_log = self._sshd_logs.pop(host.name, None)
        if old_log is not None:
            old_log.close()
        logfile = open(hdir / "sshd.log", "ab")  # noqa: SIM115 - lives as long as sshd
        self._sshd_logs[host.name] = logfile
        # nsenter execs sshd in place, so the Popen pid *is* sshd's pid.
        # New session: a Ctrl-C meant for pytest must reach pytest (which then runs
        # stop()), not race it by killing sshd under our feet.
        self._sshd[host.name] = subprocess.Popen(
            [
                *self._enter(machine),
                SSHD,
                "-D",
                "-e",
                "-f",
                str(hdir / "sshd_config"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _wait_ready(self, host: TestHost, timeout: float = READY_TIMEOUT_S) -> None:
        """Probe from the root namespace — the controller's point of view — for the banner."""
        proc = self._sshd[host.name]
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"sshd for {host.name} exited with {proc.returncode}: {self._log_tail(host)}"
                )
            try:
                with socket.create_connection((host.address, host.port), timeout=1.0) as sock:
                    sock.settimeout(2.0)
                    if sock.recv(64).startswith(b"SSH-"):
                        return
            except OSError as exc:
                last_error = exc
            time.sleep(0.02)
        raise RuntimeError(
            f"sshd for {host.name} not accepting on {host.address}:{host.port} after "
            f"{timeout:.0f}s (last error: {last_error}): {self._log_tail(host)}"
        )

    def _log_tail(self, host: TestHost) -> str:
        try:
            return (self._host_dir(host.name) / "sshd.log").read_text()[-2000:].strip()
        except OSError:
            return "<no sshd log>"

    def _write_known_hosts(self) -> None:
        lines = []
        for host in self.hosts:
            keytype, key = (
                (self._host_dir(host.name) / "ssh_host_ed25519_key.pub").read_text().split()[:2]
            )
            # OpenSSH and paramiko look port 22 up by bare address, others as [addr]:port.
            spec = host.address if host.port == 22 else f"[{host.address}]:{host.port}"
            lines.append(f"{spec} {keytype} {key}\n")
        self.known_hosts.write_text("".join(lines))

    def stop(self) -> None:
        """Tear everything down. Idempotent, never raises, fine after a partial start."""
        with self._lock:
            if self._owns_resources:
                for name in self._names():
                    ns, veth = self._netns_name(name), self._veth_name(name)
                    if _netns_exists(ns):
                        _quietly(f"kill {ns}", _kill_netns_processes, ns)
                    if _link_exists(veth):
                        _quietly(f"del {veth}", _ip, "link", "del", veth)
                    if _netns_exists(ns):
                        _quietly(f"del netns {ns}", _ip, "netns", "del", ns)
            for name, proc in [*self._sshd.items(), *self._machines.items()]:
                _quietly(f"reap {name} pid {proc.pid}", self._reap, proc)
            self._sshd.clear()
            self._machines.clear()
            for logfile in self._sshd_logs.values():
                _quietly("close log", logfile.close)
            self._sshd_logs.clear()
            if self._owns_resources:
                if _link_exists(self.bridge):
                    _quietly(f"del {self.bridge}", _ip, "link", "del", self.bridge)
                _quietly("remove tmpdir", shutil.rmtree, self.dir, True)
                _quietly("unregister", self._unregister)
                self._owns_resources = False
            self._registered = False
            with _ACTIVE_LOCK:
                _ACTIVE.discard(self)

    def _unregister(self) -> None:
        record = _read_record(self.run_id)
        if record is not None and record.get("pid") == os.getpid():
            _record_path(self.run_id).unlink(missing_ok=True)

    @staticmethod
    def _reap(proc: subprocess.Popen[bytes]) -> None:
        """Make sure an sshd we spawned is dead and waited for (no zombie, no warning)."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        proc.wait(timeout=KILL_TIMEOUT_S)

    # -- fault injection --------------------------------------------------------------

    def _set_link(self, name: str, up: bool) -> None:
        # Toggle the root-side veth only: the namespace's eth0 keeps its address and
        # default route (an admin-down eth0 would delete the route, and heal() would
        # have to rebuild it); it just loses carrier, like an unplugged cable.
        self.host(name)
        _ip("link", "set", self._veth_name(name), "up" if up else "down")

    def kill_host(self, name: str) -> None:
        """The machine dies: link down first (no last gasp on the wire), then SIGKILL all.

        Everything in the namespace goes, the holder of the host's mount namespace
        too, so its ``/dev/shm`` is gone once this returns."""
        host = self.host(name)
        self._set_link(name, up=False)
        _kill_netns_processes(host.netns)
        for procs in (self._sshd, self._machines):
            proc = procs.get(name)
            if proc is not None:
                self._reap(proc)

    def partition(self, name: str) -> None:
        """Network partition: unplug the cable, processes keep running."""
        self._set_link(name, up=False)

    def heal(self, name: str) -> None:
        """Plug the cable back in; whatever still runs there is reachable again."""
        self._set_link(name, up=True)

    def restart_sshd(self, name: str) -> None:
        """The node comes back: link up and a fresh sshd (same host key), ready on return.

        After :meth:`kill_host` this boots the host: a new mount namespace and an empty
        ``/dev/shm``. On a host that is up (say partitioned) only sshd is restarted,
        and ``/dev/shm`` is kept, as by a real sshd restart."""
        host = self.host(name)
        proc = self._sshd.get(name)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=KILL_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._reap(proc)
        self._set_link(name, up=True)
        self._start_sshd(host)
        self._wait_ready(host)

    # -- inspection -------------------------------------------------------------------

    def pids(self, name: str) -> list[int]:
        """Processes currently in the host's namespace (the holder of its ``/dev/shm``,
        sshd, sessions, ranks...)."""
        return _ns_pids(self.host(name).netns)

    def mount_namespace(self, name: str) -> str | None:
        """The host's mount namespace (``mnt:[inode]``, as ``/proc/PID/ns/mnt`` reads)
        while it is up; None once it was killed (or before it booted)."""
        self.host(name)
        pid = self._machine_up(name)
        if pid is None:
            return None
        try:
            return os.readlink(f"/proc/{pid}/ns/mnt")
        except OSError:
            return None

    def root_path(self, name: str) -> Path | None:
        """The host's filesystem as its own processes see it, its private ``/dev/shm``
        included, from this namespace (``/proc/<holder>/root``): what a node keeps in
        tmpfs, read without logging in. None while the host is down."""
        self.host(name)
        pid = self._machine_up(name)
        return None if pid is None else Path(f"/proc/{pid}/root")

    @staticmethod
    def _enter(pid: int, workdir: str | None = None) -> list[str]:
        """The command prefix that runs a command in the network and mount namespaces
        of ``pid`` (a host's holder), in ``workdir`` (None: ``/``, where entering a
        mount namespace leaves a process)."""
        return [
            _util_binary("nsenter", "util-linux"),
            f"--target={pid}",
            "--net",
            "--mount",
            *([f"--wd={workdir}"] if workdir is not None else []),
            "--",
        ]

    def command_inside(self, name: str, workdir: str | None = None) -> list[str]:
        """The argv prefix that runs a long-lived command inside the host (its network
        namespace and its ``/dev/shm``; not via SSH), for a caller that starts it itself
        (``Popen``): ``nsenter`` execs in place, so the process started *is* the command,
        and :meth:`kill_host` kills it with everything else in the namespace. A killed
        host runs nothing: RuntimeError."""
        self.host(name)
        pid = self._machine_up(name)
        if pid is None:
            raise RuntimeError(f"test host {name} is down: restart_sshd() boots it again")
        return self._enter(pid, workdir)

    def exec(
        self, name: str, *argv: str, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the host (its network namespace and its ``/dev/shm``; not
        via SSH), capturing text output. A killed host runs nothing: RuntimeError."""
        self.host(name)
        pid = self._machine_up(name)
        if pid is None:
            raise RuntimeError(f"test host {name} is down: restart_sshd() boots it again")
        return subprocess.run(
            [*self._enter(pid, os.getcwd()), *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    def ssh_argv(self, name: str, *command: str) -> list[str]:
        """An OpenSSH client command line for ``name`` with strict host-key checking."""
        host = self.host(name)
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(self.identity_file),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            "-o",
            "LogLevel=ERROR",
            "-p",
            str(host.port),
            f"{self.user}@{host.address}",
            *command,
        ]
