"""Carrying survivors per node (issue 28), the parts without processes or hosts: which
node carries which rank, the merged rejoin request, the shim's ``rejoin`` call and
its answer, the node-side entry point's refusals, and the fallback that fences
everything older when a node cannot carry."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from activities.launcher import carry_slots
from activities.nodes import carry, rejoin
from activities.nodes.agent import NodeUnreachable
from activities.nodes.local.agent import LocalAgent
from activities.nodes.node_records import CarryRequest, NodeStopResult
from activities.nodes.rundir import GenerationDir, read_json, write_json_atomic
from activities.nodes.shim_agent import LocalShimAgent, carry_answer
from activities.nodes.shim_calls import ShimReply, rejoin_call
from lazarus.domain import environment as env_names
from lazarus.domain.spec import NodeSpec


def nodes(*names: str) -> list[NodeSpec]:
    return [
        NodeSpec(name=name, launcher="ssh", host=f"10.0.0.{i + 1}") for i, name in enumerate(names)
    ]


# ---------------------------------------------------------------- which node carries


def test_each_rank_is_carried_by_the_node_of_its_slot() -> None:
    plan = {"nodes": ["a", "b"], "nproc_per_node": 2}
    slots, refused = carry_slots(plan, [3, 0, 2, 0], nodes("a", "b"), 2)
    assert slots == {"a": [0], "b": [2, 3]} and refused == []


def test_a_rank_whose_node_left_the_pool_is_not_carried() -> None:
    plan = {"nodes": ["a", "b"], "nproc_per_node": 2}
    slots, refused = carry_slots(plan, [0, 1, 2, 3], nodes("a", "s"), 2)
    assert slots == {"a": [0, 1], "s": []}
    assert refused == [
        "rank 2: its node b left the pool (s took its slot)",
        "rank 3: its node b left the pool (s took its slot)",
    ]


def test_a_plan_that_does_not_name_its_nodes_keeps_every_rank_in_its_slot() -> None:
    slots, refused = carry_slots(None, [1, 2], nodes("a", "b"), 2)
    assert slots == {"a": [1], "b": [2]} and refused == []


# ---------------------------------------------------------------- the rejoin request


def env_of(rank: int, generation: int = 2) -> dict[str, str | None]:
    return {env_names.RANK: str(rank), env_names.GENERATION: str(generation), "SECRET": "x"}


def test_requests_of_several_nodes_for_one_generation_merge(tmp_path: Path) -> None:
    previous = GenerationDir.of(tmp_path, 1)
    previous.path.mkdir()
    write_json_atomic(previous.control_file, {"checkpoint_every_steps": 7})
    rejoin.request_rejoin(previous, 2, {2: env_of(2), 3: env_of(3)})
    rejoin.request_rejoin(previous, 2, {0: env_of(0)})
    document = read_json(previous.control_file) or {}
    assert document["checkpoint_every_steps"] == 7, "the rest of the document is kept"
    request = document[env_names.CONTROL_REJOIN]
    assert request["generation"] == 2 and list(request["env"]) == ["0", "2", "3"]
    assert set(request["env"]["0"]) == set(env_names.REJOIN_VARIABLES), "only rejoin variables"
    assert request["env"]["3"][env_names.RANK] == "3"


def test_a_request_for_a_newer_generation_replaces_the_older_one(tmp_path: Path) -> None:
    previous = GenerationDir.of(tmp_path, 1)
    previous.path.mkdir()
    rejoin.request_rejoin(previous, 2, {0: env_of(0), 1: env_of(1)})
    rejoin.request_rejoin(previous, 3, {1: env_of(1, 3)})
    request = (read_json(previous.control_file) or {})[env_names.CONTROL_REJOIN]
    assert request["generation"] == 3 and list(request["env"]) == ["1"]


# ---------------------------------------------------------------- the node-side carry


def carry_request(tmp_path: Path, ranks: list[int], **fields: Any) -> CarryRequest:
    previous, gen = GenerationDir.of(tmp_path, 1), GenerationDir.of(tmp_path, 2)
    previous.path.mkdir(parents=True, exist_ok=True)
    return CarryRequest(
        run_root=str(tmp_path),
        previous_gen_dir=str(previous.path),
        gen_dir=str(gen.path),
        generation=2,
        ranks=ranks,
        env={r: {env_names.RANK: str(r)} for r in ranks},
        **fields,
    )


def test_ranks_without_a_live_process_are_refused_and_nothing_is_requested(
    tmp_path: Path,
) -> None:
    request = carry_request(tmp_path, [0, 1])
    previous = GenerationDir(Path(request.previous_gen_dir))
    write_json_atomic(previous.pid_file(1), {"pid": 2**22 + 5, "pgid": 2**22 + 5, "start_ticks": 1})
    result = LocalAgent(NodeSpec(name="local")).carry_survivors(request)
    assert result.carried == []
    assert result.refused == [
        "rank 0: no pid file in generation 1",
        "rank 1: its process is gone",
    ]
    assert not previous.control_file.exists(), "no survivor, no request"
    assert Path(request.gen_dir).is_dir()


def test_the_node_side_entry_names_the_bad_field_and_never_its_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad: dict[str, object] = {"run_root": "/r", "gen_dir": "/r/gen-00002"}
    bad["previous_gen_dir"] = "/r/gen-00001"
    bad |= {"generation": "two", "ranks": [0], "env": {"0": {"RANK": "sekrit-value"}}}
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(json.dumps(bad).encode())))
    assert carry.main() == 2
    line = json.loads(capsys.readouterr().out)
    assert "generation" in line["error"] and "sekrit" not in line["error"]


# ---------------------------------------------------------------- the shim's rejoin


def test_the_request_goes_on_stdin_never_in_argv(tmp_path: Path) -> None:
    request = carry_request(
        tmp_path, [0], program="python3", workdir="/w", search_path="/bin", python_path="/lz"
    )
    call = rejoin_call(request)
    assert call.argv == ["rejoin", request.gen_dir, "python3", "/w"]
    assert call.stdin.startswith("/bin\n/lz\n")
    assert CarryRequest.model_validate_json(call.stdin.splitlines()[2]) == request
    with pytest.raises(ValueError, match="PATH or PYTHONPATH holds a newline"):
        rejoin_call(request.model_copy(update={"search_path": "/bin\n/evil"}))


def test_an_answer_is_read_back_from_the_shims_lines() -> None:
    line = {"carried": [], "refused": ["rank 1: its process is gone"], "unkillable": []}
    assert carry_answer([{"noise": 1}, line]) is not None
    assert carry_answer([{"error": "rejoin: boom"}]) is None


class CannedShim(LocalShimAgent):
    """Answers each shim call with the next canned output, recording the calls."""

    def __init__(self, outputs: list[bytes]) -> None:
        super().__init__(NodeSpec(name="h1", launcher="ssh", host="10.0.0.1"))
        self.outputs = outputs
        self.scripts: list[bytes] = []

    def _run(self, script: bytes, timeout_s: float) -> ShimReply:
        self.scripts.append(script)
        return ShimReply(0, self.outputs.pop(0), 0.01)


STOPPED = (
    b'{"signalled":2,"killed":0,"last_step":9,"generations":[1],'
    b'"survivors":[],"survivor_pids":[]}\n'
)


def test_a_node_that_cannot_carry_fences_everything_older_and_refuses(tmp_path: Path) -> None:
    agent = CannedShim([b'{"error":"rejoin: no module named activities"}\n', STOPPED])
    result = agent.carry_survivors(carry_request(tmp_path, [0, 1]))
    assert result.carried == []
    assert result.refused == [
        f"rank {r}: cannot carry it on node h1: rejoin: no module named activities" for r in (0, 1)
    ]
    assert b"shim_main rejoin " in agent.scripts[0]
    assert b"shim_main stop " in agent.scripts[1] and b" 2 0.00 " in agent.scripts[1], (
        "stop every generation but the new one, at once"
    )


def test_the_default_carry_fences_and_an_unreachable_node_raises(tmp_path: Path) -> None:
    class Gone(CannedShim):
        def stop(
            self,
            run_root: str,
            keep_generation: int | None,
            grace_s: float,
            kill_wait_s: float = 10,
        ) -> NodeStopResult:
            return NodeStopResult(node="h1", reachable=False, error="no route to host")

    agent = Gone([b"garbage\n"])
    with pytest.raises(NodeUnreachable, match="no route to host"):
        agent.carry_survivors(carry_request(tmp_path, [0]))


# ---------------------------------------------------------------- the rank's teardown


class FakeWorld:
    def __init__(self) -> None:
        self.pg_map: dict[object, object] = {object(): "default"}


class FakeC10d:
    def __init__(self, abort: bool) -> None:
        self.calls: list[str] = []
        self._world = FakeWorld()
        if abort:
            self._abort_process_group = self._abort

    def _abort(self) -> None:
        self.calls.append("abort")
        self._world.pg_map.clear()  # as torch forgets them: only our reference is left

    def destroy_process_group(self) -> None:
        self.calls.append("destroy")


@pytest.mark.slow  # imports torch
@pytest.mark.parametrize(
    ("backend", "has_abort", "called"),
    [("nccl", True, "abort"), ("nccl", False, "destroy"), ("gloo", True, "destroy")],
)
def test_a_rank_aborts_nccl_communicators_and_destroys_gloo_groups(
    backend: str, has_abort: bool, called: str
) -> None:
    from lazarus.rank.nccl_teardown import aborted_groups, teardown_call

    api = FakeC10d(has_abort)
    groups = list(api._world.pg_map)
    kept_before = len(aborted_groups)
    teardown_call(backend, api)()
    assert api.calls == [called]
    # An aborted NCCL group is kept alive: its destructor would join a watchdog
    # thread that may sit in its debug dump (seen on an H200).
    kept = aborted_groups[kept_before:]
    assert kept == (groups if called == "abort" else [])
    del aborted_groups[kept_before:]
