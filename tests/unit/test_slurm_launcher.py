"""The Slurm launcher's pure parts: the spec's ``slurm:`` section, the task's rank
slot, parsing ``scontrol -o`` lines and the client environment (no Slurm needed)."""

from __future__ import annotations

import pytest

from activities.nodes.factory import agent_for
from activities.nodes.slurm.agent import SlurmAgent
from activities.nodes.slurm.commands import _fields, client_environment
from activities.nodes.slurm_task import SLURM_TASK_VARIABLES, rank_slot, slurm_identity
from lazarus.domain import environment as env_names
from lazarus.domain.spec import NodeSpec, SpecError, SSHSpec, parse_spec


def spec_data(**extra: object) -> dict[str, object]:
    return {"name": "j", "command": ["python", "t.py"], **extra}


SLURM_NODES = [{"name": "n1", "launcher": "slurm"}, {"name": "n2", "launcher": "slurm"}]


def test_slurm_nodes_with_an_allocation_parse() -> None:
    spec = parse_spec(spec_data(nodes=SLURM_NODES, slurm={"job_id": 12345}), "job.yaml")
    assert spec.slurm is not None and spec.slurm.job_id == 12345
    assert {n.launcher for n in spec.nodes} == {"slurm"}


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        ({"nodes": SLURM_NODES}, "slurm: nodes use launcher slurm but the job names no allocation"),
        ({"slurm": {"job_id": 7}}, "slurm: set, but the nodes use launcher local"),
        ({"nodes": SLURM_NODES, "slurm": {"job_id": 0}}, "slurm.job_id"),
        ({"nodes": SLURM_NODES, "slurm": {"job_id": 1, "nodes": 4}}, "slurm.nodes"),
        (
            {
                "nodes": SLURM_NODES[:1],
                "spares": [{"name": "s", "launcher": "ssh"}],
                "slurm": {"job_id": 1},
            },
            "local, ssh or slurm",
        ),
    ],
)
def test_bad_slurm_sections_name_the_field(extra: dict[str, object], names: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(spec_data(**extra), "job.yaml")
    assert names in str(caught.value)


def test_factory_gives_slurm_nodes_the_slurm_agent() -> None:
    spec = parse_spec(spec_data(nodes=SLURM_NODES, slurm={"job_id": 9}), "job.yaml")
    agent = agent_for(spec.nodes[0], spec.ssh, spec.slurm)
    assert isinstance(agent, SlurmAgent) and agent.slurm == spec.slurm


def test_an_agent_without_the_allocation_says_so() -> None:
    agent = agent_for(NodeSpec(name="n1", launcher="slurm"), SSHSpec())
    assert isinstance(agent, SlurmAgent)
    with pytest.raises(ValueError, match=r"slurm\.job_id"):
        agent._job()


def test_rank_slots_follow_the_plans_node_order_not_slurms() -> None:
    # A spare (n3) took slot 0 of a dead n1: Slurm numbers n2 first, the plan does not.
    nodes = ["n3", "n2"]
    assert rank_slot(nodes, "n3", 1, 2) == (1, 0)
    assert rank_slot(nodes, "n2", 0, 2) == (2, 1)
    with pytest.raises(ValueError, match="n9"):
        rank_slot(nodes, "n9", 0, 2)
    with pytest.raises(ValueError, match="SLURM_LOCALID 2"):
        rank_slot(nodes, "n2", 2, 2)


def test_slurms_task_variables_agree_with_the_rank_after_a_spare_swap() -> None:
    # Spare n3 took dead n1's slot 0. Each node's ranks are a step of their own, so
    # Slurm numbered n3's tasks SLURM_PROCID 0,1 and n2's 0,1 too: both say rank 0.
    nodes, nproc = ["n3", "n2"], 2
    seen = {}
    for node in ("n2", "n3"):
        for local_id in range(nproc):
            rank, group = rank_slot(nodes, node, local_id, nproc)
            env = {
                **env_names.rank_identity(rank, nproc, group),
                **slurm_identity(rank, nproc, group, len(nodes)),
            }
            assert set(SLURM_TASK_VARIABLES) <= set(env)
            assert env["SLURM_PROCID"] == env[env_names.RANK] == str(rank)
            assert env["SLURM_LOCALID"] == env[env_names.LOCAL_RANK]
            assert env["SLURM_NODEID"] == env[env_names.GROUP_RANK] == str(nodes.index(node))
            assert env["SLURM_NTASKS"] == env["SLURM_NPROCS"] == "4"
            assert env["SLURM_NNODES"] == "2" and env["SLURM_NTASKS_PER_NODE"] == "2"
            assert str(rank) in env["SLURM_GTIDS"].split(",")
            seen[rank] = node
    assert seen == {0: "n3", 1: "n3", 2: "n2", 3: "n2"}


def test_a_step_for_some_ranks_maps_local_ids_to_them() -> None:
    # The zygote forked rank 2 of n2; rank 3 starts cold as a one-task step.
    assert rank_slot(["n1", "n2"], "n2", 0, 2, [3]) == (3, 1)
    with pytest.raises(ValueError, match="not one of node n2's ranks"):
        rank_slot(["n1", "n2"], "n2", 0, 2, [1])
    with pytest.raises(ValueError, match="outside the step's ranks"):
        rank_slot(["n1", "n2"], "n2", 1, 2, [3])


def test_scontrol_fields_keep_a_reason_with_spaces() -> None:
    line = (
        "NodeName=n2 Arch=x86_64 NodeAddr=vm State=IDLE+DRAIN+NOT_RESPONDING Weight=1 "
        "Reason=lazarus: node_lost in job-a [root@2026-12-01T00:00:00]"
    )
    fields = _fields(line)
    assert fields["NodeAddr"] == "vm"
    assert fields["State"] == "IDLE+DRAIN+NOT_RESPONDING"
    assert fields["Reason"] == "lazarus: node_lost in job-a [root@2026-12-01T00:00:00]"


def test_client_environment_drops_the_workers_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/test.conf")
    env = client_environment({"PATH": "/bin", "SLURM_STEP_ID": "3", "SLURM_JOB_ID": "42"})
    assert env == {"PATH": "/bin", "SLURM_CONF": "/etc/slurm/test.conf"}
