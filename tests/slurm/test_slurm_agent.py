"""The Slurm launcher against a real Slurm on this machine (nodes n1..n3, one host).

Each generation is one job step per node in a holder allocation; these tests check
what the workflow will build on: the steps run the real DDP example to the end, a
SIGKILLed rank's exit is recorded with its signal, a stop leaves no step and no
process, a node whose slurmd died reads as lost, the stop of the live nodes does not
wait for a dead one, and drain/undrain work (we are root: Slurm admin)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from activities.launcher import launch_generation
from activities.nodes.agent import NodeUnreachable, PreflightRequest
from activities.nodes.node_records import RankLaunch
from activities.nodes.procfs import is_alive
from activities.nodes.rundir import GenerationDir, read_json
from activities.nodes.slurm.agent import SlurmAgent
from activities.nodes.slurm.commands import job_steps, node_states, run_slurm
from activities.nodes.slurm.rounds import QUERY_INTERVAL_S, SlurmRounds
from infra.slurm import TestSlurm
from lazarus.domain.contracts import LaunchRequest, LaunchResult
from lazarus.domain.spec import JobSpec, NodeSpec, SlurmSpec, WarmStartSpec, parse_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"
HOST = socket.gethostname().split(".")[0]
SLEEPER = """\
import os, sys, time
open(os.path.join(sys.argv[1], "ready-" + os.environ["RANK"]), "w").close()
time.sleep(600)
"""
ENV_DUMP = """\
import json, os, sys
with open(os.path.join(sys.argv[1], "env-" + os.environ["RANK"] + ".json"), "w") as out:
    json.dump(dict(os.environ), out)
