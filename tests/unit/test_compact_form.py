"""Models that come by the thousand are written without their defaults
(``lazarus.domain.compact_form``): they read back whole, and the full form written
by earlier versions still reads."""

from __future__ import annotations

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from lazarus.domain.contracts import NodeAccess, NodeHealth, PreflightReport, SuperviseRequest
from lazarus.domain.spec import HealthSpec, NodeSpec

pytestmark = pytest.mark.timeout(30)
CONVERTER = pydantic_data_converter.payload_converter


def test_a_node_travels_as_its_name_and_what_it_changes() -> None:
    """Node lists are in most activity inputs: the compact form must read back whole,
    and a history written with every field (before) must still read."""
    ssh = NodeSpec(
        name="gpu-7", launcher="ssh", host="10.0.0.7", user="train", labels={"rack": "r2"}
    )
    nodes = [NodeSpec(name=f"n{i:05d}") for i in range(2048)] + [ssh]
    request = SuperviseRequest(
        job_id="j",
        generation=1,
        run_dir="/r",
        world_size=8,
        health=HealthSpec(),
        access=NodeAccess(nodes=nodes),
    )
    (payload,) = CONVERTER.to_payloads([request])
    assert b'{"name":"n00000"}' in payload.data
    assert b'"name":"gpu-7","launcher":"ssh","host":"10.0.0.7","user":"train"' in payload.data
    assert len(payload.data) < 40 * 2048  # the full form: about 105 bytes a node
    (back,) = CONVERTER.from_payloads([payload], [SuperviseRequest])
    assert back == request

    full = NodeSpec.model_validate_json(
        '{"name":"n1","launcher":"local","host":"127.0.0.1","port":22,'
        '"user":null,"identity_file":null,"labels":{}}'
    )
    assert full == NodeSpec(name="n1")


def test_a_healthy_node_answers_preflight_with_its_name_and_ok() -> None:
    report = PreflightReport(
        nodes=[
            NodeHealth(node="n0", ok=True),
            NodeHealth(node="n1", ok=False, problems=["disk"], free_disk_gb=1.5),
        ]
    )
    (payload,) = CONVERTER.to_payloads([report])
    assert payload.data == (
        b'{"nodes":[{"node":"n0","ok":true},'
        b'{"node":"n1","ok":false,"problems":["disk"],"free_disk_gb":1.5}]}'
    )
    (back,) = CONVERTER.from_payloads([payload], [PreflightReport])
    assert back == report and back.failed == [report.nodes[1]]


def test_a_node_named_like_the_default_still_says_its_name() -> None:
    (payload,) = CONVERTER.to_payloads([NodeSpec()])
    assert payload.data == b'{"name":"local"}'
