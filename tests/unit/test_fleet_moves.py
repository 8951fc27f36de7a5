"""The fleet's pure moves: lease, report, replace, release, drain, return, probation,
the lemon rule and the decayed reputation (``lazarus.domain.fleet``)."""

from __future__ import annotations

import contextlib

import pytest

from lazarus.domain.fleet import (
    DrainRequest,
    FleetConfig,
    FleetRefusal,
    FleetState,
    HandBackRequest,
    LeaseRequest,
    NodeState,
    QuarantineReport,
    ReleaseRequest,
    ReplaceRequest,
    Reputation,
    ReturnRequest,
    decay,
    drain,
    fleet_status,
    hand_back,
    initial_state,
    is_lemon,
    lease,
    probation_result,
    release,
    replace,
    report_quarantine,
    return_node,
    scratch_copy,
)

pytestmark = pytest.mark.timeout(30)

HOUR = 3600.0


def config(**overrides: object) -> FleetConfig:
    data: dict[str, object] = {
        "name": "gpu-a",
        "nodes": [{"name": f"n{i}"} for i in range(4)],
        "spares": [{"name": "s0"}],
        "lemon": {"incidents": 1, "window_h": 24},
        "probation": {"health_command": ["true"], "passes": 2},
    }
    data.update(overrides)
    return FleetConfig.model_validate(data)


def states(state: FleetState) -> dict[str, str]:
    return {r.name: r.state.value for r in state.nodes}


def fail(state: FleetState, cfg: FleetConfig, job: str, node: str, at: float, key: str) -> None:
    report = QuarantineReport(job=job, node=node, failure_class="gpu_hardware", key=key)
    report_quarantine(state, cfg, report, at)


def test_a_lease_takes_healthy_nodes_never_the_shared_spares_and_is_idempotent() -> None:
    cfg = config()
    state = initial_state(cfg, 0.0)
    got = lease(state, cfg, LeaseRequest(job="a", nodes=2, spares=1), 1.0)
    assert [n.name for n in got.nodes] == ["n0", "n1"] and [n.name for n in got.spares] == ["n2"]
    again = lease(state, cfg, LeaseRequest(job="a", nodes=2, spares=1), 2.0)
    assert again.nodes == got.nodes and again.spares == got.spares
    assert states(state)["s0"] == "spare"
    with pytest.raises(FleetRefusal, match="1 healthy node"):
        lease(state, cfg, LeaseRequest(job="b", nodes=2), 3.0)


def test_replacement_comes_from_the_shared_pool_once_per_lost_node() -> None:
    cfg = config()
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="a", nodes=2), 0.0)
    lease(state, cfg, LeaseRequest(job="b", nodes=2), 0.0)
    fail(state, cfg, "a", "n0", 10.0, "a#1")
    first = replace(state, cfg, ReplaceRequest(job="a", lost="n0"), 11.0)
    assert first is not None and first.name == "s0"
    assert replace(state, cfg, ReplaceRequest(job="a", lost="n0"), 12.0) == first  # a retry
    fail(state, cfg, "b", "n2", 13.0, "b#1")
    assert replace(state, cfg, ReplaceRequest(job="b", lost="n2"), 14.0) is None
    assert fleet_status(state, cfg, 15.0).counts["spare"] == 0


def test_a_node_lost_a_second_time_gets_a_new_replacement_not_its_first_one() -> None:
    # n0 fails, s0 replaces it; n0 is handed back, repaired, and replaces n1; then n0
    # fails again. Keyed by the node alone, the fleet answered with s0 again: a node
    # the job already trains on, so the job had no spare and paged a person.
    cfg = config(lemon={"incidents": 3, "window_h": 24})
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="a", nodes=2), 0.0)
    fail(state, cfg, "a", "n0", 1.0, "a#1")
    first = replace(state, cfg, ReplaceRequest(job="a", lost="n0", key="a#n0@gen 1"), 2.0)
    assert first is not None and first.name == "s0"
    hand_back(state, cfg, HandBackRequest(job="a", nodes=["n0"]), 3.0)
    for at in (4.0, 5.0):
        probation_result(state, cfg, "n0", True, "ok", at)
    lease(state, cfg, LeaseRequest(job="b", nodes=1), 6.0)  # n2: n0 is left for a
    fail(state, cfg, "a", "n1", 7.0, "a#2")
    assert replace(state, cfg, ReplaceRequest(job="a", lost="n1", key="a#n1@gen 2"), 8.0) == (
        state.record("n0").spec
    )
    fail(state, cfg, "a", "n0", 9.0, "a#3")
    second = replace(state, cfg, ReplaceRequest(job="a", lost="n0", key="a#n0@gen 3"), 10.0)
    assert second is not None and second.name == "n3"
    again = replace(state, cfg, ReplaceRequest(job="a", lost="n0", key="a#n0@gen 3"), 11.0)
    assert again == second  # a retry of the same loss


