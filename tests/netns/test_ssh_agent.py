"""SSHAgent against real OpenSSH servers (one network namespace per host).

What is checked is what only a real server can show: ranks survive the SSH session
that started them, host keys are verified the way OpenSSH would (unknown refused,
changed refused loudly, trust-on-first-use saved), identity files fail with a message
naming them, and a dead or unplugged host makes ``poll`` say so within its timeouts
instead of hanging.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from activities.nodes.agent import NodeRefused, NodeUnreachable
from activities.nodes.node_records import RankLaunch
from activities.nodes.ssh import agent as ssh_agent_module
from activities.nodes.ssh.agent import SSHAgent
from activities.nodes.ssh.pool import ConnectionPool
from infra.testhosts import TestHosts
from lazarus.domain.spec import NodeSpec, SSHSpec

from .conftest import HostsFactory

CONNECT_TIMEOUT_S = 2.0


def node_for(hosts: TestHosts, name: str, identity: Path | None = None) -> NodeSpec:
    host = hosts.host(name)
    return NodeSpec(
        name=name,
        launcher="ssh",
        host=host.address,
        port=host.port,
        user=hosts.user,
        identity_file=str(identity or hosts.identity_file),
    )


def ssh_spec(known_hosts: Path, accept_new: bool = False) -> SSHSpec:
    return SSHSpec(
        known_hosts=str(known_hosts),
        accept_new_host_keys=accept_new,
        connect_timeout_s=CONNECT_TIMEOUT_S,
        use_agent=False,
    )


def sleeper(rank: int, workdir: Path, seconds: int = 60) -> RankLaunch:
    return RankLaunch(
        rank=rank,
        command=["sh", "-c", f"echo rank {rank} on $(hostname -I); exec sleep {seconds}"],
        env={"PATH": os.environ["PATH"]},
        workdir=str(workdir),
    )


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def other_host_key(tmp_path: Path) -> tuple[str, str]:
    """A fresh ed25519 key that is not the host's: what a man-in-the-middle offers."""
    key_file = tmp_path / "impostor"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_file)],
        check=True,
        capture_output=True,
    )
    keytype, key = (tmp_path / "impostor.pub").read_text().split()[:2]
    return keytype, key


@pytest.fixture
def hosts(test_hosts: HostsFactory) -> TestHosts:
    return test_hosts(2)


@pytest.fixture
def run_root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "runs" / "job"
    root.mkdir(parents=True)
    yield root
    for pid_file in root.glob("gen-*/rank-*.pid"):
        pgid = int(json.loads(pid_file.read_text())["pgid"])
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


@pytest.mark.timeout(120)
def test_start_poll_adopt_stop_over_ssh(hosts: TestHosts, run_root: Path, tmp_path: Path) -> None:
    gen = str(run_root / "gen-00001")
    heartbeat = run_root / "gen-00001" / "rank-1.heartbeat.json"
    writer = (
        "import json, os, time; p = os.environ['HB']; "
        "open(p + '.tmp', 'w').write(json.dumps({'step': 11, 'time': time.time()})); "
        "os.replace(p + '.tmp', p); time.sleep(60)"
    )
    ranks = [
        sleeper(0, tmp_path),
        RankLaunch(
            rank=1,
            command=[sys.executable, "-c", writer],
            env={"PATH": os.environ["PATH"], "HB": str(heartbeat)},
            workdir=str(tmp_path),
        ),
    ]
    agent = SSHAgent(node_for(hosts, "h1"), ssh_spec(hosts.known_hosts))
    try:
        started = agent.start_ranks(gen, ranks)
    finally:
        agent.close()  # the SSH session that started them is gone from here on
    assert [r.adopted for r in started] == [False, False]
    in_h1 = set(hosts.pids("h1"))
    assert {r.pid for r in started} <= in_h1, "ranks run on the remote host"
    log = Path(started[0].log_file)
    deadline = time.monotonic() + 15  # the rank writes its line when it gets CPU
    while hosts.host("h1").address not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert hosts.host("h1").address in log.read_text()

    agent = SSHAgent(node_for(hosts, "h1"), ssh_spec(hosts.known_hosts))
    try:
        deadline = time.monotonic() + 15
        while True:
            status = agent.poll(gen, [0, 1])
            if status.ranks[1].heartbeat or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert status.reachable, status.error
        assert all(r.alive for r in status.ranks)
        assert status.ranks[1].heartbeat and status.ranks[1].heartbeat["step"] == 11

        timings = []
        for _ in range(20):
            timings.append(agent.poll(gen, [0, 1]).round_trip_s)
        timings.sort()
        print(f"ssh poll of 2 ranks (reused connection): median {timings[10] * 1000:.1f} ms")
        assert timings[10] < 1.0

        again = agent.start_ranks(gen, ranks)
        assert [r.adopted for r in again] == [True, True]
        assert [r.pid for r in again] == [r.pid for r in started]

        result = agent.stop(str(run_root), None, 5.0)
        assert result.reachable and result.generations == [1]
        assert result.signalled_groups == 2 and result.last_step == 11
        assert not any(alive(r.pid) for r in started)
        status = agent.poll(gen, [0, 1])
        assert all(r.exit and r.exit["signal"] == "SIGTERM" for r in status.ranks)
    finally:
        agent.close()


