"""The node shim (activities/nodes/shim.sh), run locally through LocalShimAgent.

This is the exact code the ssh agent sends to remote nodes, minus the network, so
the process semantics are checked here against the real kernel: detachment, exit
records, adoption, stop with grace, pid-reuse safety, JSON escaping and shell
injection. Shells: dash (the strictest common /bin/sh) wherever it exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from activities.nodes.agent import NodeStatus, NodeUnreachable, PreflightRequest
from activities.nodes.node_records import RankLaunch
from activities.nodes.shim_agent import LocalShimAgent, ShimError
from activities.nodes.shim_calls import SHIM_PATH, json_lines, shim_script, start_call
from lazarus.domain.checkpoint_layout import TEMP_SUFFIX
from lazarus.domain.spec import NodeSpec

DASH = "/bin/dash" if os.access("/bin/dash", os.X_OK) else "/bin/sh"
SHELLS = [DASH] + (["/bin/bash"] if os.access("/bin/bash", os.X_OK) else [])


# --- helpers ------------------------------------------------------------------------------


def proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (state first), or None when gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()


def alive(pid: int) -> bool:
    fields = proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = proc_stat(int(entry.name))
            if fields and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


def signal_mask(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no {field} for {pid}")


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what or predicate}")


def launch(rank: int, script: str, workdir: Path, **env: str) -> RankLaunch:
    return RankLaunch(
        rank=rank,
        command=["sh", "-c", script],
        env={"PATH": os.environ["PATH"], **env},
        workdir=str(workdir),
    )


def kill_leftovers(run_root: Path) -> None:
    """Belt and braces after each test: SIGKILL every group a pid file names."""
    for pid_file in run_root.glob("gen-*/rank-*.pid"):
        try:
            pgid = int(json.loads(pid_file.read_text())["pgid"])
        except (OSError, ValueError, KeyError):
            continue
        if pgid > 1 and group_members(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
def run_root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "runs" / "job"
    root.mkdir(parents=True)
    try:
        yield root
    finally:
        kill_leftovers(root)


@pytest.fixture
def agent(run_root: Path) -> Iterator[LocalShimAgent]:
    node = LocalShimAgent(NodeSpec(name="n1"), shell=DASH)
    try:
        yield node
    finally:
        node.stop(str(run_root), None, 0.0)
        node.close()


def gen_dir(run_root: Path, generation: int = 1) -> str:
    return str(run_root / f"gen-{generation:05d}")


def poll_until(
    agent: LocalShimAgent, gen: str, ranks: list[int], check: Callable[[NodeStatus], bool]
) -> NodeStatus:
    last: list[NodeStatus] = []

    def probe() -> bool:
        status = agent.poll(gen, ranks)
        last[:] = [status]
        return check(status)

    try:
        wait_for(probe, what="poll condition")
    except AssertionError:
        raise AssertionError(f"last status: {last}") from None
    return last[0]


# --- syntax and shells ---------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("shell", SHELLS)
def test_shim_parses_in_posix_shells(shell: str) -> None:
    done = subprocess.run([shell, "-n", str(SHIM_PATH)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.timeout(30)
def test_shim_has_no_common_bashisms() -> None:
    code = "\n".join(
        line for line in SHIM_PATH.read_text().splitlines() if not line.lstrip().startswith("#")
    )
    for bashism in ("[[ ", "$'", "pipefail", "${!", "<<<", "$RANDOM", "$BASH", "echo -e"):
        assert bashism not in code, bashism
    # Only warm starts, rejoin and a replica's restore run python (shim_run_module):
    # the ranks' own interpreter, which runs the zygote, carries the node's survivors,
    # or streams a replica node to node.
    code = re.sub(r"(?ms)^shim_run_module\(\) \{.*?^\}$", "", code)
    for pattern in (r"^\s*function\s", r"^\s*local\s", r"\bawk\b", r"\bpython", r"\bperl\b"):
        assert not re.search(pattern, code, re.MULTILINE), pattern


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shell", SHELLS)
def test_start_status_stop_cycle_in_each_shell(shell: str, run_root: Path, tmp_path: Path) -> None:
    node = LocalShimAgent(NodeSpec(name="n1"), shell=shell)
    gen = gen_dir(run_root)
    started = node.start_ranks(gen, [launch(0, "echo up; exec sleep 30", tmp_path)])
    assert started[0].pid > 0 and not started[0].adopted
    status = node.poll(gen, [0])
    assert status.reachable and status.ranks[0].alive
    result = node.stop(str(run_root), None, 5.0)
    assert result.signalled_groups == 1 and result.killed_groups == 0
    assert not alive(started[0].pid)


# --- start, adoption, detachment -----------------------------------------------------------


@pytest.mark.timeout(60)
def test_start_two_ranks_then_adopt_without_duplicates(
    agent: LocalShimAgent, run_root: Path, tmp_path: Path
) -> None:
    gen = gen_dir(run_root)
    marker = f"lazarus-test-{uuid.uuid4().hex}"
    heartbeat = Path(gen) / "rank-1.heartbeat.json"
    writer = (
        "import json, os, time; p = os.environ['HB']; "
        "open(p + '.tmp', 'w').write(json.dumps({'step': 7, 'time': time.time()})); "
        "os.replace(p + '.tmp', p); time.sleep(30)"
    )
    ranks = [
        RankLaunch(
            rank=0,
            command=["sh", "-c", "echo hi; sleep 30", marker],
            env={"PATH": os.environ["PATH"]},
            workdir=str(tmp_path),
        ),
        RankLaunch(
            rank=1,
            command=[sys.executable, "-c", writer],
            env={"PATH": os.environ["PATH"], "HB": str(heartbeat)},
            workdir=str(tmp_path),
        ),
    ]
    first = agent.start_ranks(gen, ranks)
    assert [r.rank for r in first] == [0, 1]
    assert all(not r.adopted for r in first)
    assert first[0].log_file == f"{gen}/rank-0.log"

    status = poll_until(
        agent, gen, [0, 1], lambda s: all(r.alive for r in s.ranks) and bool(s.ranks[1].heartbeat)
    )
    assert status.reachable and status.error is None
    assert [r.pid for r in status.ranks] == [first[0].pid, first[1].pid]
    assert status.ranks[1].heartbeat is not None and status.ranks[1].heartbeat["step"] == 7
    assert status.ranks[0].heartbeat is None and status.ranks[0].exit is None
    assert status.round_trip_s > 0

    again = agent.start_ranks(gen, ranks)
    assert all(r.adopted for r in again)
    assert [(r.pid, r.pgid, r.start_ticks) for r in again] == [
        (r.pid, r.pgid, r.start_ticks) for r in first
    ]
    rank_argv0 = [b"sh", b"-c", b"echo hi; sleep 30", marker.encode()]
    running = [
        p
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and _cmdline(p).split(b"\0")[:4] == rank_argv0
    ]
    assert len(running) == 1, running
    wait_for(lambda: Path(first[0].log_file).read_text() == "hi\n", what="rank 0 output")

    record = json.loads((Path(gen) / "rank-0.pid").read_text())
    assert set(record) == {
        "rank",
        "wrapper_pid",
        "pgid",
        "wrapper_start_ticks",
        "pid",
        "start_ticks",
        "started_at",
    }
    assert record["pid"] == first[0].pid and record["pgid"] == record["wrapper_pid"]


def _cmdline(proc_dir: Path) -> bytes:
    try:
        return (proc_dir / "cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.timeout(60)
def test_rank_is_detached_in_its_own_session_with_default_signals(
    agent: LocalShimAgent, run_root: Path, tmp_path: Path
) -> None:
    gen = gen_dir(run_root)
    (started,) = agent.start_ranks(gen, [launch(0, "exec sleep 30", tmp_path)])
    fields = proc_stat(started.pid)
    assert fields is not None
    ppid, pgrp, session = int(fields[1]), int(fields[2]), int(fields[3])
    assert pgrp == started.pgid == session == ppid, "the wrapper leads the rank's own session"
    wrapper_stat = proc_stat(ppid)
    assert wrapper_stat is not None
    assert int(wrapper_stat[1]) != os.getpid(), "the wrapper must not be our child"
    assert started.pgid != os.getpgid(0)
    # Until the environment loader (same pid) has read its program from the pipe and
    # exec'd the command, stdin is that pipe and its signal dispositions are the
    # loader's: wait for the exec, on a loaded machine too.
    deadline = time.monotonic() + 30
    while not _cmdline(Path(f"/proc/{started.pid}")).startswith(b"sleep"):
        assert time.monotonic() < deadline, "the rank never exec'd its command"
        time.sleep(0.05)
    term_hup_int = (
        (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGHUP - 1)) | (1 << (signal.SIGINT - 1))
    )
    assert signal_mask(started.pid, "SigIgn") & term_hup_int == 0, "rank must get defaults"
    assert signal_mask(ppid, "SigIgn") & term_hup_int == term_hup_int, "wrapper ignores them"
    assert Path(f"/proc/{started.pid}/fd/0").resolve() == Path("/dev/null")
    assert Path(f"/proc/{started.pid}/fd/1").resolve() == Path(started.log_file).resolve()


# --- exit records ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_exit_records_for_exit_codes_and_signals(
    agent: LocalShimAgent, run_root: Path, tmp_path: Path
) -> None:
    gen = gen_dir(run_root)
    started = agent.start_ranks(
        gen,
        [
            launch(0, "exit 0", tmp_path),
            launch(1, "exit 3", tmp_path),
            launch(2, "exec sleep 30", tmp_path),
            launch(3, "kill -TERM $$", tmp_path),
        ],
    )
    os.kill(started[2].pid, signal.SIGKILL)
    status = poll_until(agent, gen, [0, 1, 2, 3], lambda s: all(r.exit for r in s.ranks))
    exits = [r.exit for r in status.ranks]
    assert all(e is not None for e in exits)
    assert [(e["exit_code"], e["signal"]) for e in exits if e] == [
        (0, None),
        (3, None),
        (-9, "SIGKILL"),
        (-15, "SIGTERM"),
    ]
    for rank, record in enumerate(exits):
        assert record is not None and record["rank"] == rank
        assert isinstance(record["ended_at"], float | int)
        assert abs(record["ended_at"] - time.time()) < 60
    assert not any(r.alive for r in status.ranks)
    leftovers = [p.name for p in Path(gen).iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


@pytest.mark.timeout(60)
def test_missing_workdir_and_stopped_generation_are_refused(
    agent: LocalShimAgent, run_root: Path, tmp_path: Path
) -> None:
    gen = gen_dir(run_root)
    with pytest.raises(ShimError, match=r"workdir .*does not exist"):
        agent.start_ranks(gen, [launch(0, "true", tmp_path / "nowhere")])
    assert not (Path(gen) / "rank-0.pid").exists()
    agent.start_ranks(gen, [launch(0, "exec sleep 30", tmp_path)])
    agent.stop(str(run_root), None, 1.0)
    with pytest.raises(ShimError, match="was stopped"):
        agent.start_ranks(gen, [launch(1, "exec sleep 30", tmp_path)])
    assert not (Path(gen) / "rank-1.pid").exists()


@pytest.mark.timeout(60)
def test_program_name_with_equals_sign_is_not_an_assignment(
    agent: LocalShimAgent, run_root: Path, tmp_path: Path
) -> None:
    script = tmp_path / "a=b"
    script.write_text("#!/bin/sh\necho ran-a=b\n")
    script.chmod(0o755)
    gen = gen_dir(run_root)
    (started,) = agent.start_ranks(
        gen, [RankLaunch(rank=0, command=["./a=b"], env={}, workdir=str(tmp_path))]
    )
    status = poll_until(agent, gen, [0], lambda s: s.ranks[0].exit is not None)
    assert status.ranks[0].exit and status.ranks[0].exit["exit_code"] == 0
    assert Path(started.log_file).read_text() == "ran-a=b\n"


# --- status details -------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_status_sees_sigstop_and_ignores_reused_pids(
    agent: LocalShimAgent, run_root: Path, tmp_path: Path
) -> None:
    gen = gen_dir(run_root)
    (started,) = agent.start_ranks(gen, [launch(0, "exec sleep 30", tmp_path)])
    os.kill(started.pid, signal.SIGSTOP)
    status = poll_until(agent, gen, [0], lambda s: s.ranks[0].stopped)
    assert status.ranks[0].alive
    os.kill(started.pid, signal.SIGCONT)

    # A pid file whose pid now belongs to another process (different start ticks).
    # Outside run_root: teardown's stop must not see a pid file naming our own group.
    other = tmp_path / "elsewhere" / "gen-00002"
    other.mkdir(parents=True)
    me = os.getpid()
    fields = proc_stat(me)
    assert fields is not None
    real_ticks = int(fields[19])
    (other / "rank-0.pid").write_text(json.dumps({"pid": me, "pgid": me, "start_ticks": 1}))
    (other / "rank-1.pid").write_text(
        json.dumps({"pid": me, "pgid": me, "start_ticks": real_ticks})
    )
    status = agent.poll(str(other), [0, 1, 2])
    assert [r.alive for r in status.ranks] == [False, True, False]
    assert [r.pid for r in status.ranks] == [me, me, None]


@pytest.mark.timeout(60)
def test_status_survives_torn_or_foreign_files(agent: LocalShimAgent, run_root: Path) -> None:
    gen = Path(gen_dir(run_root))
    gen.mkdir()
    (gen / "rank-0.heartbeat.json").write_text('{"step": 3, "loss": }')  # braces, not JSON
    (gen / "rank-1.heartbeat.json").write_text('{"step": 4')  # torn
    (gen / "rank-2.heartbeat.json").write_text('{\n  "step": 5,\n\t"note": "multi\\nline"\n}\n')
    (gen / "rank-2.exit.json").write_text("")
    status = agent.poll(str(gen), [0, 1, 2])
    assert status.reachable
    assert [r.heartbeat for r in status.ranks[:2]] == [None, None]
    assert status.ranks[2].heartbeat == {"step": 5, "note": "multi\nline"}
    assert status.ranks[2].exit is None


@pytest.mark.timeout(60)
def test_log_tail_returns_the_end(agent: LocalShimAgent, run_root: Path, tmp_path: Path) -> None:
    gen = gen_dir(run_root)
    agent.start_ranks(
        gen, [launch(0, "i=0; while [ $i -lt 500 ]; do echo line-$i; i=$((i+1)); done", tmp_path)]
    )
    poll_until(agent, gen, [0], lambda s: s.ranks[0].exit is not None)
    tail = agent.log_tail(gen, 0, 100)
    assert len(tail) == 100 and tail.endswith("line-499\n")
    assert agent.log_tail(gen, 7) == ""


# --- stop -------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_stop_terms_then_kills_stopped_and_stubborn_ranks(
    agent: LocalShimAgent, run_root: Path, tmp_path: Path
) -> None:
    gen = gen_dir(run_root)
    started = agent.start_ranks(
        gen,
        [
            launch(0, "exec sleep 30", tmp_path),
            launch(1, "exec sleep 30", tmp_path),
            # Ignores SIGTERM, and so does its child: only SIGKILL ends this group.
            launch(2, "trap '' TERM; sleep 30 & wait", tmp_path),
        ],
    )
    os.kill(started[1].pid, signal.SIGSTOP)
    poll_until(agent, gen, [1], lambda s: s.ranks[0].stopped)
    Path(gen, "rank-0.heartbeat.json").write_text('{"step": 41, "time": 1.0}')
    Path(gen, "rank-2.heartbeat.json").write_text('{"step": 42, "time": 1.0}')
    # A newer generation that must be kept.
    keep = gen_dir(run_root, 2)
    (kept,) = agent.start_ranks(keep, [launch(0, "exec sleep 30", tmp_path)])
    # A writer killed between its write and its rename leaves a temporary file:
    # swept where the generation is dead, kept where a writer may still rename it.
    dead_writer = Path(gen, f".rank-1.exit.json.999{TEMP_SUFFIX}")
    live_writer = Path(keep, f".rank-0.heartbeat.json.999{TEMP_SUFFIX}")
    dead_writer.write_text("{")
    live_writer.write_text("{")

    before = time.monotonic()
    result = agent.stop(str(run_root), 2, 1.0)
    took = time.monotonic() - before
    assert result.reachable and result.error is None
    assert result.signalled_groups == 3
    assert result.killed_groups == 1
    assert result.generations == [1]
    assert result.last_step == 42
    assert took >= 1.0  # the grace was given
    assert not dead_writer.exists() and live_writer.exists()
    for rank in started:
        assert group_members(rank.pgid) == [], f"group {rank.pgid} survived"
    stopped = json.loads(Path(gen, "stopped.json").read_text())
    assert stopped["reason"] == "stopped"
    assert alive(kept.pid) and not Path(keep, "stopped.json").exists()
    status = agent.poll(gen, [0, 1, 2])
    assert status.ranks[0].exit and status.ranks[0].exit["signal"] == "SIGTERM"
    assert status.ranks[1].exit and status.ranks[1].exit["signal"] == "SIGTERM"

    again = agent.stop(str(run_root), 2, 1.0)
    assert (again.signalled_groups, again.killed_groups, again.generations) == (0, 0, [])
    assert again.last_step is None

    everything = agent.stop(str(run_root), None, 5.0)
    assert everything.generations == [2] and not alive(kept.pid)


@pytest.mark.timeout(60)
def test_stop_never_signals_a_group_that_is_not_ours(agent: LocalShimAgent, run_root: Path) -> None:
    # A pid file from long ago whose pgid now leads somebody else's session.
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        gen = Path(gen_dir(run_root))
        gen.mkdir()
        (gen / "rank-0.pid").write_text(
            json.dumps(
                {
                    "pid": stranger.pid,
                    "pgid": stranger.pid,
                    "wrapper_pid": stranger.pid,
                    "wrapper_start_ticks": 1,
                    "start_ticks": 1,
                }
            )
        )
        result = agent.stop(str(run_root), None, 0.5)
        assert result.signalled_groups == 0
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.timeout(60)
def test_stop_with_spaces_and_no_generations(agent: LocalShimAgent, tmp_path: Path) -> None:
    root = tmp_path / "run root with spaces" / "job"
    assert agent.stop(str(root), None, 0.5).generations == []
    gen = str(root / "gen-00003")
    (started,) = agent.start_ranks(gen, [launch(0, "exec sleep 30", tmp_path)])
    try:
        result = agent.stop(str(root), None, 2.0)
        assert result.generations == [3] and not alive(started.pid)
    finally:
        kill_leftovers(root)


# --- injection and escaping -----------------------------------------------------------------

NASTY = [
    "$(touch {m}-subst)",
    "`touch {m}-backtick`",
    "; touch {m}-semicolon",
    "' ; touch {m}-quote ; '",
    '" ; touch {m}-dquote ; "',
    "\n touch {m}-newline \n",
    "$HOME ${{PATH}} \\ \\n \\\\ %s %d",
    "-n",
    "--",
    "",
    " lead and trail ",
]


@pytest.mark.timeout(60)
def test_spec_values_never_run_as_shell(
    agent: LocalShimAgent, run_root: Path, tmp_path: Path
) -> None:
    marker = str(tmp_path / "pwned")
    values = [v.format(m=marker) for v in NASTY]
    env = {f"V{i}": value for i, value in enumerate(values)}
    dump = (
        "import json, os, sys; "
        "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, open('out.json', 'w'))"
    )
    workdir = tmp_path / "work dir $(touch x) `y`"
    workdir.mkdir()
    gen = str(run_root / "gen-00001")
    agent.start_ranks(
        gen,
        [
            RankLaunch(
                rank=0,
                command=[sys.executable, "-c", dump, *values],
                env=env,
                workdir=str(workdir),
            )
        ],
    )
    poll_until(agent, gen, [0], lambda s: s.ranks[0].exit is not None)
    seen = json.loads((workdir / "out.json").read_text())
    assert seen["argv"] == values
    extra = set(seen["env"]) - set(env)
    # LC_CTYPE: Python's own coercion; PATH: the node's own, given to a rank whose
    # environment sets none (issue 39), nothing else of the shim's environment.
    assert extra <= {"LC_CTYPE", "PATH"}, f"env -i leaked {extra}"
    assert {k: seen["env"][k] for k in env} == env

    control = tmp_path / "ctl" / "control.json"
    agent.write_file(str(control), "".join(values))
    assert control.read_text() == "".join(values)
    agent.preflight(
        PreflightRequest(
            interpreter=values[0],
            workdir=values[1],
            disk_path=values[2],
            health_command=["echo", *values],
        )
    )
    agent.log_tail(values[3], 0)
    agent.poll(values[4], [0])
    agent.stop(str(tmp_path / values[5].strip()), None, 0.0)
    assert list(tmp_path.glob("pwned*")) == []
    assert not Path("x").exists() and not (workdir / "x").exists()


@pytest.mark.timeout(60)
def test_json_escaping_round_trips_nasty_strings(agent: LocalShimAgent) -> None:
    strings = [
        "plain",
        "",
        'quote " and backslash \\ and both \\"',
        "tab\there\rcr\x08bs\x0cff",
        "".join(chr(c) for c in range(1, 128)),
        "trailing newlines\n\n\n",
        "\n",
        "unicode é 漢字 🙂",
        "looks escaped \\n \\u0000 \\t",
        "ends with a dot.",
        "ansi \x1b[31mred\x1b[0m and \x7f",
        "x" * 5000 + '"' * 100,
    ]
    reply = agent._call([["json-escape", *strings]], 10.0)
    lines = reply.output.decode().split("\n")
    assert lines[-1] == ""
    decoded = [json.loads(line) for line in lines[:-1]]
    assert decoded == strings


def test_start_call_puts_the_environment_on_stdin_not_in_arguments() -> None:
    call = start_call(
        "/run/gen-00001",
        RankLaunch(
            rank=0,
            command=["python", "t.py"],
            env={"B": "2", "A": "x=y 'q'"},
            workdir="/w",
            env_file="/w/secrets.env",
        ),
    )
    assert call.argv == [
        "start",
        "/run/gen-00001",
        "0",
        "/w",
        "--env-file",
        "/w/secrets.env",
        "--",
        "python",
        "t.py",
    ]
    assert call.stdin == "A='x=y '\"'\"'q'\"'\"''\nB=2\n"
    with pytest.raises(ValueError):
        start_call("/g", RankLaunch(rank=0, command=["x"], env={"A=B": "1"}, workdir="/"))
    with pytest.raises(ValueError):
        start_call("/g", RankLaunch(rank=0, command=["x"], env={"A-B": "1"}, workdir="/"))
    script = shim_script([call]).decode()
    assert "x=y" not in script.split("<<", 1)[0].rsplit("\n", 2)[-1]


def test_json_lines_separates_noise() -> None:
    records, noise = json_lines(b'{"a": 1}\nsh: warning\n{"b": [2]}\n{broken\n')
    assert records == [{"a": 1}, {"b": [2]}]
    assert noise == ["sh: warning", "{broken"]


# --- preflight ----------------------------------------------------------------------------------

A100_ECC = """
==============NVSMI LOG==============

