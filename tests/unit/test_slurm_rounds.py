"""Slurm supervision asks slurmctld once per round for the whole job, not once per
node (:mod:`activities.nodes.slurm_rounds`), without hiding a step that just started
or one that ended. A fake command runner stands in for ``squeue``/``scontrol`` and
counts them; no Slurm needed."""

from __future__ import annotations

import json
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from activities.nodes.agent import NodeStatus
from activities.nodes.rundir import GenerationDir
from activities.nodes.slurm_agent import SlurmAgent
from activities.nodes.slurm_commands import SlurmCommandFailed
from activities.nodes.slurm_rounds import ROUND_TTL_S, SlurmRounds
from lazarus.domain.spec import NodeSpec, SlurmSpec

pytestmark = pytest.mark.timeout(60)

JOB = 7
NPROC = 2


class FakeSlurm:
    """``squeue --steps`` and ``scontrol show node -o`` answered from a dict; every
    command counted. Each command takes 1 ms of the fake monotonic clock."""

    def __init__(self) -> None:
        self.now = 100.0
        self.steps: dict[str, str] = {}
        """step id -> name."""
        self.states: dict[str, str] = {}
        """node -> State=..."""
        self.calls: list[list[str]] = []
        self._lock = threading.Lock()
        self.fail = False

    def clock(self) -> float:
        return self.now

    def run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        with self._lock:
            self.calls.append(argv)
            self.now += 0.001
        if self.fail:
            raise SlurmCommandFailed(f"{argv[0]}: no answer within 30 s")
        if argv[0] == "squeue":
            out = "".join(f"{s}|{n}|RUNNING|\n" for s, n in sorted(self.steps.items()))
            return subprocess.CompletedProcess(argv, 0, out, "")
        if argv[:3] == ["scontrol", "show", "node"]:
            wanted = argv[-1].split(",")
            out = "".join(
                f"NodeName={n} Arch=x86_64 NodeAddr={n} State={self.states[n]} Weight=1\n"
                for n in wanted
                if n in self.states
            )
            missing = [n for n in wanted if n not in self.states]
            err = "".join(f"Node {n} not found\n" for n in missing)
            return subprocess.CompletedProcess(argv, 1 if missing else 0, out, err)
        raise AssertionError(f"unexpected command {argv}")

    def count(self, command: str) -> int:
        return sum(1 for argv in self.calls if argv[0] == command)


def generation(tmp_path: Path, slurm: FakeSlurm, nodes: int) -> tuple[GenerationDir, list[str]]:
    """A running generation of ``nodes`` nodes, one step each, every rank's pid file."""
    gen = GenerationDir.of(tmp_path / "run", 1)
    gen.path.mkdir(parents=True)
    names = [f"n{i}" for i in range(nodes)]
    gen.plan_file.write_text(json.dumps({"nodes": names, "nproc_per_node": NPROC}))
    for index, name in enumerate(names):
        start_step(gen, slurm, index, name)
        slurm.states[name] = "ALLOCATED"
    return gen, names


def start_step(gen: GenerationDir, slurm: FakeSlurm, index: int, name: str) -> None:
    slurm.steps[f"{JOB}.{index}"] = f"lazarus-g1-x-{name}"
    for rank in range(index * NPROC, (index + 1) * NPROC):
        gen.pid_file(rank).write_text(
            json.dumps(
                {"rank": rank, "pid": 1000 + rank, "pgid": 1000 + rank, "start_ticks": 1}
                | {"slurm_step": f"{JOB}.{index}", "slurm_node": name}
            )
        )


def agents(names: list[str], rounds: SlurmRounds) -> list[SlurmAgent]:
    slurm = SlurmSpec(job_id=JOB)
    return [SlurmAgent(NodeSpec(name=n, launcher="slurm"), slurm, rounds=rounds) for n in names]


def poll_round(
    gen: GenerationDir, polled: list[SlurmAgent], threads: bool = True
) -> list[NodeStatus]:
    """One supervision round: every node polled at once, as the observer does."""

    def poll(index_agent: tuple[int, SlurmAgent]) -> NodeStatus:
        index, agent = index_agent
        ranks = list(range(index * NPROC, (index + 1) * NPROC))
        return agent.poll(str(gen.path), ranks)

    if not threads:
        return [poll(item) for item in enumerate(polled)]
    with ThreadPoolExecutor(max_workers=len(polled)) as pool:
        return list(pool.map(poll, enumerate(polled)))


@pytest.mark.parametrize("nodes", [1, 4, 64])
@pytest.mark.parametrize("threads", [True, False])
def test_one_squeue_and_one_scontrol_per_round_for_all_the_nodes(
    tmp_path: Path, nodes: int, threads: bool
) -> None:
    slurm = FakeSlurm()
    gen, names = generation(tmp_path, slurm, nodes)
    polled = agents(names, SlurmRounds(runner=slurm.run, clock=slurm.clock))
    for round_number in (1, 2, 3):
        statuses = poll_round(gen, polled, threads)
        assert all(s.reachable for s in statuses)
        assert all(r.alive for s in statuses for r in s.ranks)
        assert slurm.count("squeue") == round_number, slurm.calls
        assert slurm.count("scontrol") == round_number, slurm.calls
        slurm.now += 0.5  # the next round, one default poll interval later


