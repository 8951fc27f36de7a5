"""A failure as the playbook sees it: the context ``playbook.decide`` weighs, and a node
the launch could not reach, turned into the failure the playbook handles.

Pure functions (``tests/unit/test_failures.py``), so the workflow class only runs
the turn: open the incident, decide, stop, move nodes, relaunch.
"""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from lazarus.domain.contracts import FailureReport
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.spec import JobSpec
from workflows.playbook import FailureContext
from workflows.state import JobState

NODE_UNREACHABLE = "NodeUnreachable"
"""The launch activity's error type for a node it could not reach (details: the node)."""
RANKS_WOULD_NOT_DIE = "RanksWouldNotDie"
"""The launch activity's error type when its fencing (a rejoin's carry) found ranks of
an older generation alive after SIGKILL and started nothing (details: their nodes)."""


def failure_context(
    spec: JobSpec,
    state: JobState,
    failure: FailureReport,
    now: float,
    *,
    fast_path: bool = False,
) -> FailureContext:
    """What the playbook may weigh about ``failure``, taken before its incident is
    opened: earlier failures only, and the jitter keyed by the incident about to open."""
    return FailureContext(
        failure_class=failure.failure_class,
        rank=failure.rank,
        now=now,
        restart_times=state.restart_times,
        consecutive_failures=state.consecutive_failures,
        step_at_failure=failure.step_at_failure,
        previous=state.past_failures(),
        node=failure.node,
        spares_left=len(state.pool.spares),
        active_nodes=len(state.pool.active),
        min_nodes=spec.min_nodes,
        can_grow=spec.slurm is not None and spec.slurm.grow,
        jitter_key=f"{spec.job_id}:{state.next_incident_id}",
        no_backoff_after_progress=fast_path,
    )


def unreachable_failure(
    spec: JobSpec, state: JobState, node: str, cause: str, now: float
) -> FailureReport:
    """A node the launch could not reach, as the failure the playbook handles: a blip
    during a launch is a node failure (a spare, or an operator), never the job's end."""
    slot = state.pool.active.index(node) if node in state.pool.active else 0
    return FailureReport(
        kind="node_lost",
        failure_class=FailureClass.NODE_LOST,
        rank=slot * spec.nproc_per_node,
        node=node,
        fault_at=now,
        detected_at=now,
        step_at_failure=state.step,
        evidence=[f"launch of generation {state.generation}: {cause}"],
    )


def ranks_would_not_die(err: BaseException) -> bool:
    """Whether a launch refused because ranks of an older generation would not die."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, ApplicationError) and cause.type == RANKS_WOULD_NOT_DIE:
            return True
        cause = cause.__cause__
    return False


def unreachable_node(err: BaseException) -> str | None:
    """The node a launch could not reach, when that is why it failed."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, ApplicationError) and cause.type == NODE_UNREACHABLE:
            return str(cause.details[0]) if cause.details else None
        cause = cause.__cause__
    return None
