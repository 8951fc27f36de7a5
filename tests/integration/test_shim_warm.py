"""Warm starts through the node shim (``warm``, ``stop-zygote``), run locally through
LocalShimAgent: the ssh agent's exact code path without a network. The netns suite
(tests/netns/test_ssh_warm.py) runs the same over real sshd."""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.nodes import zygote_client
from activities.nodes.node_records import RankLaunch, StartedRank, WarmStart
from activities.nodes.procfs import is_alive
from activities.nodes.shim_agent import LocalShimAgent
from activities.nodes.shim_calls import json_lines, warm_call
from activities.nodes.zygote_socket import zygote_dir
from lazarus.domain.spec import NodeSpec
from tests.integration.test_shim import DASH, _all_cmdlines, kill_leftovers, wait_for

REPO = Path(__file__).resolve().parents[2]
DUMP = (
    "import json, os, sys, time\n"
    "with open(sys.argv[1] + '.tmp', 'w') as f: json.dump(dict(os.environ), f)\n"
    "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "time.sleep(30)\n"
)


@pytest.fixture
def run_root(tmp_path: Path) -> Iterator[Path]:
    """A run directory; teardown kills every rank and stops the zygote (and checks
    that ``end_run`` did)."""
    root = tmp_path / "runs" / "job" / "run-a"
    root.mkdir(parents=True)
    agent = LocalShimAgent(NodeSpec(name="n1"), shell=DASH)
    try:
        yield root
    finally:
        agent.stop(str(root), None, 0.0)
        kill_leftovers(root)
        agent.end_run(str(root), [])
        info = zygote_client.read_zygote(zygote_dir(root, "n1"))
        assert info is None, "end_run left the zygote's pid file"


def read_env(out: Path) -> dict[str, str] | None:
    return json.loads(out.read_text()) if out.exists() else None


def dump_launch(rank: int, workdir: Path, out: Path, python: str, **env: str) -> RankLaunch:
    return RankLaunch(
        rank=rank,
        command=[python, "-c", DUMP, str(out)],
        env={"PATH": os.environ["PATH"], "RANK": str(rank), **env},
        workdir=str(workdir),
    )


def warm(run_root: Path) -> WarmStart:
    return WarmStart(run_root=str(run_root), preload=["json"], standby=1)


@pytest.mark.timeout(90)
def test_ranks_fork_through_the_shim_with_env_file_and_no_secret_in_any_cmdline(
    run_root: Path, tmp_path: Path
) -> None:
    secret = f"sekrit-{uuid.uuid4().hex}"
    from_file = f"filesecret-{uuid.uuid4().hex}"
    env_file = tmp_path / "secrets.env"
    env_file.write_text(f"HF_TOKEN={from_file}\nSHARED=from file\n")
    env_file.chmod(0o600)
    agent = LocalShimAgent(NodeSpec(name="n1"), shell=DASH)
    seen: list[int] = []
    launching = True

    def sample() -> None:
        needles = (secret.encode(), from_file.encode())
        while launching:
            seen.extend(p for p, line in _all_cmdlines() if any(n in line for n in needles))
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    outs = [tmp_path / f"env-{rank}.json" for rank in (0, 1)]
    launches = [
        dump_launch(
            rank, tmp_path, outs[rank], sys.executable, API_KEY=secret, SHARED="env"
        ).model_copy(update={"env_file": str(env_file)})
        for rank in (0, 1)
    ]
    gen = run_root / "gen-00001"
    try:
        started = agent.start_ranks_warm(str(gen), launches, warm(run_root))
        envs = [wait_for(functools.partial(read_env, out)) for out in outs]
    finally:
        launching = False
        sampler.join()
    assert [(r.warm, r.cold_reason) for r in started] == [(True, None), (True, None)]
    for rank, env in zip(started, envs, strict=True):
        assert env["RANK"] == str(rank.rank) and env["API_KEY"] == secret
        assert env["HF_TOKEN"] == from_file and env["SHARED"] == "env", "env wins over the file"
        assert rank.log_file == str(gen / f"rank-{rank.rank}.log")
        record = json.loads((gen / f"rank-{rank.rank}.pid").read_text())
        assert (record["pid"], record["pgid"]) == (rank.pid, rank.pgid)
    assert not seen, f"a secret in the argv of {sorted(set(seen))}"
    info = zygote_client.read_zygote(zygote_dir(run_root, "n1"))
    assert info is not None and info.pid != os.getpid()

    # A retried launch adopts the forked ranks; it starts nothing.
    again = agent.start_ranks_warm(str(gen), launches, warm(run_root))
    assert [(r.pid, r.adopted, r.warm) for r in again] == [(r.pid, True, True) for r in started]

    agent.stop(str(run_root), None, 0.0)
    agent.end_run(str(run_root), [])
    assert not is_alive(info.pid, info.start_ticks), "end_run stops the node's zygote"


