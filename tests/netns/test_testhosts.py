"""The test-host fixture itself: real sshd per namespace, reachability, faults, cleanup.

These are the guarantees the multi-node tests build on, so they are checked with the
real OpenSSH client and paramiko, from the root namespace (the controller's viewpoint).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import paramiko
import pytest

from infra import testhost_network, testhosts
from infra.testhosts import TestHosts, cleanup_stale
from lazarus.domain.memory_tier import private_root
from tests.namespaces import in_mount_namespace, mounted_anywhere

from .conftest import HostsFactory


def ssh(hosts: TestHosts, name: str, command: str) -> subprocess.CompletedProcess[str]:
    """Run ``command`` on ``name`` through the system ssh client with strict host keys."""
    host = hosts.host(name)
    argv = [
        "ssh",
        "-F",
        "/dev/null",
        "-i",
        str(hosts.identity_file),
        "-o",
        f"UserKnownHostsFile={hosts.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-p",
        str(host.port),
        f"root@{host.address}",
        command,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def tcp_reachable(address: str, port: int = 22, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def processes_mentioning(marker: str) -> list[int]:
    """PIDs whose command line contains ``marker`` (our sshd's carry their config path)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def start_background_sleep(hosts: TestHosts, name: str) -> int:
    """Leave a process running on ``name`` after the SSH session ends, like a rank."""
    result = ssh(hosts, name, "sleep 1000 </dev/null >/dev/null 2>&1 & echo $!")
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip())


def settled_pids(hosts: TestHosts, name: str, deadline_s: float = 20.0) -> set[int]:
    """The host's processes once the last SSH session's own have exited: sshd's
    per-session children outlive the client by a moment, and one counted as "died"
    under partition on a loaded CI machine."""
    deadline = time.monotonic() + deadline_s
    previous = set(hosts.pids(name))
    while time.monotonic() < deadline:
        time.sleep(0.5)
        current = set(hosts.pids(name))
        if current == previous:
            return current
        previous = current
    return previous


PROBE = """
import socket, sys
timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=timeout)
print(s.recv(64).decode().strip())
"""


@pytest.mark.timeout(60)
def test_ssh_into_every_host_with_strict_host_keys(test_hosts: HostsFactory) -> None:
    hosts = test_hosts(3)
    assert [h.name for h in hosts.hosts] == ["h1", "h2", "h3"]
    assert len({h.address for h in hosts.hosts}) == 3
    assert len({h.netns for h in hosts.hosts}) == 3
    for host in hosts.hosts:
        assert host.netns.startswith(f"lzt-{hosts.run_id}-")
        assert host.interface == "eth0"
        result = ssh(hosts, host.name, "hostname -I; ip -4 -o addr show dev eth0")
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].split() == [host.address]
        assert f"inet {host.address}/24" in lines[1]
        # The shared filesystem is the point: the venv is visible at the same path.
        result = ssh(hosts, host.name, f"{sys.executable} -c 'print(42)'")
        assert result.stdout.strip() == "42", result.stderr


@pytest.mark.timeout(60)
def test_hosts_reach_each_other(test_hosts: HostsFactory) -> None:
    hosts = test_hosts(3)
    h2 = hosts.host("h2")
    result = hosts.exec("h1", sys.executable, "-c", PROBE, h2.address, str(h2.port))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("SSH-2.0-OpenSSH")
    # ...and the namespace really is separate: h1 has no h2 address locally.
    local = hosts.exec("h1", "ip", "-4", "-o", "addr")
    assert h2.address not in local.stdout
    assert hosts.host("h1").address in local.stdout


@pytest.mark.timeout(60)
def test_kill_host_then_restart(test_hosts: HostsFactory) -> None:
    hosts = test_hosts(3)
    h2 = hosts.host("h2")
    rank = start_background_sleep(hosts, "h2")
    assert rank in hosts.pids("h2")
    assert len(hosts.pids("h2")) >= 2  # sshd + the "rank"

    hosts.kill_host("h2")

    assert hosts.pids("h2") == []
    deadline = time.monotonic() + 5
    while alive(rank) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(rank)
    started = time.monotonic()
    assert not tcp_reachable(h2.address, timeout=1.0)
    assert time.monotonic() - started < 3
    from_h1 = hosts.exec("h1", sys.executable, "-c", PROBE, h2.address, "22", "1", timeout=30)
    assert from_h1.returncode != 0
    # The survivors are untouched.
    for name in ("h1", "h3"):
        assert ssh(hosts, name, "true").returncode == 0

    hosts.restart_sshd("h2")
    result = ssh(hosts, "h2", "hostname -I")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [h2.address]


