"""Stop targets, fencing and planned-stop accounting are pure: no server, no ranks."""

from __future__ import annotations

from lazarus.domain.contracts import CheckpointRef, StopResult
from lazarus.domain.process_groups import UnkillableGroup
from lazarus.domain.spec import JobSpec, WarmStartSpec
from workflows.state import MAX_RECORDS, JobState, NodePool, PlannedStop
from workflows.stops import (
    checkpoint_evidence,
    end_of_run_targets,
    reached,
    record_planned_stop,
    settle_stop,
    stop_targets,
)

SPEC = JobSpec.model_validate(
    {
        "name": "j",
        "command": ["python", "t.py"],
        "workdir": "/w",
        "nodes": [{"name": "a"}, {"name": "b"}],
        "spares": [{"name": "s"}],
    }
)


def stopped(**fields: object) -> StopResult:
    return StopResult.model_validate(
        {"generations": [1], "signalled_groups": 1, "killed_groups": 0, **fields}
    )


def test_a_stop_reaches_active_and_unfenced_nodes_once_and_only_known_ones() -> None:
    pool = NodePool(active=["a", "b"], spares=["s"])
    pool.quarantine("b", "dead", at=1.0)
    pool.active.append("b")  # a node both active and unfenced is stopped once
    assert stop_targets(SPEC, pool, None) == ["a", "b"]
    assert stop_targets(SPEC, pool, ["s", "ghost", "s"]) == ["s"]


WIDE = JobSpec.model_validate(
    {**SPEC.model_dump(), "spares": [{"name": "s"}, {"name": "t"}, {"name": "u"}]}
)
"""Nodes a and b, spares s, t and u."""


def test_a_stop_remembers_every_node_it_targeted_once() -> None:
    state = JobState(pool=NodePool(active=["a", "b"]))
    settle_stop(state, ["a", "b"], stopped(), 1.0, whole_job=True)
    settle_stop(state, ["b", "s"], stopped(unreachable=["s"]), 2.0, whole_job=False)
    assert state.touched_nodes == ["a", "b", "s"]


def test_the_end_of_run_reaches_every_node_the_run_touched_wherever_it_went() -> None:
    """Issue 26 (audit, 10.): b ran ranks, was fenced and returned to the spares; s
    took its slot, failed, was fenced and handed back to the fleet. Both may still
    hold the run's zygote and /dev/shm snapshots: only the end of the run reaches
    them now. u, a spare that never ran anything, is left alone."""
    state = JobState(pool=NodePool(active=["a", "b"], spares=["s", "t", "u"]))
    pool = state.pool

    def stop() -> None:
        settle_stop(state, stop_targets(WIDE, pool, None), stopped(), 0.0, whole_job=True)

    stop()  # incident on b: generation 1 stopped on a, b
    pool.swap_out("b", "gpu_hardware", 1.0, None)
    stop()  # a pause on a, s: fences b
    pool.release("b")  # lazarus return: b is a spare again
    pool.swap_out("s", "gpu_hardware", 2.0, None)
    stop()  # fences s
    pool.forget(["s"])  # handed back to the fleet
    state.handed_back = ["s"]
    assert pool.active == ["a", "t"] and pool.spares == ["u", "b"]
    assert stop_targets(WIDE, pool, None) == ["a", "t"]
    assert end_of_run_targets(WIDE, state) == ["a", "t", "b", "s"]


def test_the_end_of_run_reaches_quarantined_and_handed_back_nodes_it_never_recorded() -> None:
    """A job whose state predates ``touched_nodes`` (carried by continue-as-new):
    its fenced and handed-back nodes are still revisited; names the spec no longer
    knows (an earlier Slurm allocation's) are not."""
    state = JobState(pool=NodePool(active=["a"], spares=["u"]), handed_back=["s", "gone"])
    state.pool.quarantine("b", "dead", at=1.0)
    state.pool.mark_fenced("b")
    state.pool.quarantine("t", "dead", at=2.0)
    assert end_of_run_targets(WIDE, state) == ["a", "t", "b", "s"]


def test_a_stop_fences_the_quarantined_nodes_it_reached() -> None:
    state = JobState(generation_live=True, pool=NodePool(active=["a"]))
    for node in ("b", "s", "x"):
        state.pool.quarantine(node, "dead", at=1.0)
    result = stopped(unreachable=["s"])
    assert settle_stop(state, ["a", "b", "s"], result, 2.0, whole_job=True) is None
    assert not state.generation_live and state.stuck_ranks is None
    assert state.pool.unfenced() == ["s", "x"]