@pytest.mark.timeout(90)
def test_an_interpreter_without_lazarus_starts_cold_with_the_reason(
    run_root: Path, tmp_path: Path
) -> None:
    system_python = "/usr/bin/python3"
    if not os.access(system_python, os.X_OK) or system_python == sys.executable:
        pytest.skip("needs a python without Lazarus installed")
    agent = LocalShimAgent(NodeSpec(name="n1"), shell=DASH)
    out = tmp_path / "env.json"
    [started] = agent.start_ranks_warm(
        str(run_root / "gen-00001"),
        [dump_launch(0, tmp_path, out, system_python)],
        warm(run_root),
    )
    assert not started.warm and started.cold_reason is not None
    assert "lazarus" in started.cold_reason, started.cold_reason
    wait_for(out.exists, what="the cold rank to run")


@pytest.mark.timeout(60)
def test_a_command_that_is_not_python_starts_cold_and_is_never_run_as_the_client(
    run_root: Path, tmp_path: Path
) -> None:
    """``bash -m FILE`` would run FILE: the shim runs only a python with ``-m``."""
    trap = tmp_path / "activities.nodes.warm"
    trap.write_text(f"touch {tmp_path / 'ran'}\n")
    agent = LocalShimAgent(NodeSpec(name="n1"), shell=DASH)
    [started] = agent.start_ranks_warm(
        str(run_root / "gen-00001"),
        [
            RankLaunch(
                rank=0,
                command=["sh", "-c", "exit 0"],
                env={"PATH": os.environ["PATH"]},
                workdir=str(tmp_path),
            )
        ],
        warm(run_root),
    )
    assert not started.warm
    assert started.cold_reason is not None and "not a python" in started.cold_reason
    assert not (tmp_path / "ran").exists()


@pytest.mark.timeout(90)
def test_a_dead_zygote_is_restarted_cold_once_then_warm(run_root: Path, tmp_path: Path) -> None:
    agent = LocalShimAgent(NodeSpec(name="n1"), shell=DASH)

    def start(generation: int) -> StartedRank:
        out = tmp_path / f"env-{generation}.json"
        [rank] = agent.start_ranks_warm(
            str(run_root / f"gen-{generation:05d}"),
            [dump_launch(0, tmp_path, out, sys.executable)],
            warm(run_root),
        )
        agent.stop(str(run_root), generation, 0.0)  # as the next launch's fence would
        return rank

    assert start(1).warm
    info = zygote_client.read_zygote(zygote_dir(run_root, "n1"))
    assert info is not None
    os.kill(info.pid, 9)
    wait_for(lambda: not is_alive(info.pid, info.start_ticks), what="the zygote to die")
    cold = start(2)
    assert not cold.warm and cold.cold_reason is not None
    assert "dead" in cold.cold_reason and "restarted" in cold.cold_reason
    directory = zygote_dir(run_root, "n1")
    zygote_client.wait_serving(directory, 60)
    assert start(3).warm


@pytest.mark.timeout(120)
def test_a_prewarmed_spare_forks_its_first_launch_and_end_run_stops_its_zygote(
    run_root: Path, tmp_path: Path
) -> None:
    """Issue 28: a spare's zygote started ahead of any launch there (the shim's ``warm``
    with ``prewarm``): no generation made, the zygote detached, a second prewarm finds
    it; the spare's first launch forks from it, and the end of the run stops it."""
    agent = LocalShimAgent(NodeSpec(name="n1"), shell=DASH)
    out = tmp_path / "env-spare.json"
    # Lazarus from this checkout on the node, as rank_environment sets it.
    template = dump_launch(2, tmp_path, out, sys.executable, SHARED="spare", PYTHONPATH=str(REPO))
    assert agent.prewarm(template, warm(run_root)) is None
    directory = zygote_dir(run_root, "n1")
    info = zygote_client.read_zygote(directory)
    assert info is not None and is_alive(info.pid, info.start_ticks)
    assert info.pid != os.getpid()
    assert not list(run_root.glob("gen-*")), "a prewarm makes no generation"
    assert not out.exists(), "a prewarm starts no rank"
    assert agent.prewarm(template, warm(run_root)) is None
    again = zygote_client.read_zygote(directory)
    assert again is not None and again.pid == info.pid, "one zygote per run and node"

    [started] = agent.start_ranks_warm(str(run_root / "gen-00002"), [template], warm(run_root))
    assert (started.warm, started.cold_reason) == (True, None)
    env = wait_for(functools.partial(read_env, out))
    assert env["SHARED"] == "spare" and env["RANK"] == "2"

    shell = template.model_copy(update={"command": ["/bin/sh", "-c", "true"]})
    why = agent.prewarm(shell, warm(run_root))
    assert why is not None and "not a python interpreter" in why

    agent.stop(str(run_root), None, 0.0)
    agent.end_run(str(run_root), [])
    assert not is_alive(info.pid, info.start_ticks), "the spare's zygote outlived the run"