Attached GPUs                             : 1
GPU 00000000:07:00.0
    Product Name                          : NVIDIA A100-SXM4-80GB
    ECC Errors
        Volatile
            SRAM Correctable              : 0
            SRAM Uncorrectable            : 0
            DRAM Correctable              : 3
            DRAM Uncorrectable            : 2
        Aggregate
            SRAM Correctable              : 0
            SRAM Uncorrectable            : 0
            DRAM Correctable              : 9
            DRAM Uncorrectable            : 7
"""


@pytest.mark.timeout(60)
def test_preflight_checks(agent: LocalShimAgent, tmp_path: Path) -> None:
    ok = agent.preflight(
        PreflightRequest(
            interpreter="sh",
            workdir=str(tmp_path),
            disk_path=str(tmp_path / "not" / "yet" / "there"),
            health_command=["sh", "-c", 'echo "healthy: $LAZARUS_NODE"'],
        )
    )
    assert ok.ok, ok.problems
    assert ok.free_disk_gb is not None and ok.free_disk_gb > 0
    assert ok.gpus is None and ok.node == "n1"

    bad = agent.preflight(
        PreflightRequest(
            interpreter="no-such-interpreter-xyz",
            workdir=str(tmp_path / "missing"),
            disk_path=str(tmp_path),
            min_free_disk_gb=1e9,
            health_command=["sh", "-c", "echo first; echo 'last line \"quoted\"'; exit 4"],
        )
    )
    assert not bad.ok
    problems = "\n".join(bad.problems)
    assert "no-such-interpreter-xyz" in problems
    assert "workdir" in problems and "missing" in problems
    assert "disk:" in problems
    assert 'exited 4 on node n1: last line "quoted"' in problems

    sample = tmp_path / "smi.txt"
    sample.write_text(A100_ECC)
    gpu = agent.preflight(
        PreflightRequest(
            interpreter="sh",
            workdir=str(tmp_path),
            disk_path=str(tmp_path),
            health_command=["cat", str(sample)],
        )
    )
    assert gpu.gpus is not None
    assert (gpu.gpus.count, gpu.gpus.ecc_errors, gpu.gpus.xid_errors) == (1, 2, 0)
    assert any("ECC" in p for p in gpu.problems)


@pytest.mark.timeout(60)
def test_preflight_health_command_timeout(agent: LocalShimAgent, tmp_path: Path) -> None:
    if shutil.which("timeout") is None:
        pytest.skip("coreutils timeout not installed")
    before = time.monotonic()
    result = agent.preflight(
        PreflightRequest(
            interpreter="sh",
            workdir=str(tmp_path),
            disk_path=str(tmp_path),
            health_command=["sleep", "30"],
            timeout_s=1.0,
        )
    )
    assert time.monotonic() - before < 10
    assert any("timed out" in p for p in result.problems)


# --- transport failures ---------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_unrunnable_transport_is_unreachable(tmp_path: Path) -> None:
    node = LocalShimAgent(NodeSpec(name="ghost"), shell=str(tmp_path / "no-shell"))
    status = node.poll(str(tmp_path), [0])
    assert not status.reachable and status.error and "ghost" in status.error
    assert not node.stop(str(tmp_path), None, 0.0).reachable
    with pytest.raises(NodeUnreachable):
        node.start_ranks(str(tmp_path / "gen-00001"), [launch(0, "true", tmp_path)])


@pytest.mark.timeout(30)
def test_poll_round_trip_is_fast(agent: LocalShimAgent, run_root: Path, tmp_path: Path) -> None:
    gen = gen_dir(run_root)
    agent.start_ranks(gen, [launch(r, "exec sleep 30", tmp_path) for r in range(4)])
    times = []
    for _ in range(20):
        before = time.monotonic()
        status = agent.poll(gen, [0, 1, 2, 3])
        times.append(time.monotonic() - before)
        assert all(r.alive for r in status.ranks)
    times.sort()
    median = times[len(times) // 2]
    print(f"local shim poll of 4 ranks: median {median * 1000:.1f} ms")
    assert median < 0.5


# --- secrets travel through pipes, never through an argv (issue 10, defect 13) --------------


def _all_cmdlines() -> list[tuple[int, bytes]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            found.append((int(entry.name), _cmdline(entry)))
    return found


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shell", SHELLS)
def test_rank_environment_never_appears_in_any_cmdline(
    shell: str, run_root: Path, tmp_path: Path
) -> None:
    """Every user can read /proc/PID/cmdline: the env once sat in the wrapper's argv for
    the rank's whole life. Sampled all through the launch and while the rank runs."""
    secret = f"sekrit-{uuid.uuid4().hex}"
    big = f"big-{uuid.uuid4().hex}" + "x" * 70_000  # beyond a pipe's buffer
    agent = LocalShimAgent(NodeSpec(name="n1"), shell=shell)
    seen: list[tuple[int, bytes]] = []
    launching = True

    def sample() -> None:
        while launching:
            seen.extend((pid, line) for pid, line in _all_cmdlines() if secret.encode() in line)
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    gen = gen_dir(run_root)
    out = tmp_path / "env.json"
    dump = (
        "import json, os, sys, time\n"
        "with open(sys.argv[1] + '.tmp', 'w') as f: json.dump(dict(os.environ), f)\n"
        "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
        "time.sleep(30)\n"
    )
    try:
        agent.start_ranks(
            gen,
            [
                RankLaunch(
                    rank=0,
                    command=[sys.executable, "-c", dump, str(out)],
                    env={"PATH": os.environ["PATH"], "WANDB_API_KEY": secret, "BIG": big},
                    workdir=str(tmp_path),
                )
            ],
        )
        env = wait_for(lambda: out.exists() and json.loads(out.read_text()), what="env")
    finally:
        launching = False
        sampler.join()
    try:
        assert env["WANDB_API_KEY"] == secret and env["BIG"] == big
        leaks = [(pid, line) for pid, line in _all_cmdlines() if secret.encode() in line]
        assert not leaks and not seen, (
            f"secret in the argv of {sorted({p for p, _ in seen + leaks})}"
        )
        run_files = [p for p in Path(gen).iterdir() if p.is_file()]
        assert not [p for p in run_files if secret in p.read_text(errors="replace")]
    finally:
        agent.stop(str(run_root), None, 0.0)
        agent.close()


