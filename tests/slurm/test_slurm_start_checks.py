"""What ``lazarus start`` refuses before anything is submitted (issue 13): an
allocation that is not running, and nodes the allocation does not hold. Each
refusal is one line that names the spec field."""

from __future__ import annotations

import pytest

from activities.nodes.slurm.commands import allocation_problems
from infra.slurm import TestSlurm
from lazarus.domain.spec import NodeSpec, SlurmSpec


def slurm_nodes(*names: str) -> list[NodeSpec]:
    return [NodeSpec(name=n, launcher="slurm") for n in names]


@pytest.mark.timeout(120)
def test_a_good_allocation_has_no_problems(slurm: TestSlurm, allocation: int) -> None:
    spec = SlurmSpec(job_id=allocation)
    assert allocation_problems(spec, slurm_nodes("n1", "n2"), slurm_nodes("n3")) == []


@pytest.mark.timeout(120)
def test_an_unknown_job_id_is_refused(slurm: TestSlurm, allocation: int) -> None:
    [line] = allocation_problems(SlurmSpec(job_id=987654), slurm_nodes("n1"), [])
    assert line.startswith("slurm.job_id:") and "987654" in line


@pytest.mark.timeout(120)
def test_a_finished_allocation_is_refused(slurm: TestSlurm, allocation: int) -> None:
    done = slurm.command("sbatch", "--parsable", "-N", "1", "--wrap", "true")
    job = int(done.stdout.strip().split(";")[0])
    slurm.command("scancel", str(job))
    [line] = allocation_problems(SlurmSpec(job_id=job), slurm_nodes("n1"), [])
    assert line.startswith("slurm.job_id:")
    assert "not RUNNING" in line or "does not exist" in line


@pytest.mark.timeout(120)
def test_nodes_outside_or_beyond_the_allocation_are_refused(
    slurm: TestSlurm, allocation: int
) -> None:
    spec = SlurmSpec(job_id=allocation)
    [line] = allocation_problems(spec, slurm_nodes("n1", "n9"), [])
    assert line.startswith("nodes[1]:") and "n9" in line
    [line] = allocation_problems(spec, slurm_nodes("n1", "n2", "n3"), slurm_nodes("n4"))
    assert line.startswith("nodes:") and "holds 3" in line