def test_warm_call_keeps_the_environment_off_the_command_line() -> None:
    launch = RankLaunch(
        rank=3,
        command=["python", "train.py"],
        env={"PATH": "/opt/venv/bin:/usr/bin", "PYTHONPATH": "/src", "TOKEN": "s3cr3t"},
        workdir="/work",
        env_file="/etc/job.env",
    )
    call = warm_call(
        "/runs/gen-00001", "n1", [launch], WarmStart(run_root="/runs", preload=[], standby=0)
    )
    assert call.argv == ["warm", "/runs/gen-00001", "python", "/work"]
    assert not any("s3cr3t" in a or "/opt/venv" in a for a in call.argv)
    search_path, python_path, request = call.stdin.split("\n", 2)
    assert (search_path, python_path) == ("/opt/venv/bin:/usr/bin", "/src")
    body = json.loads(request)
    assert body["ranks"][0]["env"]["TOKEN"] == "s3cr3t" and body["env_file"] == "/etc/job.env"
    with pytest.raises(ValueError, match="newline"):
        warm_call(
            "/g",
            "n1",
            [launch.model_copy(update={"env": {"PATH": "/a\n/b"}})],
            WarmStart(run_root="/runs", preload=[], standby=0),
        )


def test_a_bad_request_is_refused_without_echoing_values(tmp_path: Path) -> None:
    import subprocess

    request = {"gen_dir": str(tmp_path), "ranks": [{"rank": 0, "env": {"K": 1234567}}]}
    done = subprocess.run(
        [sys.executable, "-m", "activities.nodes.warm"],
        input=json.dumps(request).encode(),
        capture_output=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    [record], _ = json_lines(done.stdout)
    assert done.returncode == 2 and "bad request" in record["error"]
    assert "1234567" not in record["error"] and "ranks.0.env.K" in record["error"]


@pytest.mark.timeout(60)
def test_a_cold_start_adopts_a_rank_the_zygote_claimed(run_root: Path, tmp_path: Path) -> None:
    """A fork whose answer was lost: the zygote's pid file arrives after the claim, and
    the cold start adopts it instead of starting the rank twice."""
    import subprocess

    from activities.nodes.procfs import read_stat

    gen = run_root / "gen-00001"
    gen.mkdir()
    (gen / "rank-0.zygote.claim").touch()
    forked = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        stat = read_stat(forked.pid)
        assert stat is not None
        record = {
            "rank": 0,
            "wrapper_pid": forked.pid,
            "pgid": forked.pid,
            "wrapper_start_ticks": stat.start_ticks,
            "pid": forked.pid,
            "start_ticks": stat.start_ticks,
            "started_at": time.time(),
        }

        def write_late() -> None:
            # Atomically, as the zygote writes it: the shim must never see it half-written.
            time.sleep(0.5)
            temp = gen / ".rank-0.pid.lazarus-tmp"
            temp.write_text(json.dumps(record))
            temp.replace(gen / "rank-0.pid")

        writer = threading.Thread(target=write_late)
        writer.start()
        agent = LocalShimAgent(NodeSpec(name="n1"), shell=DASH)
        [started] = agent.start_ranks(
            str(gen), [dump_launch(0, tmp_path, tmp_path / "never.json", sys.executable)]
        )
        writer.join()
        assert started.adopted and started.pid == forked.pid
        assert not (tmp_path / "never.json").exists()
    finally:
        forked.kill()
        forked.wait()