"""


SUPERVISED_S = 20.0
"""The counted stretch of supervision in the call-rate test."""


def slurm_spec(tmp_path: Path, job: int, command: list[str], name: str) -> JobSpec:
    return parse_spec(
        {
            "name": name,
            "command": command,
            "nodes": [{"name": node, "launcher": "slurm", "host": HOST} for node in ("n1", "n2")],
            "spares": [{"name": "n3", "launcher": "slurm", "host": HOST}],
            "slurm": {"job_id": job},
            "nproc_per_node": 1,
            "checkpoint_dir": "ckpt",
        },
        "<test>",
    ).resolved(tmp_path)


def run_root(spec: JobSpec) -> str:
    return str(Path(spec.run_dir) / spec.job_id / "run-1")


def agents_of(spec: JobSpec) -> list[SlurmAgent]:
    return [SlurmAgent(node, spec.slurm) for node in spec.nodes]


def wait_for(what: str, check: Callable[[], bool], timeout_s: float) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.1)
    return time.monotonic() - started


def step_of(launched: LaunchResult) -> str:
    record = read_json(GenerationDir(Path(launched.run_dir)).pid_file(0))
    assert record is not None
    return str(record["slurm_step"])


def step_listed(step: str) -> bool:
    steps = job_steps(step.split(".")[0])
    return steps is None or step in steps


@pytest.fixture
def stopper() -> Iterator[list[tuple[JobSpec, str]]]:
    """Runs to stop at teardown whatever a failed assertion left running."""
    started: list[tuple[JobSpec, str]] = []
    yield started
    for spec, root in started:
        for agent in agents_of(spec):
            agent.stop(root, None, grace_s=0.0, kill_wait_s=20.0)


def launch(spec: JobSpec, stopper: list[tuple[JobSpec, str]]) -> LaunchResult:
    stopper.append((spec, run_root(spec)))
    return launch_generation(LaunchRequest(spec=spec, generation=1, run_root=run_root(spec)))


@pytest.mark.timeout(180)
def test_cluster_comes_up_and_goes_down_cleanly(own_slurm: Callable[[], TestSlurm]) -> None:
    cluster = own_slurm()
    assert cluster.node_states() == {"n1": "idle", "n2": "idle", "n3": "idle"}
    done = cluster.command("srun", "-N", "3", "sh", "-c", "echo $SLURMD_NODENAME")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == ["n1", "n2", "n3"]
    assert cluster.leftovers(), "the marker finds the running daemons"
    cluster.stop()
    assert cluster.leftovers() == []
    cluster.stop()  # idempotent


@pytest.mark.timeout(300)
def test_ddp_step_runs_to_completion(
    slurm: TestSlurm, allocation: int, tmp_path: Path, stopper: list[tuple[JobSpec, str]]
) -> None:
    command = [sys.executable, str(EXAMPLE), "--steps", "12", "--step-time", "0.02"]
    command += ["--ckpt-every", "5", "--out", str(tmp_path / "final.pt")]
    spec = slurm_spec(tmp_path, allocation, command, "slurm-ddp")
    began = time.monotonic()
    launched = launch(spec, stopper)
    launch_s = time.monotonic() - began
    assert [(r.rank, r.node) for r in launched.ranks] == [(0, "n1"), (1, "n2")]
    gen = GenerationDir(Path(launched.run_dir))
    step = step_of(launched)
    assert step.startswith(f"{allocation}.")

    wait_for("both exit files", lambda: all(gen.exit_file(r).exists() for r in (0, 1)), 240)
    for rank in (0, 1):
        record = read_json(gen.exit_file(rank))
        assert record is not None and record["exit_code"] == 0, gen.log_file(rank).read_text()
    assert (tmp_path / "final.pt").exists()
    assert "step 12 " in gen.log_file(0).read_text()
    wait_for("the step to end", lambda: not step_listed(step), 60)
    status = [
        agent.poll(str(gen.path), [r.rank])
        for agent, r in zip(agents_of(spec), launched.ranks, strict=True)
    ]
    assert all(s.reachable for s in status)
    assert [r.alive for s in status for r in s.ranks] == [False, False]
    print(f"step launch latency (launch call until every pid file): {launch_s:.2f} s")


@pytest.mark.timeout(240)
def test_step_environment_is_the_generations_not_the_workers(
    slurm: TestSlurm,
    allocation: int,
    tmp_path: Path,
    stopper: list[tuple[JobSpec, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = tmp_path / "dump.py"
    script.write_text(ENV_DUMP)
    # The worker itself may run inside some allocation: none of it may leak.
    monkeypatch.setenv("SLURM_JOB_ID", "999999")
    monkeypatch.setenv("SLURM_NODELIST", "elsewhere[1-9]")
    spec = slurm_spec(
        tmp_path, allocation, [sys.executable, str(script), str(tmp_path)], "slurm-env"
    )
    launched = launch(spec, stopper)
    gen = GenerationDir(Path(launched.run_dir))
    wait_for("env dumps", lambda: all((tmp_path / f"env-{r}.json").exists() for r in (0, 1)), 120)
    for rank, node in ((0, "n1"), (1, "n2")):
        env = json.loads((tmp_path / f"env-{rank}.json").read_text())
        assert env["RANK"] == str(rank) and env["GROUP_RANK"] == str(rank)
        assert env["LAZARUS_NODE"] == node and env["SLURMD_NODENAME"] == node
        assert env["SLURM_JOB_ID"] == str(allocation)
        assert env["SLURM_NODELIST"] != "elsewhere[1-9]"
        assert env["MASTER_ADDR"] == HOST
        assert env["MASTER_PORT"] == str(launched.master_port)
        assert env["LAZARUS_HEARTBEAT_FILE"].endswith(f"rank-{rank}.heartbeat.json")
        # Each node's step numbered its task 0 of 1: the task rewrote Slurm's variables.
        assert env["SLURM_PROCID"] == env["RANK"] and env["SLURM_NODEID"] == str(rank)
        assert env["SLURM_LOCALID"] == env["LOCAL_RANK"] == "0"
        assert env["SLURM_NTASKS"] == "2" and env["SLURM_NNODES"] == "2"
        assert (
            env["SLURM_STEP_ID"] == str(read_json(gen.pid_file(rank))["slurm_step"]).split(".")[1]
        )


@pytest.mark.timeout(240)
def test_the_polls_ask_slurm_once_for_all_nodes_at_most_every_interval(
    slurm: TestSlurm, allocation: int, tmp_path: Path, stopper: list[tuple[JobSpec, str]]
) -> None:
    """Issue 29: one ``squeue`` and one ``scontrol`` for the whole job (here against
    the real slurmctld) at most every query interval, every rank still seen alive,
    every node reachable; then a supervised stretch at the default poll interval,
    the preemption check included, counted: at most 1 command a second. Counts, not
    timings: each command runs at most once per interval, whatever the machine's
    speed."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    spec = slurm_spec(tmp_path, allocation, [sys.executable, str(script), str(tmp_path)], "rounds")
    launched = launch(spec, stopper)
    gen = GenerationDir(Path(launched.run_dir))
    wait_for("ranks ready", lambda: all((tmp_path / f"ready-{r}").exists() for r in (0, 1)), 120)
    calls: list[list[str]] = []

    def counted(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return run_slurm(argv)

    rounds = SlurmRounds(runner=counted)
    polled = [SlurmAgent(node, spec.slurm, rounds=rounds) for node in spec.nodes]

    def supervise_round() -> None:
        statuses = list(
            pool.map(
                lambda agent_rank: agent_rank[0].poll(str(gen.path), [agent_rank[1]]),
                zip(polled, (0, 1), strict=True),
            )
        )
        assert all(s.reachable for s in statuses), statuses
        assert [r.alive for s in statuses for r in s.ranks] == [True, True], statuses
        assert polled[0].preemption_notice(None, None) is None

    with ThreadPoolExecutor(len(polled)) as pool:
        for number in (1, 2, 3):
            supervise_round()
            assert [argv[0] for argv in calls].count("squeue") == number, calls
            assert [argv[0] for argv in calls].count("scontrol") == number, calls
            time.sleep(QUERY_INTERVAL_S + 0.1)
        assert {argv[-1] for argv in calls if argv[0] == "scontrol"} == {"n1,n2"}, calls
        calls.clear()
        started = time.monotonic()
        supervised = 0
        while time.monotonic() - started < SUPERVISED_S:
            supervise_round()
            supervised += 1
            time.sleep(0.5)  # health.poll_interval_s's default
        elapsed = time.monotonic() - started
    # Each of the two shared commands at most once per interval; no allocation state
    # asked while its steps show it running.
    assert len(calls) <= 2 * (elapsed // QUERY_INTERVAL_S + 1), calls
    assert not [argv for argv in calls if argv[0] == "squeue" and "--steps" not in argv], calls
    kinds = [argv[0] for argv in calls]
    print(
        f"2 nodes, real slurmctld: {supervised} rounds, {kinds.count('squeue')} squeue "
        f"--steps + {kinds.count('scontrol')} scontrol = {len(calls)} Slurm commands in "
        f"{elapsed:.1f} s of supervision = {len(calls) / elapsed:.2f}/s"
    )
    # A node Slurm does not know costs the batch nothing but its own line.
    assert set(node_states(["n1", "nosuchnode", "n2"])) == {"n1", "n2"}


@pytest.mark.timeout(300)
def test_sigkilled_rank_is_recorded_and_its_peer_too(
    slurm: TestSlurm, allocation: int, tmp_path: Path, stopper: list[tuple[JobSpec, str]]
) -> None:
    command = [sys.executable, str(EXAMPLE), "--steps", "100000", "--step-time", "0.05"]
    command += ["--pg-timeout-s", "30"]
    spec = slurm_spec(tmp_path, allocation, command, "slurm-kill")
    launched = launch(spec, stopper)
    gen = GenerationDir(Path(launched.run_dir))
    wait_for(
        "training steps", lambda: "step 3 " in gen.log_file(0).read_text(errors="replace"), 180
    )
    victim = launched.ranks[1]
    os.kill(victim.pid, signal.SIGKILL)
    wait_for("the victim's exit file", lambda: gen.exit_file(1).exists(), 30)
    record = read_json(gen.exit_file(1))
    assert record is not None and record["signal"] == "SIGKILL" and record["exit_code"] == -9
    # The peer fails in its next collective (gloo sees the connection drop).
    wait_for("the peer's exit file", lambda: gen.exit_file(0).exists(), 120)
    peer = read_json(gen.exit_file(0))
    assert peer is not None and peer["exit_code"] != 0
    step = step_of(launched)
    wait_for("the step to end", lambda: not step_listed(step), 60)


@pytest.mark.timeout(240)
def test_stop_cancels_the_step_and_leaves_no_process(
    slurm: TestSlurm, allocation: int, tmp_path: Path, stopper: list[tuple[JobSpec, str]]
) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    spec = slurm_spec(
        tmp_path, allocation, [sys.executable, str(script), str(tmp_path)], "slurm-stop"
    )
    launched = launch(spec, stopper)
    gen = GenerationDir(Path(launched.run_dir))
    wait_for("ranks ready", lambda: all((tmp_path / f"ready-{r}").exists() for r in (0, 1)), 120)
    step = step_of(launched)
    assert step_listed(step)
    wrappers = [read_json(gen.pid_file(r.rank)) for r in launched.ranks]

    steps = [str(w["slurm_step"]) for w in wrappers if w is not None]
    assert len(set(steps)) == 2, steps  # one step per node
    results = [agent.stop(run_root(spec), None, grace_s=10.0) for agent in agents_of(spec)]
    for result in results:
        assert result.reachable and result.generations == [1]
        assert result.signalled_groups == 1 and result.unkillable == []
    assert not any(step_listed(s) for s in steps)
    for rank, wrapper in zip(launched.ranks, wrappers, strict=True):
        assert wrapper is not None
        assert not is_alive(rank.pid, rank.start_ticks)
        assert not is_alive(int(wrapper["wrapper_pid"]), int(wrapper["wrapper_start_ticks"]))
        record = read_json(gen.exit_file(rank.rank))
        assert record is not None and record["signal"] == "SIGTERM", record
    assert gen.stopped_file.exists()


@pytest.mark.timeout(240)
def test_stop_records_exits_of_a_killed_step(
    slurm: TestSlurm, allocation: int, tmp_path: Path, stopper: list[tuple[JobSpec, str]]
) -> None:
    stubborn = tmp_path / "stubborn.py"
    stubborn.write_text("import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + SLEEPER)
    spec = slurm_spec(
        tmp_path, allocation, [sys.executable, str(stubborn), str(tmp_path)], "slurm-kill9"
    )
    launched = launch(spec, stopper)
    gen = GenerationDir(Path(launched.run_dir))
    wait_for("ranks ready", lambda: all((tmp_path / f"ready-{r}").exists() for r in (0, 1)), 120)
    first, second = agents_of(spec)
    result = first.stop(run_root(spec), None, grace_s=1.0, kill_wait_s=30.0)
    assert result.killed_groups == 1 and result.unkillable == []
    assert not step_listed(step_of(launched))
    assert is_alive(launched.ranks[1].pid, launched.ranks[1].start_ticks), "n2's own step"
    second.stop(run_root(spec), None, grace_s=1.0, kill_wait_s=30.0)
    for rank in launched.ranks:
        assert not is_alive(rank.pid, rank.start_ticks)
        record = read_json(gen.exit_file(rank.rank))
        assert record is not None and record["signal"] == "SIGKILL", record


@pytest.mark.timeout(240)
def test_killed_slurmd_reads_as_node_lost(
    own_slurm: Callable[[], TestSlurm], tmp_path: Path
) -> None:
    cluster = own_slurm()
    job = cluster.allocate(3)
    agent = SlurmAgent(NodeSpec(name="n2", launcher="slurm"), SlurmSpec(job_id=job))
    gen = str(tmp_path / "gen-1")
    assert agent.poll(gen, []).reachable
    cluster.kill_slurmd("n2")
    # SlurmdTimeout is 10 s; the controller checks nodes on its own period.
    lost_after = wait_for("n2 lost", lambda: not agent.poll(gen, []).reachable, 120)
    status = agent.poll(gen, [])
    assert status.error is not None and "n2" in status.error
    assert "DOWN" in status.error or "NOT_RESPONDING" in status.error
    assert (
        SlurmAgent(NodeSpec(name="n1", launcher="slurm"), SlurmSpec(job_id=job))
        .poll(gen, [])
        .reachable
    )
    print(f"killed slurmd read as lost after {lost_after:.1f} s: {status.error}")


@pytest.mark.timeout(300)
def test_the_stop_of_live_nodes_does_not_wait_for_a_dead_one(
    own_slurm: Callable[..., TestSlurm], tmp_path: Path
) -> None:
    # Slurm's default SlurmdTimeout (300 s): Slurm never marks n2 DOWN in this test,
    # so whatever returns below returned without waiting for Slurm to give up on it.
    cluster = own_slurm(slurmd_timeout_s=300)
    job = cluster.allocate(3)
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    spec = slurm_spec(tmp_path, job, [sys.executable, str(script), str(tmp_path)], "slurm-loss")
    launched = launch(spec, [])
    gen = GenerationDir(Path(launched.run_dir))
    wait_for("ranks ready", lambda: all((tmp_path / f"ready-{r}").exists() for r in (0, 1)), 120)
    steps = [str((read_json(gen.pid_file(r)) or {})["slurm_step"]) for r in (0, 1)]
    dead = read_json(gen.pid_file(1)) or {}
    stepd = int(Path(f"/proc/{dead['wrapper_pid']}/stat").read_text().rsplit(")", 1)[1].split()[1])
    cluster.kill_slurmd("n2")
    for pid in (stepd, int(dead["wrapper_pid"]), int(dead["pid"])):
        os.kill(pid, signal.SIGKILL)

    live, lost = agents_of(spec)
    with ThreadPoolExecutor(2) as pool:  # as the stop activity: every node at once
        futures = [pool.submit(a.stop, run_root(spec), None, 10.0, 10.0) for a in (live, lost)]
        healthy, dead_node = (f.result() for f in futures)

    assert "DOWN" not in cluster.command("scontrol", "show", "node", "-o", "n2").stdout
    assert healthy.reachable and healthy.signalled_groups == 1 and healthy.unkillable == []
    assert not step_listed(steps[0])
    assert not is_alive(launched.ranks[0].pid, launched.ranks[0].start_ticks)
    record = read_json(gen.exit_file(0))
    assert record is not None and record["signal"] == "SIGTERM", record
    assert not dead_node.reachable and dead_node.generations == [1]
    assert dead_node.error is not None and "does not accept connections" in dead_node.error
    assert step_listed(steps[1]), "Slurm still lists the dead node's step"
    # The preflight finds it gone at once too, and drains it (fenced until resumed).
    with pytest.raises(NodeUnreachable, match="does not accept connections"):
        lost.preflight(
            PreflightRequest(
                interpreter=sys.executable, workdir=str(tmp_path), disk_path=str(tmp_path)
            )
        )
    drained = lost.drain_if_lost("node_lost", "job-a")
    assert drained is not None and drained.drained, drained


@pytest.mark.timeout(120)
def test_drain_and_undrain(slurm: TestSlurm, allocation: int) -> None:
    agent = SlurmAgent(NodeSpec(name="n3", launcher="slurm"), SlurmSpec(job_id=allocation))
    try:
        result = agent.drain("node_lost", "job-a")
        assert result.drained and result.error is None
        assert result.reason == "lazarus: node_lost in job-a"
        shown = slurm.command("scontrol", "show", "node", "-o", "n3").stdout
        assert "DRAIN" in shown and "Reason=lazarus: node_lost in job-a" in shown
        assert not agent.poll("/nonexistent", []).reachable
    finally:
        undone = agent.undrain()
    assert undone.error is None
    wait_for("n3 back", lambda: agent.poll("/nonexistent", []).reachable, 30)


@pytest.mark.timeout(120)
def test_drain_refused_is_returned_not_raised(slurm: TestSlurm, allocation: int) -> None:
    agent = SlurmAgent(NodeSpec(name="nosuchnode", launcher="slurm"), SlurmSpec(job_id=allocation))
    result = agent.drain("node_lost", "job-a")
    assert not result.drained and result.error is not None and "nosuchnode" in result.error


@pytest.mark.timeout(120)
def test_preflight_runs_on_the_node(slurm: TestSlurm, allocation: int, tmp_path: Path) -> None:
    agent = SlurmAgent(NodeSpec(name="n2", launcher="slurm"), SlurmSpec(job_id=allocation))
    good = agent.preflight(
        PreflightRequest(
            interpreter=sys.executable,
            workdir=str(tmp_path),
            disk_path=str(tmp_path),
            health_command=["sh", "-c", 'test "$LAZARUS_NODE" = n2'],
        )
    )
    assert good.ok, good.problems
    assert good.free_disk_gb is not None and good.free_disk_gb > 0
    bad = agent.preflight(
        PreflightRequest(
            interpreter="no-such-python",
            workdir=str(tmp_path / "missing"),
            disk_path=str(tmp_path),
            min_free_disk_gb=1e9,
        )
    )
    assert not bad.ok
    assert [p.split(":")[0] for p in bad.problems] == ["interpreter", "workdir", "disk"]


@pytest.mark.timeout(240)
def test_a_retried_start_adopts_the_step(
    slurm: TestSlurm, allocation: int, tmp_path: Path, stopper: list[tuple[JobSpec, str]]
) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    command = [sys.executable, str(script), str(tmp_path)]
    spec = slurm_spec(tmp_path, allocation, command, "slurm-adopt")
    launched = launch(spec, stopper)
    gen = GenerationDir(Path(launched.run_dir))
    agent = agents_of(spec)[1]
    again = agent.start_ranks(str(gen.path), [launch_of(spec, 1)])
    assert again[0].adopted and again[0].pid == launched.ranks[1].pid
    steps = job_steps(str(allocation)) or {}
    names = [name for name, _ in steps.values() if name.startswith("lazarus-g1-")]
    assert len(names) == len(set(names)), steps  # one step per generation directory


def launch_of(spec: JobSpec, rank: int) -> RankLaunch:
    return RankLaunch(rank=rank, command=spec.command, env={}, workdir=spec.workdir)


@pytest.mark.timeout(400)
def test_warm_ranks_fork_from_a_zygote_step_and_the_runs_end_cancels_it(
    slurm: TestSlurm, allocation: int, tmp_path: Path, stopper: list[tuple[JobSpec, str]]
) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    base = slurm_spec(tmp_path, allocation, [sys.executable, str(script), str(tmp_path)], "warm")
    spec = base.model_copy(update={"warm_start": WarmStartSpec(preload=["json"])})
    root = run_root(spec)
    stopper.append((spec, root))
    agents = agents_of(spec)

    def launched_warm(generation: int) -> GenerationDir:
        for old in tmp_path.glob("ready-*"):
            old.unlink()
        request = LaunchRequest(spec=spec, generation=generation, run_root=root)
        launched = launch_generation(request)
        assert launched.warm_start is not None, launched
        assert launched.warm_start.warm_ranks == [0, 1], launched.warm_start
        gen = GenerationDir(Path(launched.run_dir))
        ready = [tmp_path / f"ready-{r}" for r in (0, 1)]
        wait_for("ranks ready", lambda: all(r.exists() for r in ready), 120)
        for rank in (0, 1):
            record = read_json(gen.pid_file(rank)) or {}
            assert "slurm_step" not in record, record  # forked: no step of its own
        status = [a.poll(str(gen.path), [r]) for a, r in zip(agents, (0, 1), strict=True)]
        assert [r.alive for s in status for r in s.ranks] == [True, True], status
        return gen

    first = launched_warm(1)
    zygote_steps = [n for n, _ in (job_steps(str(allocation)) or {}).values() if "zygote" in n]
    assert len(zygote_steps) == 2, zygote_steps  # one per node
    # A crash: the relaunch stops the survivor by pid (not by step) and forks again.
    victim = read_json(first.pid_file(1)) or {}
    os.kill(int(victim["pid"]), signal.SIGKILL)
    wait_for("the crash recorded", lambda: first.exit_file(1).exists(), 60)
    results = [a.stop(root, None, grace_s=5.0) for a in agents]
    assert all(r.reachable and r.unkillable == [] for r in results), results
    survivor = read_json(first.pid_file(0)) or {}
    assert not is_alive(int(survivor["pid"]), int(survivor["start_ticks"]))
    second = launched_warm(2)
    assert sorted(n for n, _ in (job_steps(str(allocation)) or {}).values() if "zygote" in n) == (
        sorted(zygote_steps)
    ), "the same zygote steps serve the relaunch"

    for agent in agents:
        agent.stop(root, None, grace_s=5.0)
        agent.end_run(root, [])
    assert not [n for n, _ in (job_steps(str(allocation)) or {}).values() if "zygote" in n]
    for node in ("n1", "n2"):
        zygote = read_json(Path(root) / f".zygote-{node}" / f"slurm-srun-{node}.exit.json")
        assert zygote is not None, f"the zygote step's srun on {node} ended"
    for rank in (0, 1):
        record = read_json(second.pid_file(rank)) or {}
        assert not is_alive(int(record["pid"]), int(record["start_ticks"]))


@pytest.mark.timeout(400)
def test_a_spare_in_the_allocation_is_prewarmed_and_forks_its_first_ranks(
    slurm: TestSlurm, allocation: int, tmp_path: Path, stopper: list[tuple[JobSpec, str]]
) -> None:
    """Issue 28: the launch of generation 1 on n1 and n2 starts the zygote's step on
    the spare n3 too; generation 2 on n1 and n3 (n2 lost) forks n3's rank from it,
    and the run's end cancels every zygote step, the spare's included."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    base = slurm_spec(tmp_path, allocation, [sys.executable, str(script), str(tmp_path)], "spare")
    spec = base.model_copy(update={"warm_start": WarmStartSpec(preload=["json"])})
    root = run_root(spec)
    stopper.append((spec, root))
    n1, n2 = spec.nodes
    [n3] = spec.spares
    every = [SlurmAgent(node, spec.slurm) for node in (n1, n2, n3)]

    def zygote_steps() -> dict[str, str]:
        steps = job_steps(str(allocation)) or {}
        return {step: name for step, (name, _) in steps.items() if "zygote" in name}

    first = launch_generation(LaunchRequest(spec=spec, generation=1, run_root=root, prewarm=[n3]))
    assert first.warm_start is not None and first.warm_start.prewarmed == ["n3"], first
    assert {r.node for r in first.ranks} == {"n1", "n2"}
    wait_for(
        "the spare's zygote step",
        lambda: any(n.endswith("-n3") for n in zygote_steps().values()),
        60,
    )
    spare_step = [s for s, n in zygote_steps().items() if n.endswith("-n3")]
    results = [a.stop(root, None, grace_s=0.0) for a in every[:2]]
    assert all(r.reachable for r in results), results

    for old in tmp_path.glob("ready-*"):
        old.unlink()
    second = launch_generation(
        LaunchRequest(spec=spec, generation=2, run_root=root, nodes=[n1, n3])
    )
    assert second.warm_start is not None, second
    assert second.warm_start.warm_ranks == [0, 1], second.warm_start
    assert [s for s, n in zygote_steps().items() if n.endswith("-n3")] == spare_step
    gen = GenerationDir(Path(second.run_dir))
    record = read_json(gen.pid_file(1)) or {}
    assert "slurm_step" not in record, record  # forked by the spare's zygote

    for agent in every:
        agent.stop(root, None, grace_s=0.0)
        agent.end_run(root, [])
    assert zygote_steps() == {}
