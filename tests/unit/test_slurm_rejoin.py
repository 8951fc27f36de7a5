"""Rejoin on Slurm nodes (issue 28, item 1), the parts without Slurm: the spec allows
``rejoin`` on Slurm only with ``warm_start``, and the agent carries survivors only
when they were forked from the node's zygote (their pid record names no step)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from activities import launcher
from activities.nodes.agent import NodeUnreachable
from activities.nodes.node_records import (
    CarryRequest,
    CarryResult,
    NodeStopResult,
    RankLaunch,
    StartedRank,
    WarmStart,
)
from activities.nodes.rundir import GenerationDir, write_json_atomic
from activities.nodes.shim_calls import ShimReply
from activities.nodes.slurm.agent import SlurmAgent
from activities.nodes.slurm.shim import SrunShim
from lazarus.domain import environment as env_names
from lazarus.domain.contracts import LaunchRequest, NodeAccess
from lazarus.domain.spec import NodeSpec, SlurmSpec, SpecError, parse_spec

SLURM_NODES = [{"name": "n1", "launcher": "slurm"}, {"name": "n2", "launcher": "slurm"}]


def spec_data(**extra: object) -> dict[str, object]:
    return {
        "name": "j",
        "command": ["python", "t.py"],
        "nodes": SLURM_NODES,
        "slurm": {"job_id": 7},
        "rejoin": {},
        **extra,
    }


def test_rejoin_on_slurm_needs_warm_start_and_says_why() -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(spec_data(), "job.yaml")
    message = str(caught.value)
    assert "rejoin: on Slurm nodes a survivor must be a rank forked" in message
    assert "add a warm_start section" in message


def test_rejoin_on_slurm_with_warm_start_is_allowed() -> None:
    spec = parse_spec(spec_data(warm_start={"preload": ["torch"]}), "job.yaml")
    assert spec.rejoin is not None and spec.warm is not None


def test_rejoin_with_warm_start_disabled_on_slurm_is_refused() -> None:
    with pytest.raises(SpecError, match="needs warm_start"):
        parse_spec(spec_data(warm_start={"enabled": False}), "job.yaml")


class CannedSlurm(SlurmAgent):
    """A Slurm agent whose Slurm side is canned: the shim's answers, the older steps'
    stop and the default stop are recorded, nothing runs."""

    def __init__(self, outputs: list[bytes], steps_reachable: bool = True) -> None:
        super().__init__(NodeSpec(name="n1", launcher="slurm"), SlurmSpec(job_id=7))
        self.outputs = outputs
        self.steps_reachable = steps_reachable
        self.calls: list[str] = []

    def _shim(self) -> SrunShim:
        agent = self

        class Canned(SrunShim):
            def _run(self, script: bytes, timeout_s: float) -> ShimReply:
                agent.calls.append("shim rejoin" if b"shim_main rejoin " in script else "shim")
                return ShimReply(0, agent.outputs.pop(0), 0.01)

        return Canned(self.node, 7, 5.0)

    def _stop_older_steps(
        self, run_root: str, generation: int, kill_wait_s: float
    ) -> NodeStopResult:
        self.calls.append(f"steps below {generation}")
        if not self.steps_reachable:
            return NodeStopResult(node="n1", reachable=False, error="slurmctld is down")
        return NodeStopResult(node="n1", reachable=True)

    def stop(
        self, run_root: str, keep_generation: int | None, grace_s: float, kill_wait_s: float = 10
    ) -> NodeStopResult:
        self.calls.append(f"stop all but {keep_generation}")
        return NodeStopResult(node="n1", reachable=True)


def request(tmp_path: Path, records: dict[int, dict[str, object]]) -> CarryRequest:
    previous = GenerationDir.of(tmp_path, 1)
    previous.path.mkdir(parents=True)
    for rank, record in records.items():
        write_json_atomic(previous.pid_file(rank), record)
    return CarryRequest(
        run_root=str(tmp_path),
        previous_gen_dir=str(previous.path),
        gen_dir=str(GenerationDir.of(tmp_path, 2).path),
        generation=2,
        ranks=sorted(records),
        env={r: {env_names.RANK: str(r)} for r in records},
    )


FORKED = {"pid": 4242, "pgid": 4242, "start_ticks": 9}
CARRIED = b'{"carried":[{"rank":0,"pid":4242,"pgid":4242,"start_ticks":9,"log_file":"l"}]}\n'


def test_forked_survivors_are_carried_on_the_node_after_the_older_steps_stop(
    tmp_path: Path,
) -> None:
    agent = CannedSlurm([CARRIED])
    result = agent.carry_survivors(request(tmp_path, {0: FORKED}))
    assert [r.pid for r in result.carried] == [4242] and result.refused == []
    assert agent.calls == ["steps below 2", "shim rejoin"], "steps fenced before the carry"


def test_a_rank_of_a_generation_step_is_not_carried(tmp_path: Path) -> None:
    agent = CannedSlurm([])
    stepped = {**FORKED, "slurm_step": "7.3"}
    result = agent.carry_survivors(request(tmp_path, {0: FORKED, 1: stepped}))
    assert result.carried == [] and len(result.refused) == 2
    assert "only ranks forked from the node's zygote (warm_start) rejoin" in result.refused[0]
    assert agent.calls == ["stop all but 2"], "the whole node's older generations stop"


def test_a_carry_without_an_answer_stops_everything_older(tmp_path: Path) -> None:
    agent = CannedSlurm([b'{"error":"rejoin: no module named activities"}\n'])
    result = agent.carry_survivors(request(tmp_path, {0: FORKED}))
    assert result.carried == []
    assert result.refused == [
        "rank 0: cannot carry it on node n1: rejoin: no module named activities"
    ]
    assert agent.calls == ["steps below 2", "shim rejoin", "stop all but 2"]


def test_slurm_that_cannot_be_asked_carries_nothing(tmp_path: Path) -> None:
    agent = CannedSlurm([], steps_reachable=False)
    with pytest.raises(NodeUnreachable, match="slurmctld is down"):
        agent.carry_survivors(request(tmp_path, {0: FORKED}))
    assert agent.calls == ["steps below 2"]


class Recorded:
    """A node agent whose every call is recorded in one shared list (the launch's
    order), carrying rank 0 on n1 and forking the others. Its fencing before a launch
    is the Slurm agent's own, over the recorded :meth:`stop`."""

    fence_here = SlurmAgent.fence_here
    fence_older_generations = SlurmAgent.fence_older_generations
    prepare_launch = SlurmAgent.prepare_launch
    carry_and_start = SlurmAgent.carry_and_start  # the interface's: carry, start later

    def __init__(self, node: NodeSpec, calls: list[str]) -> None:
        self.node = node
        self.calls = calls

    def carry_survivors(self, request: CarryRequest) -> CarryResult:
        self.calls.append(f"carry {self.node.name} {request.ranks}")
        carried = [
            StartedRank(rank=r, pid=4242, pgid=4242, start_ticks=9, log_file="l")
            for r in request.ranks
        ]
        return CarryResult(carried=carried)

    def start_ranks_warm(
        self, gen_dir: str, ranks: list[RankLaunch], warm: WarmStart
    ) -> list[StartedRank]:
        self.calls.append(f"fork {self.node.name} {[r.rank for r in ranks]}")
        return [
            StartedRank(rank=r.rank, pid=5000 + r.rank, pgid=5000, start_ticks=1, log_file="l")
            for r in ranks
        ]

    def stop(
        self, run_root: str, keep_generation: int | None, grace_s: float, kill_wait_s: float = 10
    ) -> NodeStopResult:
        self.calls.append(f"stop {self.node.name} all but {keep_generation}")
        return NodeStopResult(node=self.node.name, reachable=True)