@pytest.mark.timeout(60)
def test_spec_values_cannot_inject_shell_over_ssh(
    hosts: TestHosts, run_root: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    nasty = [f"$(touch {marker}-a)", f"`touch {marker}-b`", f"; touch {marker}-c", "'\"\n"]
    gen = str(run_root / "gen-00001")
    agent = SSHAgent(node_for(hosts, "h1"), ssh_spec(hosts.known_hosts))
    try:
        agent.start_ranks(
            gen,
            [
                RankLaunch(
                    rank=0,
                    command=["printf", "%s|", *nasty],
                    env={"X": nasty[0]},
                    workdir=str(tmp_path),
                )
            ],
        )
        deadline = time.monotonic() + 10
        while not agent.poll(gen, [0]).ranks[0].exit and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agent.log_tail(gen, 0) == "|".join(nasty) + "|"
        agent.write_file(str(tmp_path / "ctl.json"), nasty[1])
        assert (tmp_path / "ctl.json").read_text() == nasty[1]
    finally:
        agent.close()
    assert list(tmp_path.glob("pwned*")) == []


@pytest.mark.timeout(60)
def test_changed_host_key_is_refused_and_nothing_starts(
    hosts: TestHosts, run_root: Path, tmp_path: Path
) -> None:
    address = hosts.host("h1").address
    keytype, key = other_host_key(tmp_path)
    known = tmp_path / "known_hosts_mitm"
    known.write_text(f"{address} {keytype} {key}\n")
    gen = run_root / "gen-00001"
    for accept_new in (False, True):  # TOFU never replaces a known key
        agent = SSHAgent(node_for(hosts, "h1"), ssh_spec(known, accept_new=accept_new))
        with pytest.raises(NodeRefused) as refused:
            agent.start_ranks(str(gen), [sleeper(0, tmp_path)])
        message = str(refused.value)
        assert f"node h1 ({address}:22)" in message
        assert "CHANGED" in message and "man-in-the-middle" in message
        assert str(known) in message
        status = agent.poll(str(gen), [0])
        assert not status.reachable and status.error and "CHANGED" in status.error
        agent.close()
    assert not gen.exists(), "nothing may run on a host we cannot trust"
    assert known.read_text() == f"{address} {keytype} {key}\n"


@pytest.mark.timeout(60)
def test_unknown_host_key_refused_unless_accept_new(
    hosts: TestHosts, run_root: Path, tmp_path: Path
) -> None:
    address = hosts.host("h2").address
    known = tmp_path / "fresh" / "known_hosts"  # does not exist yet
    gen = str(run_root / "gen-00001")
    strict = SSHAgent(node_for(hosts, "h2"), ssh_spec(known))
    with pytest.raises(NodeRefused) as refused:
        strict.start_ranks(gen, [sleeper(0, tmp_path)])
    message = str(refused.value)
    assert f"node h2 ({address}:22): unknown host key" in message
    assert f"ssh-keyscan -p 22 {address} >> {known}" in message
    assert "accept_new_host_keys" in message
    assert not Path(gen).exists() and not known.exists()
    strict.close()

    tofu = SSHAgent(node_for(hosts, "h2"), ssh_spec(known, accept_new=True))
    try:
        assert tofu.poll(gen, [0]).reachable
    finally:
        tofu.close()
    saved = known.read_text()
    real = (hosts.known_hosts).read_text()
    assert saved.startswith(f"{address} ssh-ed25519 ")
    assert saved.split()[2] in real, "the saved key is the host's real key"
    assert known.stat().st_mode & 0o777 == 0o600

    strict = SSHAgent(node_for(hosts, "h2"), ssh_spec(known))
    try:
        assert strict.poll(gen, [0]).reachable
    finally:
        strict.close()
    assert known.read_text() == saved, "a known host is not appended twice"


@pytest.mark.timeout(60)
def test_bad_identity_files_are_refused_by_name(hosts: TestHosts, tmp_path: Path) -> None:
    missing = tmp_path / "no_such_key"
    garbage = tmp_path / "garbage_key"
    garbage.write_text("this is not a key\n")
    public = Path(f"{hosts.identity_file}.pub")
    locked = tmp_path / "locked_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret-pass", "-f", str(locked)],
        check=True,
        capture_output=True,
    )
    stranger = tmp_path / "stranger_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)],
        check=True,
        capture_output=True,
    )
    cases = [
        (missing, "does not exist"),
        (garbage, "not a private key"),
        (public, "not a private key"),
        (locked, "passphrase"),
        (stranger, "authentication refused"),
    ]
    for key_file, expected in cases:
        agent = SSHAgent(node_for(hosts, "h1", identity=key_file), ssh_spec(hosts.known_hosts))
        with pytest.raises(NodeRefused) as refused:
            agent.log_tail(str(tmp_path), 0)
        message = str(refused.value)
        assert str(key_file) in message and expected in message, message
        assert "node h1" in message
        assert "PRIVATE KEY" not in message
        status = agent.poll(str(tmp_path), [0])
        assert not status.reachable and status.error and str(key_file) in status.error
        agent.close()