def test_a_node_that_failed_in_one_job_is_a_lemon_for_the_next_until_the_window_passes() -> None:
    cfg = config()
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="a", nodes=1), 0.0)
    fail(state, cfg, "a", "n0", 10.0, "a#1")
    fail(state, cfg, "a", "n0", 11.0, "a#1")  # the same report retried: one incident
    assert len(state.record("n0").incidents) == 1
    release(state, cfg, ReleaseRequest(job="a", fenced=["n0"]), 20.0)
    return_node(state, cfg, ReturnRequest(node="n0"), 30.0)
    assert states(state)["n0"] in ("healthy", "spare")
    assert is_lemon(state.record("n0"), cfg.lemon, 40.0)
    got = lease(state, cfg, LeaseRequest(job="b", nodes=3), 40.0)
    assert "n0" not in [n.name for n in got.nodes] and got.excluded_lemons in ([], ["n0"])
    assert not is_lemon(state.record("n0"), cfg.lemon, 10.0 + 25 * HOUR)


def test_classes_outside_the_rule_do_not_make_a_lemon() -> None:
    cfg = config()
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="a", nodes=1), 0.0)
    report = QuarantineReport(job="a", node="n0", failure_class="user_code", key="a#1")
    report_quarantine(state, cfg, report, 1.0)
    assert not is_lemon(state.record("n0"), cfg.lemon, 2.0)
    with pytest.raises(FleetRefusal, match="unknown incident class"):
        report_quarantine(state, cfg, report.model_copy(update={"failure_class": "x"}), 3.0)


def test_an_unfenced_node_is_never_probed_and_a_returning_node_refills_the_spare_pool() -> None:
    cfg = config()
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="a", nodes=2), 0.0)
    fail(state, cfg, "a", "n0", 1.0, "a#1")
    assert replace(state, cfg, ReplaceRequest(job="a", lost="n0"), 2.0) is not None  # s0
    release(state, cfg, ReleaseRequest(job="a", fenced=[]), 3.0)
    assert states(state)["n0"] == "quarantined"  # its stale ranks may still run
    # the released nodes refill the empty spare pool (target 1) before the healthy ones
    assert sorted(states(state).values()).count("spare") == 1


def test_probation_counts_passes_and_a_failure_restarts_the_count() -> None:
    cfg = config()
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="a", nodes=1), 0.0)
    fail(state, cfg, "a", "n0", 1.0, "a#1")
    release(state, cfg, ReleaseRequest(job="a", fenced=["n0"]), 2.0)
    assert states(state)["n0"] == "probation"
    probation_result(state, cfg, "n0", True, "", 3.0)
    probation_result(state, cfg, "n0", False, "Xid 79", 4.0)
    probation_result(state, cfg, "n0", True, "", 5.0)
    assert states(state)["n0"] == "probation"
    probation_result(state, cfg, "n0", True, "", 6.0)
    assert states(state)["n0"] == "healthy"  # the spare pool is full (s0 still there)


def test_without_a_health_command_a_quarantined_node_waits_for_return() -> None:
    cfg = config(probation={})
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="a", nodes=1), 0.0)
    fail(state, cfg, "a", "n0", 1.0, "a#1")
    release(state, cfg, ReleaseRequest(job="a", fenced=["n0"]), 2.0)
    assert states(state)["n0"] == "quarantined"
    assert "healthy" in return_node(state, cfg, ReturnRequest(node="n0"), 3.0)


