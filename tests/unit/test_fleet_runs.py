"""Leases and reports belong to a run, not to a job's name, and an operator can free
the lease of a job that ended without releasing it (issue 26; ``docs/fleet.md``).

Pure moves of ``lazarus.domain.fleet`` and the job side's keys, no server."""

from __future__ import annotations

import pytest

from lazarus.domain.fleet import (
    DrainRequest,
    FleetConfig,
    FleetRefusal,
    FleetState,
    LeaseRequest,
    OrphanRelease,
    QuarantineReport,
    ReleaseRequest,
    ReplaceRequest,
    ReturnRequest,
    counting_incidents,
    drain,
    initial_state,
    lease,
    probation_result,
    release,
    release_orphan,
    replace,
    report_quarantine,
    return_node,
)
from lazarus.domain.spec import JobSpec
from workflows.fleet_link import report_key
from workflows.state import JobState

pytestmark = pytest.mark.timeout(30)


def config(**overrides: object) -> FleetConfig:
    data: dict[str, object] = {
        "name": "f",
        "nodes": [{"name": f"n{i}"} for i in range(1, 8)],
        "probation": {"health_command": ["/bin/true"]},
    }
    data.update(overrides)
    return FleetConfig.model_validate(data)


def states(state: FleetState) -> dict[str, tuple[str, str | None]]:
    return {r.name: (r.state.value, r.job) for r in state.nodes}


def names(specs: object) -> list[str]:
    return [n.name for n in specs]  # type: ignore[attr-defined]


# ------------------------------------------------------------------ leases (issue 8)


def test_a_retried_lease_by_the_same_run_returns_the_same_nodes() -> None:
    cfg = config()
    state = initial_state(cfg, 0.0)
    got = lease(state, cfg, LeaseRequest(job="llama", nodes=2, spares=1, run="run-a"), 1.0)
    again = lease(state, cfg, LeaseRequest(job="llama", nodes=2, spares=1, run="run-a"), 2.0)
    assert again.nodes == got.nodes and again.spares == got.spares
    assert all(state.record(n).run == "run-a" for n in names([*got.nodes, *got.spares]))


def test_a_lease_held_by_an_earlier_run_is_refused_not_handed_over_at_another_size() -> None:
    # The audit's repro: start 1 leased 2 nodes and never released them; start 2 asks
    # for 6 + 1 and, keyed by name, got start 1's 2 nodes: it trained at world size 2.
    cfg = config()
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="llama", nodes=2, spares=0, run="run-a"), 10.0)
    with pytest.raises(FleetRefusal, match="'lazarus fleet release llama --fleet f'") as refusal:
        lease(state, cfg, LeaseRequest(job="llama", nodes=6, spares=1, run="run-b"), 20.0)
    assert "run-a" in str(refusal.value) and "2 node(s) + 0 spare(s)" in str(refusal.value)
    # Not even at the same size: the earlier start's ranks may still run there.
    with pytest.raises(FleetRefusal, match="earlier start"):
        lease(state, cfg, LeaseRequest(job="llama", nodes=2, spares=0, run="run-b"), 21.0)
    assert [r.name for r in state.held_by("llama")] == ["n1", "n2"]


def test_jobs_from_before_runs_were_named_get_their_lease_back_only_at_its_size() -> None:
    cfg = config()
    state = initial_state(cfg, 0.0)
    got = lease(state, cfg, LeaseRequest(job="old", nodes=2), 1.0)
    assert lease(state, cfg, LeaseRequest(job="old", nodes=2), 2.0).nodes == got.nodes
    with pytest.raises(FleetRefusal, match="lazarus fleet release old"):
        lease(state, cfg, LeaseRequest(job="old", nodes=3), 3.0)
    with pytest.raises(FleetRefusal, match="an unnamed run"):
        lease(state, cfg, LeaseRequest(job="old", nodes=2, run="run-new"), 4.0)


def test_a_replacement_belongs_to_the_run_of_the_node_it_replaces() -> None:
    cfg = config()
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="a", nodes=1, run="run-a"), 0.0)
    report = QuarantineReport(job="a", node="n1", failure_class="node_lost", key="a#run-a#i 1")
    report_quarantine(state, cfg, report, 1.0)
    found = replace(state, cfg, ReplaceRequest(job="a", lost="n1", key="a#n1@gen 1"), 2.0)
    assert found is not None and state.record(found.name).run == "run-a"
    # The same run asking for its lease again (a retried call) gets what it holds now.
    assert names(lease(state, cfg, LeaseRequest(job="a", nodes=1, run="run-a"), 3.0).spares) == [
        found.name
    ]


def test_a_late_release_of_an_earlier_run_never_frees_a_later_runs_nodes() -> None:
    cfg = config()
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="a", nodes=2, run="run-b"), 1.0)
    assert release(state, cfg, ReleaseRequest(job="a", run="run-a"), 2.0) == "released 0 node(s)"
    assert len(state.held_by("a")) == 2
    assert release(state, cfg, ReleaseRequest(job="a", run="run-b"), 3.0) == "released 2 node(s)"