@pytest.mark.timeout(90)
def test_dead_and_partitioned_hosts_are_unreachable_quickly(
    hosts: TestHosts, run_root: Path, tmp_path: Path
) -> None:
    gen = str(run_root / "gen-00001")
    # A connection that was healthy, then the cable is pulled: the command times out.
    h1 = SSHAgent(node_for(hosts, "h1"), ssh_spec(hosts.known_hosts))
    h1.status_timeout_s = 2.0
    # A host that dies before we ever connect: connect fails within connect_timeout_s.
    h2 = SSHAgent(node_for(hosts, "h2"), ssh_spec(hosts.known_hosts))
    # An address nobody answers on.
    ghost_spec = node_for(hosts, "h2").model_copy(
        update={"name": "ghost", "host": hosts.host("h2").address.rsplit(".", 1)[0] + ".250"}
    )
    ghost = SSHAgent(ghost_spec, ssh_spec(hosts.known_hosts))
    try:
        assert h1.poll(gen, [0]).reachable
        hosts.partition("h1")
        hosts.kill_host("h2")

        for agent, budget in ((h1, 2.0 + 1.0), (h2, CONNECT_TIMEOUT_S), (ghost, CONNECT_TIMEOUT_S)):
            before = time.monotonic()
            status = agent.poll(gen, [0])
            took = time.monotonic() - before
            assert not status.reachable, agent.node.name
            assert status.error and f"node {agent.node.name}" in status.error
            assert "\n" not in status.error
            assert took < budget + 1.5, (agent.node.name, took, status.error)
            stopped = agent.stop(str(run_root), None, 0.0)
            assert not stopped.reachable and stopped.error
        with pytest.raises(NodeUnreachable):
            h2.start_ranks(gen, [sleeper(0, tmp_path)])

        hosts.heal("h1")
        deadline = time.monotonic() + 20
        while not (status := h1.poll(gen, [0])).reachable and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status.reachable, f"no lazy reconnect after heal: {status.error}"
    finally:
        for agent in (h1, h2, ghost):
            agent.close()