def _env_file(tmp_path: Path, text: str, mode: int) -> Path:
    path = tmp_path / "secrets.env"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.timeout(60)
def test_env_from_file_is_read_on_the_node_below_env_and_lazarus(
    agent: LocalShimAgent, run_root: Path, tmp_path: Path
) -> None:
    from activities.nodes.secret_env import read_env_file

    text = "# comment\n\nHF_TOKEN=hf 'quoted' $HOME \\n\nSHARED=from file\nEMPTY=\nEQ=a=b\n"
    secrets_file = _env_file(tmp_path, text, 0o600)
    out = tmp_path / "env.json"
    dump = f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w'))"
    gen = gen_dir(run_root)
    agent.start_ranks(
        gen,
        [
            RankLaunch(
                rank=0,
                command=[sys.executable, "-c", dump],
                env={"PATH": os.environ["PATH"], "SHARED": "from env"},
                workdir=str(tmp_path),
                env_file=str(secrets_file),
            )
        ],
    )
    poll_until(agent, gen, [0], lambda s: s.ranks[0].exit is not None)
    env = json.loads(out.read_text())
    assert env["HF_TOKEN"] == "hf 'quoted' $HOME \\n"
    assert env["EMPTY"] == "" and env["EQ"] == "a=b" and env["SHARED"] == "from env"
    # The worker's reader (local nodes) parses the same format the same way.
    local = read_env_file(str(secrets_file))
    assert {k: env[k] for k in local if k != "SHARED"} == {
        k: v for k, v in local.items() if k != "SHARED"
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("text", "mode", "expected"),
    [
        ("HF_TOKEN=abc\n", 0o640, "is readable or writable by group or others"),
        ("HF_TOKEN=abc\n", 0o604, "chmod 600"),
        ("HF_TOKEN=abc\nexport SECRET=hunter2\n", 0o600, "line 2: expected KEY=VALUE"),
        ("hunter2\n", 0o600, "line 1: expected KEY=VALUE"),
    ],
)
def test_env_from_file_refused_at_launch_naming_the_file(
    agent: LocalShimAgent, run_root: Path, tmp_path: Path, text: str, mode: int, expected: str
) -> None:
    secrets_file = _env_file(tmp_path, text, mode)
    launch_one = launch(0, "exit 0", tmp_path).model_copy(update={"env_file": str(secrets_file)})
    with pytest.raises(ShimError) as caught:
        agent.start_ranks(gen_dir(run_root), [launch_one])
    message = str(caught.value)
    assert f"env_from_file: {secrets_file}" in message and expected in message
    assert "hunter2" not in message and "abc" not in message
    assert not (Path(gen_dir(run_root)) / "rank-0.pid").exists()
    missing = launch_one.model_copy(update={"env_file": str(tmp_path / "nope.env")})
    with pytest.raises(ShimError, match=r"nope\.env does not exist on the node"):
        agent.start_ranks(gen_dir(run_root), [missing])
