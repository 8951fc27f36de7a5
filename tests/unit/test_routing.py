"""Host routing of a local job's machine-bound activities, without a server."""

from __future__ import annotations

import pytest

from activities.host_identity import HOST_ENV, this_host
from lazarus.domain.activity_refs import (
    FLEET_LEASE,
    GROW_ALLOCATION,
    LAUNCH,
    RUN_ESCALATION_HOOK,
    STOP,
    SUBMIT_ALLOCATION,
    SUPERVISE,
    WATCH_CHECKPOINTS,
)
from lazarus.domain.spec import JobSpec, parse_spec
from workflows.routing import (
    MACHINE_BOUND,
    declared_host,
    host_task_queue,
    learned_host_queue,
    route,
    routes_by_host,
)


def spec(**fields: object) -> JobSpec:
    return parse_spec({"name": "job", "command": ["python", "train.py"], **fields}, "<test>")


def test_host_queue_is_task_queue_at_host_and_naming_twice_changes_nothing() -> None:
    assert host_task_queue("lazarus", "gpu-1") == "lazarus@gpu-1"
    assert host_task_queue("lazarus@gpu-1", "gpu-2") == "lazarus@gpu-2"


def test_machine_bound_activities_go_to_the_host_queue() -> None:
    for ref in (LAUNCH, SUPERVISE, STOP, WATCH_CHECKPOINTS):
        assert route(ref, "lazarus@gpu-1") == {"task_queue": "lazarus@gpu-1"}


def test_activities_any_worker_may_run_stay_on_the_job_queue() -> None:
    for ref in (RUN_ESCALATION_HOOK, FLEET_LEASE, SUBMIT_ALLOCATION, GROW_ALLOCATION):
        assert ref.name not in MACHINE_BOUND
        assert route(ref, "lazarus@gpu-1") == {}


def test_no_host_queue_means_no_option_at_all() -> None:
    """Jobs without routing issue exactly the commands they did: no task_queue option."""
    assert route(SUPERVISE, None) == {}


def test_only_local_jobs_route_by_host() -> None:
    assert routes_by_host(spec())
    ssh = {"name": "a", "launcher": "ssh", "host": "10.0.0.1"}
    assert not routes_by_host(spec(nodes=[ssh]))


def test_a_local_job_names_its_host_only_off_loopback() -> None:
    assert declared_host(spec()) is None
    assert declared_host(spec(nodes=[{"name": "a", "host": "localhost"}])) is None
    named = [{"name": "a", "host": "gpu-1"}, {"name": "b", "host": "gpu-1"}]
    assert declared_host(spec(nodes=named)) == "gpu-1"


def test_nodes_naming_different_hosts_declare_none() -> None:
    nodes = [{"name": "a", "host": "gpu-1"}, {"name": "b", "host": "gpu-2"}]
    assert declared_host(spec(nodes=nodes)) is None


def test_ssh_nodes_never_declare_a_host() -> None:
    ssh = {"name": "a", "launcher": "ssh", "host": "gpu-1"}
    assert declared_host(spec(nodes=[ssh])) is None


def test_the_first_launch_pins_the_host_and_later_launches_never_move_it() -> None:
    assert learned_host_queue(None, "lazarus", None) is None
    assert learned_host_queue(None, "lazarus", "gpu-1") == "lazarus@gpu-1"
    assert learned_host_queue("lazarus@gpu-1", "lazarus", "gpu-2") == "lazarus@gpu-1"


def test_worker_host_name_can_be_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOST_ENV, "box-7")
    assert this_host() == "box-7"
    monkeypatch.setenv(HOST_ENV, " ")
    assert this_host()  # falls back to the system host name
