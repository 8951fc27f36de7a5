"""Submit mode of the Slurm launcher without a cluster: the spec's ``slurm:``
section, the holder's ``sbatch`` line, and which field a refusal names."""

from __future__ import annotations

import pytest

from activities.nodes.slurm.submit import _refusal, holder_argv
from lazarus.domain.spec import SlurmSpec, SpecError, parse_spec


def spec_data(**extra: object) -> dict[str, object]:
    return {"name": "j", "command": ["python", "t.py"], **extra}


def test_a_submitted_allocation_fills_nodes_then_spares_in_slurm_order() -> None:
    spec = parse_spec(spec_data(slurm={"nodes": 2, "spares": 1, "partition": "p"}), "job.yaml")
    assert spec.slurm is not None and spec.slurm.submits
    filled = spec.in_allocation(77, ["n1", "n2", "n3"])
    assert [n.name for n in filled.nodes] == ["n1", "n2"]
    assert [n.name for n in filled.spares] == ["n3"]
    assert {n.launcher for n in (*filled.nodes, *filled.spares)} == {"slurm"}
    assert filled.slurm is not None and filled.slurm.job_id == 77 and not filled.slurm.submits
    # The submit options stay, so a resubmission asks Slurm for the same.
    assert filled.slurm.submitted and filled.slurm.partition == "p"
    assert filled.slurm.nodes == 2 and filled.slurm.spares == 1
    # What the workflow gets decodes the same.
    again = parse_spec(filled.model_dump(mode="json", by_alias=True), "job.yaml")
    assert again.slurm == filled.slurm and again.nodes == filled.nodes


def test_resubmit_is_for_allocations_lazarus_submitted() -> None:
    spec = parse_spec(spec_data(slurm={"nodes": 1, "resubmit": True}), "job.yaml")
    assert spec.slurm is not None and not spec.slurm.resubmits  # nothing submitted yet
    moved = spec.in_allocation(5, ["n1"]).in_allocation(6, ["n2"])
    assert moved.slurm is not None and moved.slurm.resubmits and moved.slurm.job_id == 6
    assert [n.name for n in moved.nodes] == ["n2"]


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        ({"slurm": {}}, "slurm.job_id: give slurm.job_id"),
        ({"slurm": {"job_id": 3, "resubmit": True}}, "slurm.resubmit: only with slurm.nodes"),
        ({"slurm": {"job_id": 3, "submitted": True}}, "slurm.submitted: set by Lazarus"),
        ({"slurm": {"nodes": 2, "wait_s": 1}}, "slurm.wait_s"),
        ({"slurm": {"job_id": 3, "partition": "p"}}, "slurm.partition: only with slurm.nodes"),
        (
            {"slurm": {"nodes": 2}, "nodes": [{"name": "n1", "launcher": "slurm"}]},
            "nodes/spares: with slurm.nodes",
        ),
        ({"slurm": {"nodes": 2}, "min_nodes": 3}, "min_nodes: 3 is more than slurm.nodes 2"),
        ({"slurm": {"nodes": 0}}, "slurm.nodes"),
        ({"slurm": {"nodes": 2, "notice_s": 1}}, "slurm.notice_s"),
    ],
)
def test_bad_submit_sections_name_the_field(extra: dict[str, object], names: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(spec_data(**extra), "job.yaml")
    assert names in str(caught.value)


def test_the_holder_line_keeps_the_allocation_and_asks_for_the_notice() -> None:
    slurm = SlurmSpec(
        nodes=2,
        spares=1,
        partition="gpu",
        time="1:00:00",
        account="acct",
        extra_args=["--qos=high"],
        notice_s=90,
    )
    argv = holder_argv(slurm, "j", "/shared/runs")
    assert argv[:5] == ["sbatch", "--parsable", "--no-kill", "--no-requeue", "--signal=B:USR1@90"]
    assert argv[argv.index("-N") + 1] == "3"
    for option in ("--partition=gpu", "--time=1:00:00", "--account=acct", "--qos=high"):
        assert option in argv
    assert argv[-2] == "--wrap" and '/shared/runs/.slurm-preempt-"$SLURM_JOB_ID"' in argv[-1]


@pytest.mark.parametrize(
    ("error", "field"),
    [
        ("sbatch: error: invalid partition specified: nope", "slurm.partition"),
        ("sbatch: error: Invalid account or account/partition combination", "slurm.account"),
        ("sbatch: error: Invalid time limit specification", "slurm.time"),
        ("sbatch: error: Node count specification invalid", "slurm.nodes"),
        ("sbatch: error: unrecognized option '--bogus'", "slurm.extra_args"),
    ],
)
def test_a_refusal_names_the_field_to_blame(error: str, field: str) -> None:
    line = _refusal(error)
    assert line.startswith(f"{field}: Slurm refuses the allocation: ") and "\n" not in line
