"""The network-namespace plumbing under :mod:`infra.testhosts`: binaries, ``ip``
and process helpers, the run registry that keeps concurrent runs apart, address choice,
prerequisites and the cleanup of crashed runs' leftovers.

Split from ``testhosts.py`` (issue 27: one concern per file) so that module holds the
hosts themselves: :class:`~infra.testhosts.TestHosts` and its lifecycle. See its
docstring for the topology and the pitfalls.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SSHD = "/usr/sbin/sshd"
NS_PREFIX = "lzt-"
BRIDGE_PREFIX = "lzb-"
VETH_PREFIX = "lzv-"
SUBNET_PREFIX = "10.231"
BRIDGE_HOST_OCTET = 1
FIRST_HOST_OCTET = 11  # h1 -> .11, h2 -> .12, ...
MAX_HOSTS = 99  # keeps veth names (lzv-<8>-<2>) within the kernel's 15-char IFNAMSIZ limit
SSH_PORT = 22
DEFAULT_INTERFACE = "eth0"
REGISTRY_DIR = Path("/run/lazarus-testhosts")
PRIVSEP_DIR = Path("/run/sshd")
READY_TIMEOUT_S = 15.0
KILL_TIMEOUT_S = 5.0
SHM = "/dev/shm"
SHM_SOURCE_SUFFIX = "-shm"  # a host's tmpfs reads "lzt-<rid>-hN-shm" in /proc/*/mountinfo
_SHM_SIZE_RE = re.compile(r"^[1-9][0-9]{0,15}[kmgKMG%]?$")

_RUN_ID_RE = re.compile(r"^[a-z0-9]{1,8}$")
_IFNAMSIZ = 15


# --------------------------------------------------------------------------------------
# small helpers


def _ip_binary() -> str:
    """Locate ``ip`` even when PATH lacks /usr/sbin (common for non-login root shells)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin"])
    found = shutil.which("ip", path=path)
    if found is None:
        raise RuntimeError("`ip` not found: install the Debian package iproute2")
    return found


def _util_binary(name: str, package: str) -> str:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin", "/bin", "/usr/sbin"])
    found = shutil.which(name, path=path)
    if found is None:
        raise RuntimeError(f"`{name}` not found: install the Debian package {package}")
    return found


def _ssh_keygen_binary() -> str:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin"])
    found = shutil.which("ssh-keygen", path=path)
    if found is None:
        raise RuntimeError("`ssh-keygen` not found: install the Debian package openssh-client")
    return found


def _run(argv: list[str], *, check: bool = True, timeout: float = 30.0) -> str:
    """Run a short admin command; on failure raise with its stderr (the useful part)."""
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"command failed (rc={proc.returncode}): {' '.join(argv)}\n{proc.stderr.strip()}"
        )
    return proc.stdout


def _ip(*args: str, check: bool = True) -> str:
    return _run([_ip_binary(), *args], check=check)


def _quietly(what: str, fn: Callable[..., object], *args: Any) -> None:
    """Teardown step that must never raise: log and carry on with the next step."""
    try:
        fn(*args)
    except Exception as exc:
        log.warning("testhosts cleanup: %s failed: %s", what, exc)


def _netns_exists(ns: str) -> bool:
    return Path("/run/netns", ns).exists()


def _link_exists(ifname: str) -> bool:
    """True if ``ifname`` exists in the *root* namespace (where bridge and veths live)."""
    return Path("/sys/class/net", ifname).exists()


