"""The zygote starts ranks that are indistinguishable from rank_wrapper's, or says why not.

Real processes throughout: a zygote, its standbys and ranks, and rank_wrapper cold
starts of the same scripts to compare against. Every test stops its zygote and
kills any rank group it left (fixture ``zygotes``).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from activities.nodes import zygote_client
from activities.nodes.procfs import is_alive, live_groups, owned_group, read_stat
from activities.nodes.zygote_client import ForkedRank, ZygoteUnavailable
from lazarus.domain.ports import free_port
from tests.tiers import only_in_test_all

REPO_ROOT = Path(__file__).resolve().parents[2]
TRAIN_DDP = REPO_ROOT / "examples" / "train_ddp.py"

StartZygote = Callable[..., Path]


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def wait_exit(gen: Path, rank: int, timeout_s: float = 60.0) -> dict[str, Any]:
    return wait_for(  # type: ignore[no-any-return]
        lambda: read_json(gen / f"rank-{rank}.exit.json"), timeout_s, f"rank {rank} to exit"
    )


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAZARUS_", "TORCHELASTIC_"))}
    env.update(PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", **extra)
    return env


@pytest.fixture
def zygotes(tmp_path: Path) -> Iterator[StartZygote]:
    """Start zygotes under tmp_path; at teardown stop them and kill every rank group
    any generation directory under tmp_path names."""
    started: list[Path] = []

    def start(
        preload: tuple[str, ...] = ("json",),
        standby: int = 0,
        env: dict[str, str] | None = None,
        wait: bool = True,
    ) -> Path:
        run_dir = tmp_path / f"zygote-{len(started)}"
        started.append(run_dir)
        zygote_client.start_zygote(run_dir, preload, standby, env=env or base_env())
        if wait:
            wait_for(
                lambda: (i := zygote_client.read_zygote(run_dir)) and i.state != "starting",
                150,  # torch and torch._dynamo on a loaded 2-core machine
                "the zygote to preload",
            )
        return run_dir

    yield start
    for run_dir in started:
        zygote_client.stop_zygote(run_dir)
    groups = set()
    for pid_file in tmp_path.rglob("rank-*.pid"):
        record = read_json(pid_file)
        if record is not None and (pgid := owned_group(record)) is not None:
            groups.add(pgid)
    for pgid in live_groups(groups):
        os.killpg(pgid, signal.SIGKILL)


def script(tmp_path: Path, body: str, name: str = "job.py") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def cold_start(gen: Path, rank: int, argv: list[str], env: dict[str, str], cwd: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "activities.nodes.rank_wrapper",
            "--rank",
            str(rank),
            "--gen-dir",
            str(gen),
            "--",
            *argv,
        ],
        cwd=cwd,
        env=env,
        check=True,
        start_new_session=True,
        timeout=30,
    )


def new_gen(tmp_path: Path, name: str) -> Path:
    gen = tmp_path / name / "gen-00001"
    gen.mkdir(parents=True)
    return gen


def test_forked_rank_writes_the_files_rank_wrapper_writes(
    tmp_path: Path, zygotes: StartZygote
) -> None:
    run_dir = zygotes(standby=1)
    job = script(
        tmp_path,
        "import os, sys\nprint('argv', sys.argv[1:], 'cwd', os.getcwd(), 'x', os.environ['X'])\n"
        "print('oops', file=sys.stderr)\n",
    )
    env = base_env(X="42")
    argv = [sys.executable, str(job), "a", "b"]
    cold, warm = new_gen(tmp_path, "cold"), new_gen(tmp_path, "warm")
    cold_start(cold, 0, argv, env, tmp_path)
    forked = zygote_client.fork_rank(run_dir, 0, warm, argv, env, tmp_path, timeout_s=10)

    cold_exit, warm_exit = wait_exit(cold, 0), wait_exit(warm, 0)
    cold_pid = wait_for(lambda: read_json(cold / "rank-0.pid"), 10, "cold pid file")
    warm_pid = read_json(warm / "rank-0.pid")
    assert warm_pid is not None
    assert warm_pid.keys() == cold_pid.keys()
    assert warm_exit.keys() == cold_exit.keys()
    assert {**warm_exit, "ended_at": 0} == {**cold_exit, "ended_at": 0}
    assert forked == ForkedRank.model_validate({**warm_pid, "from_standby": True})
    assert warm_pid["pgid"] == warm_pid["wrapper_pid"] != warm_pid["pid"]
    assert owned_group(warm_pid) == warm_pid["pgid"]
    expected = f"argv ['a', 'b'] cwd {tmp_path} x 42\noops\n"
    assert (cold / "rank-0.log").read_text() == expected
    assert (warm / "rank-0.log").read_text() == expected


def test_the_rank_runs_in_its_wrappers_own_session(tmp_path: Path, zygotes: StartZygote) -> None:
    run_dir = zygotes(standby=0)
    job = script(tmp_path, "import time\ntime.sleep(60)\n")
    gen = new_gen(tmp_path, "w")
    forked = zygote_client.fork_rank(
        run_dir, 0, gen, [sys.executable, str(job)], base_env(), tmp_path, 10
    )
    zygote = zygote_client.live_zygote(run_dir)
    rank, wrapper = read_stat(forked.pid), read_stat(forked.wrapper_pid)
    assert rank is not None and wrapper is not None
    assert rank.pgrp == wrapper.pgrp == forked.pgid == forked.wrapper_pid != zygote.pgid
    assert os.getsid(forked.pid) == forked.wrapper_pid
    # Stopping the zygote leaves handed-out ranks alone; stopping the rank's group
    # (what ``stop`` does) records SIGTERM as a cold rank's wrapper would.
    assert zygote_client.stop_zygote(run_dir)
    assert is_alive(forked.pid, forked.start_ticks)
    os.killpg(forked.pgid, signal.SIGTERM)
    exit_record = wait_exit(gen, 0)
    assert (exit_record["exit_code"], exit_record["signal"]) == (-15, "SIGTERM")


EXITS = {
    "clean": ("print('fine')\n", 0, None),
    "sys.exit(3)": ("import sys\nsys.exit(3)\n", 3, None),
    "sys.exit(message)": ("import sys\nsys.exit('bad config')\n", 1, None),
    "uncaught": ("def f():\n    raise ValueError('boom')\nf()\n", 1, None),
    "SIGKILL": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", -9, "SIGKILL"),
    "KeyboardInterrupt": ("raise KeyboardInterrupt\n", -2, "SIGINT"),
}


@pytest.mark.parametrize("case", list(EXITS))
def test_exit_status_is_what_a_cold_interpreter_gives(
    case: str, tmp_path: Path, zygotes: StartZygote
) -> None:
    body, code, sig = EXITS[case]
    run_dir = zygotes(standby=1)
    job = script(tmp_path, body)
    argv = [sys.executable, str(job)]
    cold, warm = new_gen(tmp_path, "cold"), new_gen(tmp_path, "warm")
    cold_start(cold, 0, argv, base_env(), tmp_path)
    zygote_client.fork_rank(run_dir, 0, warm, argv, base_env(), tmp_path, 10)
    cold_exit, warm_exit = wait_exit(cold, 0), wait_exit(warm, 0)
    assert (cold_exit["exit_code"], cold_exit["signal"]) == (code, sig)
    assert (warm_exit["exit_code"], warm_exit["signal"]) == (code, sig)
    cold_log, warm_log = (cold / "rank-0.log").read_text(), (warm / "rank-0.log").read_text()
    if case == "uncaught":
        # Same traceback, with no zygote or runpy frames in it.
        assert warm_log == cold_log
        assert "ValueError: boom" in warm_log
    else:
        assert warm_log.splitlines()[-1:] == cold_log.splitlines()[-1:]


def test_python_dash_m_and_dash_c(tmp_path: Path, zygotes: StartZygote) -> None:
    run_dir = zygotes()
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tool.py").write_text(
        "import sys\nprint('module', __name__, sys.argv[1:])\nsys.exit(4)\n"
    )
    gen = new_gen(tmp_path, "m")
    env = base_env()
    zygote_client.fork_rank(
        run_dir, 0, gen, [sys.executable, "-m", "mypkg.tool", "x"], env, tmp_path, 10
    )
    zygote_client.fork_rank(
        run_dir,
        1,
        gen,
        [sys.executable, "-u", "-c", "import sys; print('c', sys.argv)"],
        env,
        tmp_path,
        10,
    )
    assert wait_exit(gen, 0)["exit_code"] == 4
    assert (gen / "rank-0.log").read_text() == "module __main__ ['x']\n"
    assert wait_exit(gen, 1)["exit_code"] == 0
    assert (gen / "rank-1.log").read_text() == "c ['-c']\n"


def test_a_standby_is_used_and_refilled_and_a_killed_one_replaced(
    tmp_path: Path, zygotes: StartZygote
) -> None:
    run_dir = zygotes(standby=1)
    idle = wait_for(lambda: zygote_client.zygote_status(run_dir).idle_standby_pids, 30, "a standby")
    job = script(tmp_path, "print('hi')\n")
    gen = new_gen(tmp_path, "s")
    forked = zygote_client.fork_rank(
        run_dir, 0, gen, [sys.executable, str(job)], base_env(), tmp_path, 10
    )
    assert forked.from_standby and forked.wrapper_pid == idle[0]
    refill = wait_for(
        lambda: [p for p in zygote_client.zygote_status(run_dir).idle_standby_pids if p != idle[0]],
        30,
        "the pool to refill",
    )
    assert wait_exit(gen, 0)["exit_code"] == 0
    os.kill(refill[0], signal.SIGKILL)  # an idle standby dies: the zygote replaces it
    wait_for(
        lambda: [
            p for p in zygote_client.zygote_status(run_dir).idle_standby_pids if p != refill[0]
        ],
        30,
        "the killed standby to be replaced",
    )


def test_a_dead_or_absent_zygote_is_unavailable_and_leaves_no_standby(
    tmp_path: Path, zygotes: StartZygote
) -> None:
    gen = new_gen(tmp_path, "d")
    argv, env = [sys.executable, "-c", "pass"], base_env()
    with pytest.raises(ZygoteUnavailable, match="no zygote"):
        zygote_client.fork_rank(tmp_path / "nowhere", 0, gen, argv, env, tmp_path, 5)
    run_dir = zygotes(standby=2)
    idle = wait_for(
        lambda: len(s := zygote_client.zygote_status(run_dir).idle_standby_pids) == 2 and s,
        30,
        "two standbys",
    )
    info = zygote_client.live_zygote(run_dir)
    os.kill(info.pid, signal.SIGKILL)
    wait_for(lambda: not is_alive(info.pid), 10, "the zygote to die")
    with pytest.raises(ZygoteUnavailable, match="dead"):
        zygote_client.fork_rank(run_dir, 0, gen, argv, env, tmp_path, 5)
    wait_for(lambda: not any(is_alive(p) for p in idle), 10, "orphaned standbys to exit")
    assert not (gen / "rank-0.pid").exists()


def test_a_failed_preload_is_reported_and_refused(tmp_path: Path, zygotes: StartZygote) -> None:
    run_dir = zygotes(preload=("json", "lazarus_no_such_module"))
    info = zygote_client.live_zygote(run_dir)
    assert info.state == "refused"
    assert info.preload_results["json"].ok
    bad = info.preload_results["lazarus_no_such_module"]
    assert not bad.ok and bad.error is not None and "ModuleNotFoundError" in bad.error
    gen = new_gen(tmp_path, "p")
    with pytest.raises(ZygoteUnavailable, match="preload failed: lazarus_no_such_module"):
        zygote_client.fork_rank(
            run_dir, 0, gen, [sys.executable, "-c", "pass"], base_env(), tmp_path, 5
        )
    with pytest.raises(ZygoteUnavailable, match="refuses"):
        zygote_client.wait_serving(run_dir, 5)


def test_a_thread_started_by_a_preload_makes_it_refuse(
    tmp_path: Path, zygotes: StartZygote
) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "threaded.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(600,), daemon=True, name='pool').start()\n"
    )
    run_dir = zygotes(preload=("threaded",), env=base_env(PYTHONPATH=str(lib)))
    info = zygote_client.live_zygote(run_dir)
    assert info.state == "refused"
    assert info.reason is not None and "2 Python threads" in info.reason and "pool" in info.reason


@pytest.mark.parametrize(
    ("argv", "env_extra", "reason"),
    [
        (["bash", "-c", "sleep 30"], {}, "only python commands"),
        (["/usr/bin/env", "python", "x.py"], {}, "only python commands"),
        ([sys.executable, "-X", "dev", "x.py"], {}, "option '-X'"),
        ([sys.executable, "x.py"], {"PYTHONHASHSEED": "0"}, "PYTHONHASHSEED"),
    ],
)
def test_fork_rank_never_starts_what_it_cannot_start_as_python(
    argv: list[str],
    env_extra: dict[str, str],
    reason: str,
    tmp_path: Path,
    zygotes: StartZygote,
) -> None:
    run_dir = zygotes(standby=1)
    gen = new_gen(tmp_path, "n")
    with pytest.raises(ZygoteUnavailable, match=reason):
        zygote_client.fork_rank(run_dir, 0, gen, argv, base_env(**env_extra), tmp_path, 5)
    assert sorted(p.name for p in gen.iterdir()) == []
    assert zygote_client.zygote_status(run_dir).state == "serving"


def test_stop_zygote_never_signals_a_pid_that_is_not_its_zygote(tmp_path: Path) -> None:
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        stat = read_stat(bystander.pid)
        assert stat is not None
        run_dir = tmp_path / "z"
        run_dir.mkdir()
        (run_dir / "zygote.pid").write_text(
            json.dumps(
                {
                    "pid": bystander.pid,
                    "pgid": bystander.pid,
                    "start_ticks": stat.start_ticks + 1,  # a reused pid
                    "state": "serving",
                    "reason": None,
                    "socket": str(run_dir / "zygote.sock"),
                    "preload": [],
                    "preload_results": {},
                    "standby": 0,
                    "python": sys.executable,
                    "native_threads": 1,
                    "started_at": 0.0,
                    "ready_at": 0.0,
                }
            )
        )
        assert not zygote_client.stop_zygote(run_dir, grace_s=0.5)
        assert bystander.poll() is None
        assert not (run_dir / "zygote.pid").exists()  # stale: cleared
        with pytest.raises(ZygoteUnavailable, match="no zygote"):
            zygote_client.fork_rank(
                run_dir, 0, tmp_path, [sys.executable, "-c", "pass"], base_env(), tmp_path, 5
            )
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.timeout(600)
def test_a_two_rank_gloo_job_runs_to_completion_from_zygote_forks(
    tmp_path: Path, zygotes: StartZygote
) -> None:
    pytest.importorskip("torch")
    env = base_env(MASTER_ADDR="127.0.0.1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    run_dir = zygotes(preload=("torch", "torch.distributed"), standby=2, env=env)
    assert zygote_client.live_zygote(run_dir).state == "serving"
    wait_for(
        lambda: len(zygote_client.zygote_status(run_dir).idle_standby_pids) == 2, 120, "standbys"
    )
    gen = new_gen(tmp_path, "ddp")
    out = tmp_path / "final.pt"
    port = str(free_port())
    args = ["--steps", "6", "--ckpt-every", "3", "--step-time", "0", "--seed", "7"]
    for rank in range(2):
        rank_env = {
            **env,
            "MASTER_PORT": port,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "LAZARUS_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        }
        forked = zygote_client.fork_rank(
            run_dir,
            rank,
            gen,
            [sys.executable, str(TRAIN_DDP), *args, "--out", str(out)],
            rank_env,
            REPO_ROOT,
            30,
        )
        assert forked.from_standby
    for rank in range(2):
        record = wait_exit(gen, rank, timeout_s=200)
        log = (gen / f"rank-{rank}.log").read_text()
        assert record["exit_code"] == 0, log
        assert "step 6 loss" in log, log
    assert out.exists()


def _first_line_latency(gen: Path, rank: int, requested_at: float) -> float:
    marker = gen / f"first-{rank}"
    wait_for(marker.exists, 60, "the script's first line")
    return float(marker.read_text()) - requested_at


@pytest.mark.timeout(300)
@only_in_test_all("a measurement that prints and never asserts (the zygote's paths: above)")
def test_measure_cold_start_against_zygote_fork(
    tmp_path: Path, zygotes: StartZygote, capsys: pytest.CaptureFixture[str]
) -> None:
    """Prints (never asserts) the time from "start rank" to the script's first line
    after ``import torch``, median of 5, cold through rank_wrapper and from the zygote."""
    pytest.importorskip("torch")
    env = base_env()
    run_dir = zygotes(preload=("torch",), standby=1, env=env)
    job = script(
        tmp_path,
        "import sys, time\nimport torch\n"
        "open(sys.argv[1] + '.tmp', 'w').write(repr(time.time()))\n"
        "import os\nos.replace(sys.argv[1] + '.tmp', sys.argv[1])\n",
    )
    cold_times, warm_times = [], []
    for i in range(5):
        cold, warm = new_gen(tmp_path, f"cold{i}"), new_gen(tmp_path, f"warm{i}")
        started = time.time()
        cold_start(cold, 0, [sys.executable, str(job), str(cold / "first-0")], env, tmp_path)
        cold_times.append(_first_line_latency(cold, 0, started))
        wait_for(lambda: zygote_client.zygote_status(run_dir).idle_standby_pids, 60, "standby")
        started = time.time()
        zygote_client.fork_rank(
            run_dir, 0, warm, [sys.executable, str(job), str(warm / "first-0")], env, tmp_path, 30
        )
        warm_times.append(_first_line_latency(warm, 0, started))
    with capsys.disabled():
        print(
            f"\nstart -> first line after `import torch`, median of 5: "
            f"cold (rank_wrapper) {statistics.median(cold_times):.3f} s, "
            f"zygote (standby) {statistics.median(warm_times):.3f} s "
            f"[cold {', '.join(f'{t:.3f}' for t in cold_times)}; "
            f"zygote {', '.join(f'{t:.3f}' for t in warm_times)}]"
        )