@pytest.mark.timeout(60)
def test_partition_and_heal_keep_processes(test_hosts: HostsFactory) -> None:
    hosts = test_hosts(2)
    h2 = hosts.host("h2")
    rank = start_background_sleep(hosts, "h2")
    before = settled_pids(hosts, "h2")

    hosts.partition("h2")

    assert not tcp_reachable(h2.address, timeout=1.0)
    from_h1 = hosts.exec("h1", sys.executable, "-c", PROBE, h2.address, "22", "1", timeout=30)
    assert from_h1.returncode != 0
    assert before <= set(hosts.pids("h2"))  # nothing died
    assert alive(rank)

    hosts.heal("h2")

    result = ssh(hosts, "h2", f"kill -0 {rank} && hostname -I")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [h2.address]
    assert ssh(hosts, "h1", "true").returncode == 0


@pytest.mark.timeout(60)
def test_each_host_has_its_own_dev_shm_and_loses_it_when_killed(
    test_hosts: HostsFactory,
) -> None:
    """The memory tier's tmpfs is per host: what h1 writes to /dev/shm (its ranks
    too) is not seen by h2 nor by this machine, and killing h1 takes it away."""
    hosts = test_hosts(2)
    marker = f"lzt-test-{secrets.token_hex(4)}"
    # Where the memory tier keeps a snapshot on a node (lazarus.domain.memory_tier).
    folder = f"{private_root(os.getuid())}/{marker}"
    written = ssh(hosts, "h1", f"mkdir -p {folder} && echo snapshot > {folder}/step && echo ok")
    assert written.stdout.strip() == "ok", written.stderr
    rank = start_background_sleep(hosts, "h1")  # started by its own ssh login

    assert ssh(hosts, "h1", f"cat {folder}/step").stdout.strip() == "snapshot"
    assert Path(f"/proc/{rank}/root{folder}/step").read_text().strip() == "snapshot"
    assert hosts.exec("h1", "cat", f"{folder}/step").stdout.strip() == "snapshot"
    assert ssh(hosts, "h2", f"test -e {folder} || echo absent").stdout.strip() == "absent"
    assert not Path(folder).exists()
    namespace = hosts.mount_namespace("h1")
    assert namespace is not None and namespace != hosts.mount_namespace("h2")
    assert rank in in_mount_namespace(namespace)
    source = f"{hosts.host('h1').netns}{testhosts.SHM_SOURCE_SUFFIX}"
    assert mounted_anywhere(source)

    hosts.kill_host("h1")

    # Nothing holds the host's mount namespace any more, so its tmpfs is gone.
    assert hosts.mount_namespace("h1") is None
    assert in_mount_namespace(namespace) == []
    assert mounted_anywhere(source) == []
    with pytest.raises(RuntimeError, match="down"):
        hosts.exec("h1", "true")

    hosts.restart_sshd("h1")  # the machine boots: an empty /dev/shm

    result = ssh(hosts, "h1", f"test -e {folder} || echo absent; ls -A /dev/shm | wc -l")
    assert result.stdout.split() == ["absent", "0"], result.stderr
    assert not Path(folder).exists()


@pytest.mark.timeout(60)
def test_dev_shm_outlives_a_partition_and_an_sshd_restart(test_hosts: HostsFactory) -> None:
    hosts = test_hosts(1)
    marker = f"/dev/shm/lzt-test-{secrets.token_hex(4)}"
    assert ssh(hosts, "h1", f"echo kept > {marker}").returncode == 0
    namespace = hosts.mount_namespace("h1")

    hosts.partition("h1")
    hosts.restart_sshd("h1")  # the host never went down: only sshd is new

    assert hosts.mount_namespace("h1") == namespace
    assert ssh(hosts, "h1", f"cat {marker}").stdout.strip() == "kept"


@pytest.mark.timeout(60)
def test_stop_leaves_nothing_behind(test_hosts: HostsFactory) -> None:
    hosts = test_hosts(2)
    rank = start_background_sleep(hosts, "h1")
    marker = str(hosts.dir)
    assert processes_mentioning(marker), "our sshd should carry its config path"

    hosts.stop()

    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert hosts.run_id not in namespaces
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert hosts.run_id not in links
    assert processes_mentioning(marker) == []
    assert not alive(rank)
    for host in hosts.hosts:
        assert mounted_anywhere(f"{host.netns}{testhosts.SHM_SOURCE_SUFFIX}") == []
    assert not hosts.dir.exists()
    assert not (testhost_network.REGISTRY_DIR / f"{hosts.run_id}.json").exists()
    hosts.stop()  # idempotent