def _list_netns() -> list[str]:
    out = _ip("netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _list_links() -> list[str]:
    out = _ip("-j", "link", "show", check=False)
    try:
        links: list[dict[str, Any]] = json.loads(out or "[]")
    except json.JSONDecodeError:
        return []
    return [str(link["ifname"]) for link in links if "ifname" in link]


def _ns_pids(ns: str) -> list[int]:
    """PIDs whose network namespace is ``ns``. Zombies are not listed (their ns is gone)."""
    if not _netns_exists(ns):
        return []
    out = _ip("netns", "pids", ns, check=False)
    return sorted(int(tok) for tok in out.split() if tok.isdigit())


def _kill_netns_processes(ns: str, timeout: float = KILL_TIMEOUT_S) -> None:
    """SIGKILL everything in ``ns``, repeatedly: processes may fork while we are killing.

    Never touches our own process, even if (oddly) it were inside the namespace.
    """
    deadline = time.monotonic() + timeout
    me = os.getpid()
    while True:
        pids = [pid for pid in _ns_pids(ns) if pid != me]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            log.warning("testhosts: processes still alive in %s after SIGKILL: %s", ns, pids)
            return
        time.sleep(0.02)


def _process_start_time(pid: int) -> int | None:
    """Kernel start time of ``pid`` (field 22 of /proc/PID/stat), to survive PID reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


@contextlib.contextmanager
def _registry_lock() -> Iterator[None]:
    """Serialise subnet choice and stale-cleanup across concurrent runs on this machine."""
    REGISTRY_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    # Lock the directory itself: no lock file to leave behind or to race on deleting.
    fd = os.open(REGISTRY_DIR, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def _record_path(run_id: str) -> Path:
    return REGISTRY_DIR / f"{run_id}.json"


def _read_record(run_id: str) -> dict[str, Any] | None:
    try:
        data = json.loads(_record_path(run_id).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _record_alive(record: dict[str, Any] | None) -> bool:
    if record is None:
        return False
    pid, start = record.get("pid"), record.get("start_time")
    if not isinstance(pid, int) or not isinstance(start, int):
        return False
    return _process_start_time(pid) == start


def _run_id_of(name: str, prefix: str) -> str | None:
    """Extract the run id from one of our resource names, or None if it is not ours."""
    if name.startswith(prefix) and "-" in name[len(prefix) :]:  # lzt-<rid>-h1
        rid = name[len(prefix) :].split("-", 1)[0]
    elif name.startswith(BRIDGE_PREFIX):  # lzb-<rid>
        rid = name[len(BRIDGE_PREFIX) :]
    elif name.startswith(VETH_PREFIX) and "-" in name[len(VETH_PREFIX) :]:  # lzv-<rid>-1
        rid = name[len(VETH_PREFIX) :].split("-", 1)[0]
    else:
        return None
    return rid if _RUN_ID_RE.match(rid) else None


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the root namespace already has an address or a route in."""
    nets: list[ipaddress.IPv4Network] = []
    for line in _ip("-4", "-o", "addr", "show", check=False).splitlines():
        toks = line.split()
        if "inet" in toks:
            with contextlib.suppress(ValueError, IndexError):
                iface = ipaddress.IPv4Interface(toks[toks.index("inet") + 1])
                nets.append(iface.network)
    for line in _ip("-4", "route", "show", "table", "all", check=False).splitlines():
        toks = line.split()
        if not toks:
            continue
        dst = toks[1] if toks[0] in {"local", "broadcast", "unicast", "multicast"} else toks[0]
        if dst == "default":
            continue
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.IPv4Network(dst, strict=False))
    return nets


def _choose_third_octet(run_id: str) -> int:
    """Pick a free 10.231.k.0/24. Call with the registry lock held.

    The start point is derived from pid + run id so concurrent runs usually try different
    subnets first; the checks below make it correct when they do not.
    """
    used = _used_networks()
    claimed: set[int] = set()
    for record_file in REGISTRY_DIR.glob("*.json"):
        record = _read_record(record_file.stem)
        if _record_alive(record) and record is not None:
            octet = record.get("third_octet")
            if isinstance(octet, int):
                claimed.add(octet)
    seed = os.getpid() + int(hashlib.sha256(run_id.encode()).hexdigest()[:8], 16)
    for offset in range(254):
        k = (seed + offset) % 254 + 1  # 1..254
        candidate = ipaddress.IPv4Network(f"{SUBNET_PREFIX}.{k}.0/24")
        if k in claimed or any(candidate.overlaps(net) for net in used):
            continue
        return k
    raise RuntimeError(f"no free /24 left in {SUBNET_PREFIX}.0.0/16 for test hosts")


def _login_locked(user: str) -> bool:
    """True if ``user``'s shadow entry is locked ('!...'), which sshd rejects with UsePAM no."""
    try:
        for line in Path("/etc/shadow").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == user and len(fields) > 1:
                return fields[1].startswith("!")
    except OSError:
        pass
    return False


# --------------------------------------------------------------------------------------
# public API