def test_a_running_job_hands_back_fenced_nodes_for_probation_once() -> None:
    cfg = config()
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="a", nodes=3), 0.0)
    fail(state, cfg, "a", "n0", 10.0, "a#1")
    reply = hand_back(state, cfg, HandBackRequest(job="a", nodes=["n0", "n1"]), 20.0)
    # n0 goes on probation at once; n1 was never reported, so the job keeps it.
    assert states(state)["n0"] == "probation" and states(state)["n1"] == "leased"
    assert reply.gone == ["n0"] and "n1 still leased here" in reply.note
    # A retried call takes nothing twice, and says so.
    again = hand_back(state, cfg, HandBackRequest(job="a", nodes=["n0"]), 21.0)
    assert again.gone == ["n0"] and "before" in again.note
    probation_result(state, cfg, "n0", True, "", 30.0)
    probation_result(state, cfg, "n0", True, "", 40.0)
    assert states(state)["n0"] == "healthy"  # the job still runs: no need to wait for it


def test_a_hand_back_without_probation_leaves_the_node_for_return_and_refuses_others() -> None:
    cfg = config(probation={})
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="a", nodes=2), 0.0)
    lease(state, cfg, LeaseRequest(job="b", nodes=2), 0.0)
    fail(state, cfg, "a", "n0", 10.0, "a#1")
    with pytest.raises(FleetRefusal, match="n2 is leased to job b"):
        hand_back(state, cfg, HandBackRequest(job="a", nodes=["n0", "n2"]), 20.0)
    assert states(state)["n0"] == "quarantined"  # the refusal changed nothing
    with pytest.raises(FleetRefusal, match="not in this fleet"):
        hand_back(state, cfg, HandBackRequest(job="a", nodes=["x9"]), 20.0)
    hand_back(state, cfg, HandBackRequest(job="a", nodes=["n0"]), 20.0)
    record = state.record("n0")
    assert record.state == NodeState.QUARANTINED and record.fenced and record.job is None
    assert "again" in return_node(state, cfg, ReturnRequest(node="n0"), 30.0)


def test_drain_takes_a_free_node_at_once_and_a_leased_one_when_its_job_releases_it() -> None:
    cfg = config()
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="a", nodes=1), 0.0)
    assert "drained" in drain(state, cfg, DrainRequest(node="n3", reason="bad fan"), 1.0)
    assert states(state)["n3"] == "quarantined"
    with pytest.raises(FleetRefusal, match="already drained"):
        drain(state, cfg, DrainRequest(node="n3", reason="again"), 2.0)
    assert "when the job releases" in drain(state, cfg, DrainRequest(node="n0", reason="x"), 3.0)
    assert states(state)["n0"] == "leased"
    release(state, cfg, ReleaseRequest(job="a"), 4.0)
    assert states(state)["n0"] == "quarantined" and state.record("n0").drained
    # a drained node never comes back by probation, only by return
    assert states(state)["n0"] == "quarantined"
    return_node(state, cfg, ReturnRequest(node="n0"), 5.0)
    assert states(state)["n0"] == "healthy"


def test_return_refuses_nodes_in_service_unfenced_or_unknown() -> None:
    cfg = config()
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="a", nodes=1), 0.0)
    with pytest.raises(FleetRefusal, match="in service"):
        return_node(state, cfg, ReturnRequest(node="n0"), 1.0)
    with pytest.raises(FleetRefusal, match="already in service"):
        return_node(state, cfg, ReturnRequest(node="n1"), 1.0)
    fail(state, cfg, "a", "n0", 2.0, "a#1")
    with pytest.raises(FleetRefusal, match="not fenced"):
        return_node(state, cfg, ReturnRequest(node="n0"), 3.0)
    with pytest.raises(FleetRefusal, match="not in this fleet"):
        return_node(state, cfg, ReturnRequest(node="zz"), 3.0)


def test_a_node_its_job_never_fenced_returns_only_when_the_operator_vouches() -> None:
    cfg = config()
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="a", nodes=2), 0.0)
    fail(state, cfg, "a", "n0", 1.0, "a#1")
    with pytest.raises(FleetRefusal, match="fenced when that job ends"):
        return_node(state, cfg, ReturnRequest(node="n0"), 2.0)
    # The host was dead when job a ended: its stops never reached it.
    release(state, cfg, ReleaseRequest(job="a", fenced=[]), 3.0)
    assert states(state)["n0"] == "quarantined"
    assert "--fenced" in state.log[-2].what and state.log[-2].node == "n0"
    with pytest.raises(FleetRefusal, match="never reached it"):
        return_node(state, cfg, ReturnRequest(node="n0"), 4.0)
    assert "healthy again" in return_node(state, cfg, ReturnRequest(node="n0", fenced=True), 5.0)
    assert state.log[-1].what == "returned by operator (was quarantined, fenced by operator)"
    # Back in service, but still a lemon: a new lease leaves it out.
    assert [n.name for n in lease(state, cfg, LeaseRequest(job="b", nodes=1), 6.0).nodes] != ["n0"]
    assert is_lemon(state.record("n0"), cfg.lemon, 6.0)