@pytest.mark.timeout(60)
def test_paramiko_accepts_right_key_and_rejects_wrong_one(
    test_hosts: HostsFactory, tmp_path: Path
) -> None:
    hosts = test_hosts(1)
    h1 = hosts.host("h1")

    client = paramiko.SSHClient()
    client.load_host_keys(str(hosts.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        h1.address,
        port=h1.port,
        username="root",
        key_filename=str(hosts.identity_file),
        look_for_keys=False,
        allow_agent=False,
        timeout=5,
    )
    try:
        _, stdout, _ = client.exec_command("hostname -I", timeout=10)
        assert stdout.read().decode().split() == [h1.address]
    finally:
        client.close()

    other_key = tmp_path / "other_host_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True
    )
    keytype, blob = Path(f"{other_key}.pub").read_text().split()[:2]
    wrong_known_hosts = tmp_path / "wrong_known_hosts"
    wrong_known_hosts.write_text(f"{h1.address} {keytype} {blob}\n")

    client = paramiko.SSHClient()
    client.load_host_keys(str(wrong_known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        with pytest.raises(paramiko.BadHostKeyException):
            client.connect(
                h1.address,
                port=h1.port,
                username="root",
                key_filename=str(hosts.identity_file),
                look_for_keys=False,
                allow_agent=False,
                timeout=5,
            )
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_failed_start_cleans_up(
    netns_required: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_start_sshd = TestHosts._start_sshd

    def flaky_start_sshd(self: TestHosts, host: testhosts.TestHost) -> None:
        if host.name == "h2":
            raise RuntimeError("injected failure")
        real_start_sshd(self, host)

    monkeypatch.setattr(TestHosts, "_start_sshd", flaky_start_sshd)
    hosts = TestHosts(3, tmp_path)
    with pytest.raises(RuntimeError, match="injected failure"):
        hosts.start()

    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert hosts.run_id not in namespaces
    assert hosts.run_id not in links
    assert processes_mentioning(str(hosts.dir)) == []
    assert not hosts.dir.exists()


@pytest.mark.timeout(60)
def test_cleanup_stale_removes_dead_runs_only(test_hosts: HostsFactory) -> None:
    live = test_hosts(1)
    rid = "zz" + secrets.token_hex(3)  # no registry record: its "owner" is dead
    ns, bridge, veth = f"lzt-{rid}-h1", f"lzb-{rid}", f"lzv-{rid}-1"
    leftover: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
        subprocess.run(
            ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns],
            check=True,
        )
        leftover = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "1000"])
        deadline = time.monotonic() + 5
        while not subprocess.run(["ip", "netns", "pids", ns], capture_output=True).stdout:
            assert time.monotonic() < deadline
            time.sleep(0.02)

        cleanup_stale()

        assert leftover.wait(timeout=5) == -9
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert rid not in namespaces.stdout
        assert rid not in links
        # The live run (registered, owner alive) is untouched.
        assert live.run_id in namespaces.stdout
        assert ssh(live, "h1", "true").returncode == 0
    finally:
        if leftover is not None and leftover.poll() is None:
            leftover.kill()
            leftover.wait()
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.mark.timeout(60)
def test_run_id_collision_does_not_touch_the_live_run(
    test_hosts: HostsFactory, tmp_path: Path
) -> None:
    live = test_hosts(1)
    clash = TestHosts(1, tmp_path / "clash", run_id=live.run_id)
    with pytest.raises(RuntimeError, match="already in use"):
        clash.start()
    clash.stop()
    assert ssh(live, "h1", "true").returncode == 0
    assert live.dir.exists()


REPO = Path(__file__).resolve().parents[2]
CHILD = """
import sys, time
from pathlib import Path
from infra.testhosts import TestHosts
hosts = TestHosts(2, Path(sys.argv[1]))
hosts.start()
print(hosts.run_id, flush=True)
if sys.argv[2] == "hang":
    time.sleep(1000)
# "exit": leave without stop(); the atexit hook must clean up.
"""


def spawn_child(workdir: Path, mode: str) -> tuple[subprocess.Popen[str], str]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(workdir), mode],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    run_id = child.stdout.readline().strip()
    assert run_id, "child failed to start its hosts"
    return child, run_id


def leftovers(run_id: str) -> str:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return "\n".join(line for line in (namespaces + links).splitlines() if run_id in line)


@pytest.mark.timeout(60)
def test_atexit_cleans_up_when_stop_is_forgotten(netns_required: None, tmp_path: Path) -> None:
    child, run_id = spawn_child(tmp_path, "exit")
    with child:
        assert child.wait(timeout=30) == 0
    assert leftovers(run_id) == ""
    assert processes_mentioning(f"lzt-{run_id}") == []


@pytest.mark.timeout(60)
def test_cleanup_stale_recovers_from_a_sigkilled_run(netns_required: None, tmp_path: Path) -> None:
    child, run_id = spawn_child(tmp_path, "hang")
    try:
        child.kill()  # no finally, no atexit: everything is left behind
        child.wait(timeout=10)
        assert leftovers(run_id) != ""
        sshds = processes_mentioning(f"lzt-{run_id}")
        assert len(sshds) == 2

        cleanup_stale()

        assert leftovers(run_id) == ""
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in sshds) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not any(alive(pid) for pid in sshds)
        assert not (tmp_path / f"lzt-{run_id}").exists()
        assert not (testhost_network.REGISTRY_DIR / f"{run_id}.json").exists()
    finally:
        with child:  # closes the stdout pipe
            if child.poll() is None:
                child.kill()
        cleanup_stale()
