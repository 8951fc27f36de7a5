"""One model for node access: requests carry a :class:`NodeAccess`, not the
``(nodes, ssh, slurm)`` triple, and still read the triple an older worker wrote."""

from __future__ import annotations

import inspect

import pytest
from pydantic import BaseModel, ValidationError
from temporalio.contrib.pydantic import pydantic_data_converter

from lazarus.domain import contracts
from lazarus.domain.contracts import (
    FindVerifiedCheckpointRequest,
    NodeAccess,
    PreflightActivityRequest,
    StopRequest,
    SuperviseRequest,
)
from lazarus.domain.spec import HealthSpec, NodeSpec, SlurmSpec, SSHSpec, parse_spec

CONVERTER = pydantic_data_converter.payload_converter
SSH_NODE = {"name": "a", "launcher": "ssh", "host": "10.0.0.1"}


def requests() -> list[type[BaseModel]]:
    return [
        model
        for name, model in inspect.getmembers(contracts, inspect.isclass)
        if name.endswith("Request") and issubclass(model, BaseModel)
    ]


def test_no_request_carries_both_ssh_and_slurm() -> None:
    """How to reach nodes is said once, in ``access``: a request with its own ssh and
    Slurm fields would be a second place to keep in step."""
    assert len(requests()) > 10
    both = [m.__name__ for m in requests() if {"ssh", "slurm"} <= m.model_fields.keys()]
    assert both == []


@pytest.mark.parametrize(
    ("model", "nodes_key", "rest"),
    [
        (StopRequest, "nodes", {"job_id": "j", "run_root": "/r"}),
        (
            SuperviseRequest,
            "nodes",
            {"job_id": "j", "generation": 1, "run_dir": "/r", "world_size": 2, "health": {}},
        ),
        (FindVerifiedCheckpointRequest, "memory_nodes", {"checkpoint_dir": "/c"}),
        (
            PreflightActivityRequest,
            "nodes",
            {"checks": {}, "interpreter": "python", "workdir": "/w", "disk_path": "/w"},
        ),
    ],
)
def test_a_request_an_older_worker_wrote_still_reads(
    model: type[BaseModel], nodes_key: str, rest: dict[str, object]
) -> None:
    """An activity scheduled before ``access`` existed may run on a new worker."""
    old = {
        **rest,
        nodes_key: [SSH_NODE],
        "ssh": {"known_hosts": "/k", "accept_new_host_keys": True},
        "slurm": {"job_id": 42},
    }
    request = model.model_validate(old)
    access = request.access  # type: ignore[attr-defined]
    assert access.nodes == [NodeSpec.model_validate(SSH_NODE)]
    assert access.ssh == SSHSpec(known_hosts="/k", accept_new_host_keys=True)
    assert access.slurm == SlurmSpec(job_id=42)
    # ... and is never written in the old form again.
    written = request.model_dump(mode="json")
    assert not {nodes_key, "ssh", "slurm"} & written.keys()


def test_an_old_request_without_slurm_reads_too() -> None:
    request = StopRequest.model_validate({"job_id": "j", "run_root": "/r", "nodes": [SSH_NODE]})
    assert request.access == NodeAccess(nodes=[NodeSpec.model_validate(SSH_NODE)])


def test_both_forms_at_once_are_refused() -> None:
    """Which one would win is a guess: better to fail loudly."""
    with pytest.raises(ValidationError):
        StopRequest.model_validate(
            {"job_id": "j", "run_root": "/r", "access": {}, "ssh": {"known_hosts": "/k"}}
        )


def test_the_access_round_trips_through_history() -> None:
    request = SuperviseRequest(
        job_id="j",
        generation=1,
        run_dir="/r",
        world_size=2,
        health=HealthSpec(),
        access=NodeAccess(nodes=[NodeSpec(name="n1")], slurm=SlurmSpec(job_id=7)),
    )
    (payload,) = CONVERTER.to_payloads([request])
    (back,) = CONVERTER.from_payloads([payload], [SuperviseRequest])
    assert back == request


def test_access_of_a_spec_takes_its_ssh_and_slurm() -> None:
    spec = parse_spec(
        {
            "name": "j",
            "command": ["python", "t.py"],
            "nodes": [{"name": "a", "launcher": "slurm"}, {"name": "b", "launcher": "slurm"}],
            "slurm": {"job_id": 9},
            "ssh": {"connect_timeout_s": 9},
        },
        "job.yaml",
    )
    access = NodeAccess.of(spec)
    assert [n.name for n in access.nodes] == ["a", "b"]
    assert access.ssh == spec.ssh and access.slurm == spec.slurm
    assert [n.name for n in NodeAccess.of(spec, spec.nodes[1:]).nodes] == ["b"]
    assert access.with_nodes([]).or_this_machine().nodes == [NodeSpec()]
    assert access.or_this_machine() is access
