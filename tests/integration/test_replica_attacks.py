"""Another user on a job's node against its memory replicas (issue 36, the audit's N2).

The victim is the rank side's real receiver and pusher (:mod:`lazarus.rank.replica`,
running as root here, with the private root under ``tmp_path``); the attacker is a
standard-library script run as ``nobody``, which knows everything public (the job's
name, its generation, the protocol) but not the run's secret. Each attack fails:

* **squatting the port first** moves the receiver to its next candidate port; the
  pusher, which checks each listener's proof of the key, sends the squatter nothing
  but its hello and the replica lands with the real buddy;
* **a forged push** (the old, unauthenticated header and bytes) is closed unanswered;
* **a push of step 0 without the key**, which used to wipe every replica, changes
  nothing;
* **connecting without the secret** gets a nonce and a proof it cannot use, then a
  closed connection.

The job loses no replica, the forged bytes are never written, and the receiver says
why in one line per attempt.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from lazarus.domain import checkpoint_layout, environment, memory_tier
from lazarus.rank import memory, replica, reset
from tests.memory_root import private_roots_under

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the attacker as nobody"),
    pytest.mark.skipif(
        shutil.which("python3", path="/usr/bin:/bin") is None, reason="no system python3"
    ),
]

JOB = "victim"
SECRET = "a1" * 32
KEY = memory_tier.generation_key(SECRET, 3)

ATTACKER = r"""
import json, socket, sys
mode, port = sys.argv[1], int(sys.argv[2])
if mode == "squat":
    server = socket.create_server(("127.0.0.1", port))
    print("listening", flush=True)
    server.settimeout(60)
    conn, _ = server.accept()
    conn.settimeout(5)
    got = b""
    try:
        while len(got) < 1 << 20:
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += chunk
            conn.sendall(b"00" * 32 + b" " + b"ab" * 32 + b"\n")  # a made-up proof
    except OSError:
        pass
    print(json.dumps({"received": got.decode("latin-1")}), flush=True)
    sys.exit(0)
conn = socket.create_connection(("127.0.0.1", port), timeout=10)
conn.settimeout(10)
if mode == "forge":
    header = {"v": 1, "job_id": "victim", "generation": 3, "slot": 0, "step": 99,
              "files": [["state.pt", 14], ["manifest.json", 2]]}
    conn.sendall(json.dumps(header).encode() + b"\n" + b"FORGED-WEIGHTS{}")
elif mode in ("wipe", "probe"):
    conn.sendall(b"lazarus-transfer/2 " + b"11" * 32 + b"\n")
    conn.recv(4096)  # the server's nonce and proof: useless without the key
    header = {"fields": {"job_id": "victim", "generation": 3, "slot": 0, "step": 0},
              "files": [["manifest.json", 2]]}
    conn.sendall(b"22" * 32 + b" " + json.dumps(header).encode() + b" 33\n{}")
answer = b""
try:
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        answer += chunk
except OSError:
    pass
