"""Operator messages (pause, resume, recover, drain, return): whether one can be taken
now, and what it asks the state machine to do.

Each check is a pure function of the state and the request that returns why the
message is refused, or None: the workflow's validators raise it, its signals record
it as ignored (``tests/unit/test_operator_requests.py``). Refusing early matters
because an accepted message is acted on later, at a turn of the state machine, where
a mistake (a typo'd node, a second queued recovery) could no longer be reported.
"""

from __future__ import annotations

from lazarus.domain.spec import JobSpec
from workflows.state import ForceRecover, JobState, NodeRequest, Phase

WAITING = (Phase.PAUSED, Phase.NEEDS_OPERATOR)
"""The phases that wait for an operator's resume (or recover)."""


def pause_refusal(phase: Phase, pause_in_progress: bool) -> str | None:
    """A pause is taken in any phase that is running or heading there. A duplicate,
    remembered, would pause the job again right after the operator's resume and leave
    it PAUSED for good."""
    if pause_in_progress:
        return "a pause is already in progress"
    if phase == Phase.NEEDS_OPERATOR:
        return "it waits for an operator already: resume or cancel it"
    if phase.is_terminal or phase == Phase.PAUSED:
        return f"the job is {phase.value}"
    return None


def resume_refusal(phase: Phase) -> str | None:
    """Only a job that waits for an operator can be resumed: a stray resume must not
    turn the next pause into a no-op or resume a later escalation."""
    if phase in WAITING:
        return None
    return f"the job is {phase.value}, not paused or waiting for an operator"


def queued_refusal(queued: ForceRecover | None, what: str) -> str | None:
    """One forced recovery (``recover`` or ``drain``) is queued at a time: a second
    would silently replace the first, which both callers were told is happening."""
    if queued is None:
        return None
    return (
        f"another recovery is already queued ({queued.reason}); send '{what}' after it has happened"
    )


def paused_refusal(state: JobState, what: str) -> str | None:
    """A paused job stays paused until ``resume``: a forced recovery or a drain would
    start ranks, and an operator who paused for maintenance expects none (before, a
    ``recover`` quietly resumed the job)."""
    if state.phase != Phase.PAUSED:
        return None
    return f"the job is paused: 'lazarus resume' it first, then {what}"


def recover_refusal(
    state: JobState,
    queued: ForceRecover | None,
    request: ForceRecover,
    *,
    paused_refuses: bool = True,
) -> str | None:
    """Why a forced recovery cannot be taken now, or None. An excluded node must be
    one this job runs on: a typo must not quarantine nothing and grow the world.
    ``paused_refuses``: False only to replay histories recorded before a paused job
    refused (:func:`paused_refusal`)."""
    if state.phase.is_terminal:
        return f"the job is {state.phase.value}"
    paused = paused_refusal(state, "recover") if paused_refuses else None
    if paused is not None:
        return paused
    queued_problem = queued_refusal(queued, f"recover: {request.reason}")
    if queued_problem is not None:
        return queued_problem
    node = request.exclude_node
    if node is None or node in state.pool.active:
        return None
    if node in state.pool.spares:
        return f"node {node!r} is a spare, not running this job"
    if node in [q.node for q in state.pool.quarantined]:
        return f"node {node!r} is already quarantined"
    return _not_running(node, state)


def drain_refusal(state: JobState, queued: ForceRecover | None, request: NodeRequest) -> str | None:
    """A drain moves one running node's ranks to a spare: the node must run this job."""
    queued_problem = queued_refusal(queued, f"drain {request.node}")
    if queued_problem is not None:
        return queued_problem
    if state.phase.is_terminal:
        return f"the job is {state.phase.value}"
    paused = paused_refusal(state, f"drain {request.node}")
    if paused is not None:
        return paused
    if request.node not in state.pool.active:
        return _not_running(request.node, state)
    return None


def return_refusal(state: JobState, request: NodeRequest, fleet: str | None = None) -> str | None:
    """Only a quarantined node can be returned to the spares. A fleet job gives its
    fenced quarantined nodes back to its fleet, and that is where they return from."""
    quarantined = [q.node for q in state.pool.quarantined]
    if request.node in quarantined:
        return None
    if fleet is not None and request.node in state.handed_back:
        return (
            f"node {request.node!r} was handed back to fleet {fleet}: "
            f"'lazarus fleet return {request.node} --fleet {fleet}' puts it in service"
        )
    return (
        f"node {request.node!r} is not quarantined; quarantined nodes: "
        f"{', '.join(quarantined) or 'none'}"
    )


def _not_running(node: str, state: JobState) -> str:
    return (
        f"node {node!r} is not running this job; active nodes: "
        f"{', '.join(state.pool.active) or 'none'}"
    )


def recover_reply(request: ForceRecover) -> str:
    """What the ``recover`` update answers once the request is queued."""
    without = f" without {request.exclude_node}" if request.exclude_node else ""
    return f"recovering{without} at the next turn: {request.reason}"


def drain_recovery(request: NodeRequest) -> ForceRecover:
    """A drain is a forced recovery that checkpoints first and excludes its node."""
    reason = request.reason or "drained by operator"
    return ForceRecover(
        reason=f"drain {request.node}: {reason}",
        exclude_node=request.node,
        checkpoint_first=True,
    )


def drain_reply(request: NodeRequest) -> str:
    return f"draining {request.node}: its ranks move to a spare at the next turn"


def reopen_pool(
    spec: JobSpec, state: JobState, force: ForceRecover | None, now: float
) -> str | None:
    """Leaving PAUSED or NEEDS_OPERATOR: quarantine the node a recover excludes, fill
    the lost slots with the nodes returned meanwhile, and say why the job still cannot
    go on (too few usable nodes), or None when it can."""
    pool = state.pool
    if force is not None and force.exclude_node in pool.active:
        pool.replace(force.exclude_node, f"excluded by operator: {force.reason}", now)
    pool.refill(len(spec.nodes))
    needed = spec.min_nodes or len(spec.nodes)
    if len(pool.active) >= needed:
        return None
    return (
        f"cannot resume: {len(pool.active)} usable nodes, the job needs {needed}; "
        "'lazarus return' a quarantined node or add spares"
    )
