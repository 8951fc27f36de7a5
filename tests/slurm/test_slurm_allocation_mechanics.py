"""The Slurm side of changing an allocation, on a real Slurm, without a workflow:
a retried resubmission adopts the holder it submitted, a retried growth returns the
node it added, and a growth Slurm cannot serve is refused with Slurm's reason."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from activities.nodes.slurm.commands import allocation
from activities.nodes.slurm.grow import GrowRefused, grow
from activities.nodes.slurm.submit import resubmit
from infra.slurm import TestSlurm
from lazarus.domain.contracts import GrowAllocationRequest, SubmitAllocationRequest
from lazarus.domain.spec import SlurmSpec


@pytest.mark.timeout(300)
def test_a_retried_resubmission_adopts_instead_of_submitting_twice(
    own_slurm: Callable[[], TestSlurm], tmp_path: Path
) -> None:
    cluster = own_slurm()
    old = cluster.allocate(1)
    slurm = SlurmSpec(nodes=1, time="10:00", resubmit=True).granted(old)
    request = SubmitAllocationRequest(job_name="j", run_dir=str(tmp_path), slurm=slurm, token="i1")
    said: list[str] = []
    first = resubmit(request, said.append)
    again = resubmit(request, said.append)
    assert again.job_id == first.job_id != old
    assert any("adopted" in line for line in said), said
    gone = allocation(old)
    assert gone is None or gone.state != "RUNNING"
    named = cluster.command("squeue", "-h", "--name", "lazarus-j-i1", "-o", "%i").stdout.split()
    assert named == [str(first.job_id)]


@pytest.mark.timeout(300)
def test_growing_adds_a_node_once_and_a_retry_returns_it(
    own_slurm: Callable[[], TestSlurm],
) -> None:
    cluster = own_slurm()
    job = cluster.allocate(1)
    held = allocation(job)
    assert held is not None
    slurm = SlurmSpec(job_id=job, grow=True, wait_s=60)
    request = GrowAllocationRequest(job_name="j", slurm=slurm, known_nodes=held.nodes, token="g1")
    said: list[str] = []
    grown = grow(request, said.append)
    [added] = grown.nodes
    assert added not in held.nodes
    now = allocation(job)
    assert now is not None and sorted(now.nodes) == sorted([*held.nodes, added])
    assert grow(request, said.append).nodes == [added]  # a retry: no second node
    # Every other node known or excluded: nothing Slurm could add.
    everything = GrowAllocationRequest(
        job_name="j",
        slurm=slurm.model_copy(update={"wait_s": 10}),
        known_nodes=[*now.nodes],
        exclude=[n for n in ("n1", "n2", "n3") if n not in now.nodes],
        token="g2",
    )
    with pytest.raises(GrowRefused, match=f"Slurm refuses to grow job {job}"):
        grow(everything, said.append)