def test_a_report_from_a_job_that_does_not_hold_the_node_is_refused() -> None:
    cfg = config()
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="a", nodes=1), 0.0)
    with pytest.raises(FleetRefusal, match="leased to job a"):
        fail(state, cfg, "b", "n0", 1.0, "b#1")
    with pytest.raises(FleetRefusal, match="not leased"):
        fail(state, cfg, "b", "n1", 1.0, "b#1")


def test_reputation_is_failures_per_node_hour_decayed_by_the_half_life() -> None:
    start = Reputation(at=0.0)
    served = decay(start, 10 * HOUR, half_life_h=1e9, in_service=True)
    assert served.hours == pytest.approx(10.0, rel=1e-6)
    failed = served.model_copy(update={"failures": 2.0})
    assert failed.rate() == pytest.approx(0.2)
    later = decay(failed, 10 * HOUR + 24 * HOUR, half_life_h=24.0, in_service=False)
    assert later.failures == pytest.approx(1.0) and later.hours == pytest.approx(5.0)
    assert later.rate() == pytest.approx(0.2)  # idle time forgets both alike
    assert Reputation().rate() is None


def test_the_lease_prefers_the_best_reputation() -> None:
    cfg = config(lemon={"incidents": 5, "window_h": 1})
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="a", nodes=4), 0.0)
    fail(state, cfg, "a", "n0", 5 * HOUR, "a#1")
    release(state, cfg, ReleaseRequest(job="a", fenced=["n0"]), 5 * HOUR)
    return_node(state, cfg, ReturnRequest(node="n0"), 5 * HOUR)
    got = lease(state, cfg, LeaseRequest(job="b", nodes=3), 6 * HOUR)
    assert "n0" not in [n.name for n in got.nodes]
    view = {v.name: v for v in fleet_status(state, cfg, 6 * HOUR).nodes}
    assert view["n0"].failures_per_node_hour is not None and not view["n0"].lemon


def test_config_refuses_repeated_names_unknown_classes_and_slurm_nodes() -> None:
    with pytest.raises(ValueError, match="repeated"):
        config(spares=[{"name": "n0"}])
    with pytest.raises(ValueError, match="unknown class"):
        config(lemon={"classes": ["gpu_hardwar"]})
    with pytest.raises(ValueError, match="slurm"):
        config(nodes=[{"name": "x", "launcher": "slurm"}], spares=[])
    assert NodeState.SPARE.value == "spare"


def test_a_move_tried_on_a_scratch_copy_leaves_the_fleet_as_it_was() -> None:
    """The update validators try each move on :func:`scratch_copy`, which shares what the
    records hold: a move that changed a list or a reputation in place would leak into
    the fleet's real state from a request that was only being validated."""
    cfg = config()
    state = initial_state(cfg, 0.0)
    lease(state, cfg, LeaseRequest(job="a", nodes=2, spares=1), 1.0)
    fail(state, cfg, "a", "n0", 2.0, "a#n0@gen 1")
    before = state.model_dump()
    moves = [
        lambda s: lease(s, cfg, LeaseRequest(job="b", nodes=1), 3.0),
        lambda s: fail(s, cfg, "a", "n1", 3.0, "a#n1@gen 2"),
        lambda s: replace(s, cfg, ReplaceRequest(job="a", lost="n0", key="a#n0@gen 1"), 3.0),
        lambda s: hand_back(s, cfg, HandBackRequest(job="a", nodes=["n0"]), 3.0),
        lambda s: release(s, cfg, ReleaseRequest(job="a"), 3.0),
        lambda s: drain(s, cfg, DrainRequest(node="n3", reason="bad fan"), 3.0),
        lambda s: probation_result(s, cfg, "n0", True, "ok", 3.0),
        lambda s: return_node(s, cfg, ReturnRequest(node="n0"), 3.0),
    ]
    for move in moves:
        with contextlib.suppress(FleetRefusal):
            move(scratch_copy(state))
        assert state.model_dump() == before