def test_without_sharing_each_node_costs_two_commands(tmp_path: Path) -> None:
    """The behaviour before issue 29 (every answer too old to share): 2 per node."""
    slurm = FakeSlurm()
    gen, names = generation(tmp_path, slurm, 8)
    polled = agents(names, SlurmRounds(ttl_s=0.0, runner=slurm.run, clock=slurm.clock))
    poll_round(gen, polled, threads=False)
    assert slurm.count("squeue") == 8 and slurm.count("scontrol") == 8


def test_a_step_started_after_the_shared_answer_is_not_called_dead(tmp_path: Path) -> None:
    slurm = FakeSlurm()
    gen, _ = generation(tmp_path, slurm, 1)
    rounds = SlurmRounds(runner=slurm.run, clock=slurm.clock)
    first, second = agents(["n0", "n1"], rounds)
    assert all(r.alive for r in first.poll(str(gen.path), [0, 1]).ranks)
    # n1's step starts now: its pid files appear after the answer n0's poll got.
    slurm.states["n1"] = "ALLOCATED"
    start_step(gen, slurm, 1, "n1")
    status = second.poll(str(gen.path), [2, 3])
    assert all(r.alive for r in status.ranks), status
    assert slurm.count("squeue") == 2, "asked again, once, for the answer too old to judge"


def test_a_step_gone_without_an_exit_reads_dead_at_the_next_round(tmp_path: Path) -> None:
    slurm = FakeSlurm()
    gen, names = generation(tmp_path, slurm, 2)
    polled = agents(names, SlurmRounds(runner=slurm.run, clock=slurm.clock))
    poll_round(gen, polled)
    del slurm.steps[f"{JOB}.1"]  # n1's step vanished (SIGKILLed node): no exit file
    slurm.now += ROUND_TTL_S + 0.01
    statuses = poll_round(gen, polled)
    assert [r.alive for r in statuses[0].ranks] == [True, True]
    assert [r.alive for r in statuses[1].ranks] == [False, False]


def test_a_lost_node_reads_lost_from_the_shared_answer(tmp_path: Path) -> None:
    slurm = FakeSlurm()
    gen, names = generation(tmp_path, slurm, 3)
    slurm.states["n2"] = "IDLE+DRAIN"
    statuses = poll_round(gen, agents(names, SlurmRounds(runner=slurm.run, clock=slurm.clock)))
    assert [s.reachable for s in statuses] == [True, True, False]
    assert statuses[2].declared_lost and "DRAIN" in (statuses[2].error or "")
    assert slurm.count("scontrol") == 1


def test_a_node_slurm_does_not_list_is_asked_alone(tmp_path: Path) -> None:
    slurm = FakeSlurm()
    gen, names = generation(tmp_path, slurm, 2)
    del slurm.states["n1"]
    statuses = poll_round(gen, agents(names, SlurmRounds(runner=slurm.run, clock=slurm.clock)))
    # Its own scontrol failed: Slurm cannot say, which is not the node's fault.
    assert [s.reachable for s in statuses] == [True, True]
    scontrols = [argv[-1] for argv in slurm.calls if argv[0] == "scontrol"]
    assert scontrols == ["n0,n1", "n1"]


def test_slurm_unreachable_is_shared_and_asked_again(tmp_path: Path) -> None:
    slurm = FakeSlurm()
    gen, names = generation(tmp_path, slurm, 4)
    rounds = SlurmRounds(runner=slurm.run, clock=slurm.clock)
    slurm.fail = True
    statuses = poll_round(gen, agents(names, rounds), threads=False)
    # Not the nodes' fault, not the ranks' deaths: as before, nothing is judged.
    assert all(s.reachable and all(r.alive for r in s.ranks) for s in statuses)
    slurm.fail = False
    before = slurm.count("scontrol")
    poll_round(gen, agents(names, rounds))  # within the TTL of the failed one
    assert slurm.count("scontrol") == before + 1, "a failed answer is not reused"


def test_forget_makes_the_next_poll_ask(tmp_path: Path) -> None:
    slurm = FakeSlurm()
    gen, names = generation(tmp_path, slurm, 1)
    rounds = SlurmRounds(runner=slurm.run, clock=slurm.clock)
    (agent,) = agents(names, rounds)
    agent.poll(str(gen.path), [0, 1])
    slurm.states["n0"] = "IDLE+DRAIN"  # what a drain just set
    rounds.forget()
    assert not agent.poll(str(gen.path), [0, 1]).reachable