def test_a_slurm_launch_that_carried_a_survivor_does_not_fence_it_afterwards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bug that kept rejoin off on Slurm: after the carry, the launch's net
    (``_fence_older_steps``: a stop of every older generation on each node, keeping no
    group) SIGKILLed the survivor it had just carried, so the new rank found no store.
    A carry fences every node itself; the net runs only when nothing is carried."""
    spec = parse_spec(
        spec_data(warm_start={"preload": ["torch"]}, run_dir=str(tmp_path / "runs")), "job.yaml"
    ).resolved(tmp_path)
    root = tmp_path / "run"
    previous = GenerationDir.of(root, 1)
    previous.path.mkdir(parents=True)
    write_json_atomic(previous.plan_file, {"master_port": 1, "nodes": ["n1", "n2"]})
    calls: list[str] = []

    @contextmanager
    def recorded(access: NodeAccess) -> Iterator[list[Recorded]]:
        yield [Recorded(node, calls) for node in access.nodes]

    monkeypatch.setattr(launcher, "agents", recorded)
    for generation, rejoin in ((2, [0]), (3, [])):
        request = LaunchRequest(
            spec=spec, generation=generation, run_root=str(root), rejoin_ranks=rejoin
        )
        calls.clear()
        result = launcher.launch_generation(request)
        if rejoin:
            assert result.rejoined == [0]
            assert sorted(calls) == ["carry n1 [0]", "carry n2 []", "fork n2 [1]"], calls
        else:
            assert result.rejoined == []
            assert sorted(calls) == [
                "fork n1 [0]",
                "fork n2 [1]",
                "stop n1 all but 3",
                "stop n2 all but 3",
            ], calls