print(json.dumps({"answer": answer.decode("latin-1")}), flush=True)
"""


def as_nobody() -> None:
    nobody = pwd.getpwnam("nobody")
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)


SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")
"""An interpreter any user may run (the test's own may sit in root's home)."""


def attacker(mode: str, port: int) -> subprocess.Popen[str]:
    assert SYSTEM_PYTHON is not None
    return subprocess.Popen(
        [SYSTEM_PYTHON, "-S", "-c", ATTACKER, mode, str(port)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=as_nobody,
        cwd="/",
    )


def answer_of(process: subprocess.Popen[str]) -> dict[str, str]:
    out, _ = process.communicate(timeout=60)
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture
def shm(tmp_path: Path) -> Iterator[Path]:
    with private_roots_under(tmp_path) as root:
        yield root


def snapshot(step: int, payload: bytes) -> Path:
    env = {
        environment.JOB_ID: JOB,
        environment.GENERATION: "3",
        environment.WORLD_SIZE: "2",
        environment.RANK: "0",
        environment.LOCAL_RANK: "0",
        environment.MEMORY_KEEP: "5",
        environment.MEMORY_CHECKPOINT_DIR: f"{memory_tier.MEMORY_ROOT}/{JOB}/a",
    }
    with mock.patch.dict(os.environ, env):
        reset._reset_state()
        (memory.write_dir(step) / "state.pt").write_bytes(payload)
        final = memory.commit(step)
    reset._reset_state()
    return final


def held(receiver: replica.Receiver) -> dict[int, bytes]:
    slot = Path(memory_tier.replica_dir(str(receiver.config.root), 0))
    return {s: (p / "state.pt").read_bytes() for s, p in checkpoint_layout.committed_steps(slot)}


def receiver_on(first_port: int, key: bytes = KEY) -> replica.Receiver:
    config = replica._Config(
        listen=f"127.0.0.1:{first_port}",
        allowed_from="127.0.0.1",
        root=Path(memory_tier.on_node(f"{memory_tier.MEMORY_ROOT}/{JOB}/b", os.getuid())),
        job_id=JOB,
        generation=3,
        keep=5,
        key=key,
    )
    memory.secure(config.root)
    return replica.Receiver(config)


def test_another_user_can_neither_read_forge_nor_wipe_the_replicas(shm: Path) -> None:
    first = memory_tier.keyed_port(KEY, 1)
    squatter = attacker("squat", first)  # as if it had guessed the port
    assert squatter.stdout is not None and squatter.stdout.readline().strip() == "listening"
    victim = receiver_on(first)
    try:
        assert victim.port != first  # moved to its next candidate
        to = f"127.0.0.1:{first}"
        for step in (10, 11):
            final = snapshot(step, f"VICTIM-WEIGHTS-step{step}".encode())
            replica.push(final, to, key=KEY, slot=0, job_id=JOB, generation=3)
        stolen = answer_of(squatter)["received"]
        assert "VICTIM" not in stolen and stolen.startswith("lazarus-transfer/2 ")
        assert len(stolen) < 200  # the hello only: a nonce, nothing of the state
        assert held(victim) == {10: b"VICTIM-WEIGHTS-step10", 11: b"VICTIM-WEIGHTS-step11"}

        for mode in ("forge", "wipe", "probe"):
            answer = answer_of(attacker(mode, victim.port))["answer"]
            assert "generation" not in answer and "error" not in answer, (mode, answer)
        assert held(victim) == {10: b"VICTIM-WEIGHTS-step10", 11: b"VICTIM-WEIGHTS-step11"}
        assert len(victim.refused) == 3, victim.refused  # one line per attempt, each saying why
        assert "does not speak the protocol" in victim.refused[0]
        assert all("nothing said" in line for line in victim.refused)
        leftovers = Path(memory_tier.replica_dir(str(victim.config.root), 0)).iterdir()
        assert sorted(p.name for p in leftovers) == ["step-00000010", "step-00000011"]
    finally:
        victim.close()
        if squatter.poll() is None:
            squatter.kill()
            squatter.wait()


def test_a_port_held_by_another_user_is_never_sent_the_state(shm: Path) -> None:
    """With every candidate but the last squatted, the pusher tries each, proves the
    key with none of them, and reaches the real receiver on the last."""
    key = memory_tier.generation_key("b2" * 32, 3)  # ports of their own: none in TIME_WAIT
    candidates = memory_tier.candidate_ports(key, memory_tier.keyed_port(key, 1))
    squatters = [attacker("squat", port) for port in candidates[:-1]]
    try:
        for squatter in squatters:
            assert squatter.stdout is not None and squatter.stdout.readline().strip()
        victim = receiver_on(candidates[0], key)
        assert victim.port == candidates[-1]
        final = snapshot(12, b"VICTIM-WEIGHTS-step12")
        to = f"127.0.0.1:{candidates[0]}"
        replica.push(final, to, key=key, slot=0, job_id=JOB, generation=3)
        for squatter in squatters:
            assert "VICTIM" not in answer_of(squatter)["received"]
        assert held(victim) == {12: b"VICTIM-WEIGHTS-step12"}
        victim.close()
    finally:
        for squatter in squatters:
            if squatter.poll() is None:
                squatter.kill()
                squatter.wait()