@pytest.mark.timeout(60)
def test_close_does_not_wait_for_a_connect_to_a_dead_host(hosts: TestHosts, run_root: Path) -> None:
    """A supervision that has just declared a host lost closes its agents while a
    poll of that host is still connecting: the close must not wait out the connect
    timeout (it cost every node loss about a second), and the connect that finishes
    later must not leave its connection open."""
    hosts.kill_host("h2")
    agent = SSHAgent(node_for(hosts, "h2"), ssh_spec(hosts.known_hosts))
    polled: list[bool] = []
    poll = threading.Thread(
        target=lambda: polled.append(agent.poll(str(run_root / "gen-00001"), [0]).reachable)
    )
    poll.start()
    time.sleep(0.3)  # the poll is inside its connect now (the host answers nothing)
    agent.close()
    assert poll.is_alive(), "close waited for the connect in progress"
    poll.join(CONNECT_TIMEOUT_S + 30)
    assert polled == [False]
    assert agent._client is None


@pytest.mark.timeout(90)
def test_idle_connections_are_reused_by_the_next_agent_and_never_when_unanswered(
    hosts: TestHosts, run_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """activities/nodes/ssh/pool.py: an agent that closes after an answered command
    parks its login, and the next agent for the same node and settings runs on it (no
    second handshake); other settings get a login of their own; a connection whose
    last command timed out (a partition) is closed, not parked; an idle one is closed
    after the pool's idle time."""
    pool = ConnectionPool(idle_s=120.0)
    monkeypatch.setattr(ssh_agent_module, "POOL", pool)
    gen = str(run_root / "gen-00001")
    first = SSHAgent(node_for(hosts, "h1"), ssh_spec(hosts.known_hosts))
    assert first.poll(gen, [0]).reachable
    assert first._client is not None
    login = first._client.get_transport()
    first.close()
    assert len(pool) == 1

    second = SSHAgent(node_for(hosts, "h1"), ssh_spec(hosts.known_hosts))
    assert second.poll(gen, [0]).reachable
    assert second._client is not None and second._client.get_transport() is login
    assert len(pool) == 0
    other = SSHAgent(node_for(hosts, "h1"), ssh_spec(hosts.known_hosts, accept_new=True))
    assert other.poll(gen, [0]).reachable
    assert other._client is not None and other._client.get_transport() is not login
    other.close()
    second.status_timeout_s = 1.0
    hosts.partition("h1")
    try:
        assert not second.poll(gen, [0]).reachable
        second.close()
        assert len(pool) == 1, "the partitioned login was parked"  # only `other`'s
    finally:
        hosts.heal("h1")
    pool.close_all()
    pool.idle_s = 0.5
    last = SSHAgent(node_for(hosts, "h2"), ssh_spec(hosts.known_hosts))
    assert last.poll(gen, [0]).reachable
    assert last._client is not None
    idle = last._client.get_transport()
    last.close()
    deadline = time.monotonic() + 15
    while len(pool) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(pool) == 0, "an idle connection outlived the idle time"
    assert idle is not None and not idle.is_active()


@pytest.mark.timeout(60)
def test_ssh_agent_keys_are_used_and_no_agent_is_refused(
    hosts: TestHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = node_for(hosts, "h1").model_copy(update={"identity_file": None})
    spec = ssh_spec(hosts.known_hosts).model_copy(update={"use_agent": True})
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    lonely = SSHAgent(node, spec)
    with pytest.raises(NodeRefused, match="no key to offer"):
        lonely.log_tail(str(tmp_path), 0)
    lonely.close()

    sock = tmp_path / "agent.sock"
    agent_proc = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(sock)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(
            ["ssh-add", "-q", str(hosts.identity_file)], env=env, check=True, capture_output=True
        )
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        with_agent = SSHAgent(node, spec)
        try:
            assert with_agent.poll(str(tmp_path), [0]).reachable
        finally:
            with_agent.close()
    finally:
        agent_proc.kill()
        agent_proc.wait()


@pytest.mark.timeout(120)
def test_rank_environment_never_appears_in_any_cmdline_over_ssh(
    hosts: TestHosts, run_root: Path, tmp_path: Path
) -> None:
    """Over SSH the env once went to a long-lived ``sh`` as arguments, readable by every
    user in /proc/PID/cmdline. Now it travels on stdin; the env file is read on the node."""
    secret = f"sekrit-{os.urandom(8).hex()}"
    from_file = f"filesecret-{os.urandom(8).hex()}"
    secrets_file = tmp_path / "job.env"
    secrets_file.write_text(f"HF_TOKEN={from_file}\n")
    secrets_file.chmod(0o600)
    out = tmp_path / "env.json"
    dump = (
        "import json, os, sys, time\n"
        "with open(sys.argv[1] + '.tmp', 'w') as f: json.dump(dict(os.environ), f)\n"
        "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
        "time.sleep(60)\n"
    )
    gen = str(run_root / "gen-00001")
    agent = SSHAgent(node_for(hosts, "h1"), ssh_spec(hosts.known_hosts))
    try:
        agent.start_ranks(
            gen,
            [
                RankLaunch(
                    rank=0,
                    command=[sys.executable, "-c", dump, str(out)],
                    env={"PATH": os.environ["PATH"], "WANDB_API_KEY": secret},
                    workdir=str(tmp_path),
                    env_file=str(secrets_file),
                )
            ],
        )
        deadline = time.monotonic() + 20
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        env = json.loads(out.read_text())
        assert env["WANDB_API_KEY"] == secret and env["HF_TOKEN"] == from_file
        leaks = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    cmdline = (proc / "cmdline").read_bytes()
                    if secret.encode() in cmdline or from_file.encode() in cmdline:
                        leaks.append(int(proc.name))
        assert not leaks, f"a secret is in the argv of {leaks}"
        agent.stop(str(run_root), None, 1.0)
    finally:
        agent.close()


def _ssh_job(hosts: TestHosts, run_root: Path, tmp_path: Path, generation: int = 1) -> Any:
    """The spec and status a job on h1 (one rank) would show ``lazarus logs``."""
    from lazarus.domain.spec import JobSpec
    from workflows.state import JobStatus, NodePool

    spec = JobSpec.model_validate(
        {
            "name": "job",
            "command": ["python", "train.py"],
            "checkpoint_dir": str(tmp_path / "ckpt"),
            "nodes": [node_for(hosts, "h1").model_dump()],
            "ssh": ssh_spec(hosts.known_hosts).model_dump(),
        }
    )
    status = JobStatus(
        job_id="job",
        phase="RUNNING",
        generation=generation,
        step=None,
        world_size=1,
        ranks=[],
        restarts=0,
        max_restarts=1,
        incidents=[],
        ettr=None,
        elapsed_s=1.0,
        run_dir=str(run_root),
        nodes=NodePool(active=["h1"]),
    )
    return spec, status


def _start_on_h1(hosts: TestHosts, gen: Path, script: str, workdir: Path) -> None:
    agent = SSHAgent(node_for(hosts, "h1"), ssh_spec(hosts.known_hosts))
    try:
        agent.start_ranks(
            str(gen),
            [
                RankLaunch(
                    rank=0,
                    command=["sh", "-c", script],
                    env={"PATH": os.environ["PATH"]},
                    workdir=str(workdir),
                )
            ],
        )
    finally:
        agent.close()


def _wait_exit(hosts: TestHosts, gen: Path, timeout_s: float = 20) -> None:
    agent = SSHAgent(node_for(hosts, "h1"), ssh_spec(hosts.known_hosts))
    try:
        deadline = time.monotonic() + timeout_s
        while not agent.poll(str(gen), [0]).ranks[0].exit and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        agent.close()


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_lazarus_logs_reads_a_big_ssh_log_whole_through_its_agent(
    hosts: TestHosts, run_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``lazarus logs`` on an ssh node (issue 39): the CLI's reader goes through the
    node's own agent (its log_read over SSH, host key checked) a chunk at a time, so a
    log of 3 MB comes whole, not its last 64 KiB; ``--tail`` reads only the end, and
    ``--json`` gives one object per line with the node and the line's own time. The
    agent is the worker's (``AgentLogs``, issue 40), here in this process."""
    from activities.node_logs import AgentLogs
    from lazarus.app import cli_logs

    gen = run_root / "gen-00001"
    lines = 40_000  # 40,000 lines of 80 bytes: 3.2 MB, three read chunks and more
    script = (
        f"i=0; while [ $i -lt {lines} ]; do printf 'line %06d %s\\n' $i "
        f"{'x' * 67}; i=$((i+1)); done; echo '2026-12-07 10:00:00,250 INFO the end'"
    )
    _start_on_h1(hosts, gen, script, tmp_path)
    _wait_exit(hosts, gen, 60)
    spec, status = _ssh_job(hosts, run_root, tmp_path)
    [log] = cli_logs.rank_logs(status, spec, None)
    assert not log.local and log.path == gen / "rank-0.log"
    assert cli_logs.show([log], spec, None, False, remote=AgentLogs()) == []
    out = capsys.readouterr().out.splitlines()
    assert len(out) == lines + 1, len(out)
    assert out[0].startswith("line 000000 ") and out[lines - 1].startswith(f"line {lines - 1:06d}")
    assert len("\n".join(out[:lines]).encode()) > 3 * cli_logs.READ_CHUNK_BYTES
    assert cli_logs.show([log], spec, 2, False, remote=AgentLogs()) == []
    assert capsys.readouterr().out.splitlines() == [
        out[-2],
        "2026-12-07 10:00:00,250 INFO the end",
    ]
    assert cli_logs.show([log], spec, 1, False, as_json=True, remote=AgentLogs()) == []
    [document] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert document["generation"] == 1 and document["rank"] == 0 and document["node"] == "h1"
    assert document["line"] == "2026-12-07 10:00:00,250 INFO the end"
    assert document["time"].startswith("2026-12-07T") and document["time"].endswith("Z")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_lazarus_logs_follows_an_ssh_rank_to_its_end(
    hosts: TestHosts, run_root: Path, tmp_path: Path
) -> None:
    """``--follow`` on an ssh node: lines appear as the rank writes them (by offset,
    none lost or repeated, a line split across reads printed once whole), and the
    follower ends when the rank does."""
    from activities.node_logs import AgentLogs
    from lazarus.app import cli_logs

    gen = run_root / "gen-00001"
    script = "for i in 1 2 3 4 5 6; do printf 'tick %s' $i; sleep 0.2; echo; sleep 0.3; done"
    _start_on_h1(hosts, gen, script, tmp_path)
    spec, status = _ssh_job(hosts, run_root, tmp_path)
    [log] = cli_logs.rank_logs(status, spec, None)
    got: list[tuple[float, bytes]] = []

    def emit(_: cli_logs.RankLog, lines: list[tuple[bytes, float | None]]) -> None:
        got.extend((time.monotonic(), line) for line, _ in lines)

    reader = cli_logs.Reader(spec, AgentLogs())
    began = time.monotonic()
    try:
        cli_logs.follow([log], reader, None, None, emit, poll_s=0.1)
    finally:
        reader.close()
    assert [line for _, line in got] == [f"tick {i}".encode() for i in range(1, 7)]
    assert got[0][0] - began < got[-1][0] - began - 1.5, "lines came as written, not at the end"