def test_a_node_is_reached_unless_unreachable_or_its_ranks_would_not_die() -> None:
    stuck = UnkillableGroup(node="b", pgid=41, pids=[41], reason="state D")
    result = stopped(unreachable=["s"], unkillable=[stuck])
    assert [n for n in ("a", "b", "s") if reached(n, result)] == ["a"]


def test_fencing_one_node_leaves_the_generation_running() -> None:
    state = JobState(generation_live=True)
    settle_stop(state, ["b"], stopped(), 2.0, whole_job=False)
    assert state.generation_live


def test_ranks_that_would_not_die_quarantine_their_node_unfenced() -> None:
    state = JobState(pool=NodePool(active=["a", "b"], spares=["s"]))
    result = stopped(
        unkillable=[
            UnkillableGroup(node="b", pgid=41, pids=[41, 42], reason="state D"),
            UnkillableGroup(node="s", pgid=7, reason="not ours"),
        ]
    )
    stuck = settle_stop(state, ["a", "b", "s"], result, 3.0, whole_job=True)
    assert stuck == (
        "ranks would not die after SIGKILL: b: pgid 41 (pids 41, 42) state D; "
        "s: pgid 7 (pids ) not ours"
    )
    assert state.stuck_ranks == stuck
    assert state.pool.active == ["a"] and state.pool.spares == []
    assert [(q.node, q.reason, q.fenced) for q in state.pool.quarantined] == [
        ("b", "ranks would not die: pids 41, 42", False),
        ("s", "ranks would not die: pids ", False),
    ]


def test_a_stuck_node_already_quarantined_stays_unfenced_and_keeps_its_reason() -> None:
    state = JobState(pool=NodePool(active=["a"]))
    state.pool.quarantine("b", "dead", at=1.0)
    result = stopped(unkillable=[UnkillableGroup(node="b", pgid=1, pids=[1], reason="D")])
    settle_stop(state, ["a", "b"], result, 2.0, whole_job=True)
    [out] = state.pool.quarantined
    assert (out.node, out.reason, out.fenced) == ("b", "dead", False)


def test_a_planned_stop_with_its_checkpoint_costs_the_steps_after_the_save() -> None:
    state = JobState()
    record = record_planned_stop(
        state,
        "pause",
        requested_at=10.0,
        saved=CheckpointRef(step=50, path="/c/50"),
        saved_at=12.5,
        stopped=stopped(last_step=51),
        stopped_at=14.0,
    )
    assert state.planned_stops == [record]
    assert (record.reason, record.requested_at, record.stopped_at) == ("pause", 10.0, 14.0)
    assert (record.step_at_stop, record.checkpoint_step, record.checkpoint_s) == (51, 50, 2.5)
    assert record.steps_lost == 1


def unsaved(state: JobState, last_step: int | None, reason: str = "x") -> PlannedStop:
    """A planned stop whose just-in-time checkpoint did not arrive."""
    return record_planned_stop(
        state,
        reason,
        requested_at=1.0,
        saved=None,
        saved_at=9.0,
        stopped=stopped(last_step=last_step),
        stopped_at=9.5,
    )


def test_a_planned_stop_without_a_save_costs_the_steps_since_the_resume() -> None:
    record = unsaved(JobState(resume=CheckpointRef(step=30, path="/c/30")), 44)
    assert record.checkpoint_step is None and record.checkpoint_s is None
    assert record.steps_lost == 14
    assert unsaved(JobState(), None).steps_lost is None
    assert unsaved(JobState(), 5).steps_lost == 5  # from scratch


def test_planned_stops_are_bounded() -> None:
    state = JobState()
    for i in range(MAX_RECORDS + 3):
        unsaved(state, None, f"stop {i}")
    assert len(state.planned_stops) == MAX_RECORDS
    assert state.planned_stops[-1].reason == f"stop {MAX_RECORDS + 2}"


def test_the_checkpoint_evidence_line() -> None:
    assert checkpoint_evidence(12) == "just-in-time checkpoint at step 12"
    assert checkpoint_evidence(None) == "just-in-time checkpoint did not arrive in time"


def test_with_warm_starts_the_end_of_run_reaches_the_spares_that_never_ran_ranks() -> None:
    """A prewarmed spare holds the run's zygote without ever running a rank: the
    end-of-run stop reaches it. Without warm starts or the memory tier a spare holds
    nothing of the run, and is not contacted."""
    warm = WIDE.model_copy(update={"warm_start": WarmStartSpec(preload=["json"])})
    state = JobState(pool=NodePool(active=["a", "b"], spares=["s", "t"]))
    assert end_of_run_targets(warm, state) == ["a", "b", "s", "t"]
    assert end_of_run_targets(WIDE, state) == ["a", "b"]