def test_fleet_state_written_before_runs_were_named_still_loads() -> None:
    old = {
        "nodes": [
            {"spec": {"name": "n1"}, "state": "leased", "job": "llama", "role": "node"},
            {"spec": {"name": "n2"}, "state": "healthy"},
        ],
        "runs": 3,
    }
    state = FleetState.model_validate(old)
    assert state.record("n1").run == "" and state.held_by("llama")
    assert LeaseRequest.model_validate({"job": "x", "nodes": 1}).run == ""
    assert ReleaseRequest.model_validate({"job": "x"}).run == ""
    # The compact form leaves an empty run out, so new state reads in an old worker too.
    assert "run" not in state.record("n1").model_dump()


# ----------------------------------------------------------------- reports (issue 7)


def job_spec(name: str = "llama") -> JobSpec:
    return JobSpec.model_validate(
        {"name": name, "command": ["python", "t.py"], "workdir": "/w", "nodes": [{"name": "x"}]}
    )


def test_a_report_key_names_the_run_so_a_new_starts_failure_counts() -> None:
    # The audit's repro: start 1's incident 1 on n1 and start 2's incident 1 on n1 had
    # the same key, so the second was "already reported": not quarantined, not counted.
    cfg = config(
        nodes=[{"name": f"n{i}"} for i in (1, 2, 3)],
        probation={"health_command": ["/bin/true"]},
    )
    spec = job_spec()
    first, second = JobState(run_key="run-a"), JobState(run_key="run-b")
    key_1, key_2 = report_key(spec, first, "incident 1"), report_key(spec, second, "incident 1")
    assert key_1 == "llama#run-a#incident 1" and key_1 != key_2
    assert report_key(spec, JobState(), "incident 1") == "llama#incident 1"  # no run key
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="llama", nodes=1, run="run-a"), 1.0)
    report = QuarantineReport(
        job="llama", node="n1", failure_class="gpu_hardware", reason="Xid 79", key=key_1
    )
    assert report_quarantine(state, cfg, report, 2.0) == "n1 quarantined"
    release(state, cfg, ReleaseRequest(job="llama", fenced=["n1"], run="run-a"), 10.0)
    for i in range(3):
        probation_result(state, cfg, "n1", True, "", 20.0 + i)
    lease(state, cfg, LeaseRequest(job="llama", nodes=3, run="run-b"), 100.0)
    again = report.model_copy(update={"reason": "Xid 79 again", "key": key_2})
    assert report_quarantine(state, cfg, again, 200.0) == "n1 quarantined (now a lemon)"
    assert states(state)["n1"] == ("quarantined", "llama")
    assert counting_incidents(state.record("n1"), cfg.lemon, 200.0) == 2
    # A retried report of the same run's incident is still one incident.
    assert report_quarantine(state, cfg, again, 201.0) == "n1: already reported"


# ------------------------------------------------------- freeing an orphan (issue 6)


def orphaned(cfg: FleetConfig) -> FleetState:
    """Job gone leased n1 and n2, then ended without a release that reached the fleet."""
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="gone", nodes=2, run="run-g"), 1.0)
    return state


def test_an_orphaned_lease_is_freed_into_quarantine_then_returned_node_by_node() -> None:
    cfg = config(nodes=[{"name": "n1"}, {"name": "n2"}])
    state = orphaned(cfg)
    # The audit's sequence: nothing the CLI had could free it.
    with pytest.raises(FleetRefusal, match="in service"):
        return_node(state, cfg, ReturnRequest(node="n1", fenced=True), 2.0)
    reply = release_orphan(state, cfg, OrphanRelease(job="gone"), 3.0)
    assert "n1, n2 quarantined, not fenced" in reply
    assert "'lazarus fleet return NODE --fenced --fleet f'" in reply
    assert states(state) == {"n1": ("quarantined", "gone"), "n2": ("quarantined", "gone")}
    with pytest.raises(FleetRefusal, match="not fenced"):
        return_node(state, cfg, ReturnRequest(node="n1"), 4.0)
    assert "healthy again" in return_node(state, cfg, ReturnRequest(node="n1", fenced=True), 5.0)
    got = lease(state, cfg, LeaseRequest(job="next", nodes=1, run="run-n"), 6.0)
    assert names(got.nodes) == ["n1"]
    assert not any(i.failure_class == "operator" for i in state.record("n2").incidents)


def test_an_orphaned_lease_the_operator_vouches_for_goes_straight_back() -> None:
    cfg = config(nodes=[{"name": "n1"}, {"name": "n2"}, {"name": "n3"}])
    state = orphaned(cfg)
    drain(state, cfg, DrainRequest(node="n2", reason="fan"), 2.0)
    reply = release_orphan(state, cfg, OrphanRelease(job="gone", fenced=True), 3.0)
    assert reply == "job gone: released 1 node(s)"
    assert states(state)["n1"] == ("healthy", None)
    assert state.record("n2").drained  # the pending drain still happens
    with pytest.raises(FleetRefusal, match="holds no leased node"):
        release_orphan(state, cfg, OrphanRelease(job="gone"), 4.0)
    assert state.log[-1].what == "lease freed by operator (fenced)"


def test_a_freed_lease_then_vouched_for_starts_probation() -> None:
    cfg = config(nodes=[{"name": "n1"}, {"name": "n2"}])
    state = orphaned(cfg)
    release_orphan(state, cfg, OrphanRelease(job="gone"), 2.0)
    reply = release_orphan(state, cfg, OrphanRelease(job="gone", fenced=True), 3.0)
    assert "n1, n2 fenced by operator (on probation)" in reply
    assert states(state)["n1"] == ("probation", None)