def ensure_prerequisites() -> None:
    """Fail early with an actionable message instead of a cryptic FileNotFoundError later."""
    missing: list[str] = []
    try:
        _ip_binary()
    except RuntimeError:
        missing.append("`ip` (Debian package iproute2)")
    if not os.access(SSHD, os.X_OK):
        missing.append(f"`{SSHD}` (Debian package openssh-server)")
    try:
        _ssh_keygen_binary()
    except RuntimeError:
        missing.append("`ssh-keygen` (Debian package openssh-client)")
    for name, package in (("unshare", "util-linux"), ("nsenter", "util-linux")):
        try:
            _util_binary(name, package)
        except RuntimeError:
            missing.append(f"`{name}` (Debian package {package})")
    if missing:
        raise RuntimeError(
            "test hosts need "
            + ", ".join(missing)
            + ". Install with: sudo infra/install-test-prereqs.sh "
            "(or: apt-get install -y iproute2 openssh-server)"
        )


# Capability bits from <linux/capability.h>.
_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21


def _effective_caps() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def unavailable_reason() -> str | None:
    """Why test hosts cannot run on this machine (one line naming what is missing), or
    None when they can. Tests skip (or, under CI, fail) on it; benchmarks report it."""
    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append("needs root (network namespaces, veths, sshd)")
    else:
        caps = _effective_caps()
        for bit, name in ((_CAP_NET_ADMIN, "CAP_NET_ADMIN"), (_CAP_SYS_ADMIN, "CAP_SYS_ADMIN")):
            if not caps & (1 << bit):
                problems.append(f"root lacks {name} (unprivileged container?)")
    try:
        ensure_prerequisites()
    except RuntimeError as exc:
        problems.append(str(exc))
    return "; ".join(problems) if problems else None


def nameservers(resolv_conf: Path = Path("/etc/resolv.conf")) -> list[str]:
    """The IPv4 nameservers this machine uses that a test host could try to reach
    (loopback ones fail at once inside a namespace anyway: nothing listens there)."""
    found: list[str] = []
    try:
        lines = resolv_conf.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                address = ipaddress.ip_address(parts[1])
            except ValueError:
                continue
            if address.version == 4 and not address.is_loopback:
                found.append(str(address))
    return found


def cleanup_stale(prefix: str = NS_PREFIX) -> None:
    """Remove namespaces, bridges and veths left behind by runs whose process has died.

    Matching is by name (``<prefix><rid>-hN``, ``lzb-<rid>``, ``lzv-<rid>-N``), but a
    resource is only removed when the run that owns ``<rid>`` is no longer alive, so it
    is safe to call while other test runs are active. Never raises.
    """
    try:
        with _registry_lock():
            dead: dict[str, bool] = {}

            def is_dead(rid: str) -> bool:
                if rid not in dead:
                    dead[rid] = not _record_alive(_read_record(rid))
                return dead[rid]

            for ns in _list_netns():
                rid = _run_id_of(ns, prefix)
                if ns.startswith(prefix) and rid is not None and is_dead(rid):
                    log.info("testhosts: removing stale namespace %s", ns)
                    _quietly(f"kill {ns}", _kill_netns_processes, ns)
                    _quietly(f"del netns {ns}", _ip, "netns", "del", ns)
            links = _list_links()
            # veths first: deleting one end removes the pair; bridges afterwards.
            for link in sorted(links, key=lambda name: name.startswith(BRIDGE_PREFIX)):
                if not link.startswith((BRIDGE_PREFIX, VETH_PREFIX)):
                    continue
                rid = _run_id_of(link, prefix)
                if rid is not None and is_dead(rid) and _link_exists(link):
                    log.info("testhosts: removing stale link %s", link)
                    _quietly(f"del link {link}", _ip, "link", "del", link)
            for record_file in REGISTRY_DIR.glob("*.json"):
                rid = record_file.stem
                record = _read_record(rid)
                if _record_alive(record):
                    continue
                tmpdir = record.get("tmpdir") if record else None
                if isinstance(tmpdir, str) and Path(tmpdir).name == f"{NS_PREFIX}{rid}":
                    shutil.rmtree(tmpdir, ignore_errors=True)
                with contextlib.suppress(OSError):
                    record_file.unlink()
    except Exception as exc:
        log.warning("testhosts: cleanup_stale failed: %s", exc)
