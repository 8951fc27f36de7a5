"""A job's side of its fleet (``spec.fleet``): lease at start, report each quarantine,
ask for a replacement when no spare is left, hand fenced quarantined nodes back while
it runs, release at the end.

The job calls the fleet through activities (``FLEET_LEASE``, ``FLEET_REPORT``,
``FLEET_RELEASE``) that send updates with the worker's client: a workflow cannot
call another workflow's update, and a signal cannot answer (a replacement is an
answer). The reply is recorded in the job's history, so replay never asks again.

The fleet is a memory, not a dependency: once the job holds its nodes, a fleet that
is down or refuses only costs a line of evidence (``fleet_notes`` and the incident),
and the job goes on with what it holds, its own spares, and its usual policy (shrink,
or an operator). Only the first lease must succeed: without it the job has no nodes.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from lazarus.domain.activity_refs import (
        FLEET_HAND_BACK,
        FLEET_LEASE,
        FLEET_RELEASE,
        FLEET_REPORT,
    )
    from lazarus.domain.contracts import FailureReport
    from lazarus.domain.fleet import (
        FLEET_REFUSED,
        FleetHandBackCall,
        FleetLeaseCall,
        FleetReleaseCall,
        FleetReportCall,
        HandBackRequest,
        Lease,
        LeaseRequest,
        QuarantineReport,
        ReleaseRequest,
    )
    from lazarus.domain.spec import FleetLeaseSpec, JobSpec, NodeSpec
    from workflows.activity_calls import cause, execute
    from workflows.patches import (
        PATCH_FLEET,
        PATCH_FLEET_HAND_BACK,
        PATCH_FLEET_WAIT_FOR_NODE,
        PATCH_FLEET_WAITS_ONLY_FOR_NODES,
    )
    from workflows.state import JobState, Phase

MAX_FLEET_NOTES = 50

LEASE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=10,
    non_retryable_error_types=[FLEET_REFUSED],
)
"""A fleet that is restarting gets a little time; a refusal (too few healthy nodes)
is final: the job fails at once, saying why."""
CALL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=2),
    maximum_attempts=3,
    non_retryable_error_types=[FLEET_REFUSED],
)
"""Reports and hand-backs try briefly: a running job must not wait on its fleet."""
CALL_TIMEOUT = timedelta(seconds=15)
RELEASE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=0,
    non_retryable_error_types=[FLEET_REFUSED],
)
"""A release retries (issue 26): three tries over three seconds missed a fleet that
was continuing as new, restarting or busy, and the job's nodes stayed leased to it
for good. The job has ended, so nothing waits on it but the workflow's close; a
fleet gone for longer than :data:`RELEASE_WINDOW` leaves the note that names
``lazarus fleet release``."""
RELEASE_WINDOW = timedelta(days=1)
"""How long a job's release keeps trying (schedule-to-close)."""


def fleet_of(spec: JobSpec) -> FleetLeaseSpec | None:
    """The job's fleet, and only then is :data:`PATCH_FLEET` consulted."""
    return spec.fleet if spec.fleet is not None and workflow.patched(PATCH_FLEET) else None


def hands_back(spec: JobSpec) -> bool:
    """The job gives fenced quarantined nodes back while it runs (``fleet.hand_back``;
    only such a job consults :data:`PATCH_FLEET_HAND_BACK`)."""
    fleet = fleet_of(spec)
    return fleet is not None and fleet.hand_back and workflow.patched(PATCH_FLEET_HAND_BACK)


def loss_key(spec: JobSpec, state: JobState, lost: str) -> str:
    """One loss of ``lost``: a node is lost at most once a generation, and every ask
    for it until the next launch (a retried call, the tries while the job waits for
    nodes) is the same loss."""
    return f"{spec.job_id}#{lost}@gen {state.generation}"


def nodes_to_replace(spec: JobSpec, state: JobState) -> list[str]:
    """While the job is short of nodes: the quarantined nodes it still holds whose slots
    are empty, newest first, one per missing node. The fleet's replacement is keyed by
    the loss (:func:`loss_key`), so asking again for the same one never leases two."""
    pool = state.pool
    needed = spec.min_nodes or len(spec.nodes)
    missing = needed - len(pool.active) - len(pool.spares)
    if missing <= 0:
        return []
    return [q.node for q in reversed(pool.quarantined)][:missing]


def waits_on_fleet(spec: JobSpec, state: JobState) -> float | None:
    """Seconds until the job asks its fleet again, while it waits for an operator only
    because it is short of nodes; None when it waits for a person (no fleet, paused,
    short of nothing, escalated for another reason such as a spent budget or a crash
    loop, or a history from before :data:`PATCH_FLEET_WAIT_FOR_NODE`)."""
    fleet = fleet_of(spec)
    if fleet is None or state.phase != Phase.NEEDS_OPERATOR:
        return None
    if not nodes_to_replace(spec, state) or not workflow.patched(PATCH_FLEET_WAIT_FOR_NODE):
        return None
    if not state.waits_for_node and workflow.patched(PATCH_FLEET_WAITS_ONLY_FOR_NODES):
        return None
    return fleet.retry_s


async def ask_again(spec: JobSpec, state: JobState, fleet: FleetLeaseSpec) -> JobSpec:
    """One more try for the nodes the job is short of: each one the fleet has now joins
    the job's spares. Returns the job's spec, with them."""
    evidence: list[str] = []
    for lost in nodes_to_replace(spec, state):
        found = await report_loss(
            spec, state, fleet, report=None, replace=lost, evidence=evidence, retry=True
        )
        if found is None:
            break  # the fleet has none now: the next try asks again
        spec = _take_spare(spec, state, found)
    incident = state.current_incident
    if incident is not None and evidence:
        incident.add_evidence(evidence)
    return spec


def refused(err: ActivityError) -> bool:
    """The fleet answered no (``FleetRefused``), as opposed to not answering at all."""
    failure = err.cause
    return isinstance(failure, ApplicationError) and failure.type == FLEET_REFUSED


def trouble(err: ActivityError) -> str:
    """How a failed fleet call is worded in the notes: a refusal is not an outage."""
    return f"{'refused' if refused(err) else 'unreachable'}: {cause(err)}"


def note(state: JobState, line: str, evidence: list[str] | None = None) -> None:
    """What the fleet said or did, where ``status`` shows it (a line the same as the
    last is kept once), and in ``evidence`` (the lines the caller files on the
    incident the call was made for)."""
    workflow.logger.info("fleet: %s", line)
    if state.fleet_notes[-1:] != [line]:  # a retry that meets the same answer: once
        state.fleet_notes = [*state.fleet_notes, line][-MAX_FLEET_NOTES:]
    if evidence is not None:
        evidence.append(f"fleet: {line}")


def leased_spec(spec: JobSpec, fleet: FleetLeaseSpec, lease: Lease) -> JobSpec:
    """The job as it runs from now on: the fleet's nodes (in rank order) and spares."""
    return spec.model_copy(
        update={
            "nodes": lease.nodes,
            "spares": lease.spares,
            "fleet": fleet.model_copy(update={"leased": True}),
        }
    )


async def lease_nodes(spec: JobSpec, state: JobState, fleet: FleetLeaseSpec) -> Lease | str:
    """Lease the job's nodes for this start (``state.run_key``: a retry by the same start
    gets the same lease, another start's lease is refused); the reason as a string when
    the fleet refused or never answered (the job then fails: it holds nothing to run on)."""
    try:
        return await execute(
            FLEET_LEASE,
            FleetLeaseCall(
                fleet=fleet.name,
                request=LeaseRequest(
                    job=spec.job_id,
                    nodes=fleet.nodes,
                    spares=fleet.spares,
                    run=state.run_key or "",
                ),
            ),
            start_to_close_timeout=CALL_TIMEOUT,
            retry_policy=LEASE_RETRY,
            summary=f"lease {fleet.nodes}+{fleet.spares} node(s) from fleet {fleet.name}",
        )
    except ActivityError as err:
        return f"fleet {fleet.name}: no lease: {cause(err)}"


async def report_loss(
    spec: JobSpec,
    state: JobState,
    fleet: FleetLeaseSpec,
    *,
    report: QuarantineReport | None,
    replace: str | None,
    evidence: list[str],
    retry: bool = False,
) -> NodeSpec | None:
    """Tell the fleet a node is quarantined, ask for a node in place of ``replace``, or
    both. None: no replacement (none asked, the fleet had none, refused, or did not
    answer: recorded either way, in ``state.fleet_notes`` and in ``evidence``). A
    ``retry`` that finds none records nothing: the first answer said so already."""
    what = f"{report.node} quarantined ({report.failure_class})" if report else ""
    try:
        reply = await execute(
            FLEET_REPORT,
            FleetReportCall(
                fleet=fleet.name,
                job=spec.job_id,
                report=report,
                replace=replace,
                replace_key=loss_key(spec, state, replace) if replace else "",
            ),
            start_to_close_timeout=CALL_TIMEOUT,
            retry_policy=CALL_RETRY,
            summary=f"fleet {fleet.name}: {what or f'a node in place of {replace}'}",
        )
    except ActivityError as err:
        note(state, f"{trouble(err)}; going on with what the job holds", evidence)
        return None
    if reply.note:
        note(state, reply.note, evidence)
    if replace is None:
        return None
    found = reply.replacement
    if found is not None or not retry:
        note(state, f"replacement for {replace}: {found.name if found else 'none left'}", evidence)
    return found


async def release_nodes(spec: JobSpec, state: JobState, fleet: FleetLeaseSpec) -> None:
    """Give every node this start leased back; the quarantined ones the job's stops
    fenced may start probation. Retried for :data:`RELEASE_WINDOW`; past it (or
    refused) the note names the operator's way out, ``lazarus fleet release``, which
    works once this workflow has closed."""
    fenced = [q.node for q in state.pool.quarantined if q.fenced]
    try:
        reply = await execute(
            FLEET_RELEASE,
            FleetReleaseCall(
                fleet=fleet.name,
                request=ReleaseRequest(job=spec.job_id, fenced=fenced, run=state.run_key or ""),
            ),
            start_to_close_timeout=CALL_TIMEOUT,
            schedule_to_close_timeout=RELEASE_WINDOW,
            retry_policy=RELEASE_RETRY,
            summary=f"release the nodes to fleet {fleet.name}",
        )
    except ActivityError as err:
        note(
            state,
            f"release failed ({trouble(err)}); once this job has ended, free its nodes with "
            f"'lazarus fleet release {spec.job_id} --fleet {fleet.name}'",
        )
        return
    note(state, reply.note)


async def hand_back_fenced(spec: JobSpec, state: JobState, fleet: FleetLeaseSpec) -> None:
    """Give the fleet the quarantined nodes the job's stops have fenced, so probation
    (or an operator's ``fleet return``) can bring them back to any job, this one
    included, without waiting for this job to end. A fleet that refuses or does not
    answer leaves them with the job; the next launch tries again, and the release at
    the end gives them back as before."""
    fenced = [q.node for q in state.pool.quarantined if q.fenced]
    if not fenced:
        return
    try:
        reply = await execute(
            FLEET_HAND_BACK,
            FleetHandBackCall(
                fleet=fleet.name, request=HandBackRequest(job=spec.job_id, nodes=fenced)
            ),
            start_to_close_timeout=CALL_TIMEOUT,
            retry_policy=CALL_RETRY,
            summary=f"hand {', '.join(fenced)} back to fleet {fleet.name}",
        )
    except ActivityError as err:
        note(state, f"kept {', '.join(fenced)} (hand back {trouble(err)})")
        return
    state.pool.forget(reply.gone)
    gone = [n for n in state.handed_back if n not in reply.gone]
    state.handed_back = [*gone, *reply.gone][-MAX_FLEET_NOTES:]
    if reply.note:
        note(state, reply.note)


async def take_lease(spec: JobSpec, state: JobState, fleet: FleetLeaseSpec) -> JobSpec | str:
    """A new job's nodes: lease them and put them in the pool. Returns the job's spec
    as it runs from now on, or why there is no lease."""
    lease = await lease_nodes(spec, state, fleet)
    if isinstance(lease, str):
        note(state, lease)
        return lease
    state.pool.active = [n.name for n in lease.nodes]
    state.pool.spares = [n.name for n in lease.spares]
    lemons = (
        f" (lemons excluded: {', '.join(lease.excluded_lemons)})" if lease.excluded_lemons else ""
    )
    note(
        state,
        f"leased nodes {', '.join(state.pool.active)}, spares "
        f"{', '.join(state.pool.spares) or 'none'} from {fleet.name}{lemons}",
    )
    return leased_spec(spec, fleet, lease)


async def tell_fleet(
    spec: JobSpec,
    state: JobState,
    fleet: FleetLeaseSpec,
    node: str,
    failure_class: str,
    reason: str,
) -> JobSpec:
    """Report ``node``'s quarantine to the fleet (filed on the open incident) and, when it
    trains and the job has no spare of its own left, ask for one. Returns the job's
    spec, with the fleet's spare when there is one."""
    incident = state.current_incident
    occasion = f"incident {incident.id}" if incident is not None else f"gen {state.generation}"
    report = QuarantineReport(
        job=spec.job_id,
        node=node,
        failure_class=failure_class,
        reason=reason,
        key=report_key(spec, state, occasion),
    )
    lines: list[str] = []
    spec = await _call_fleet(spec, state, fleet, node, report, lines)
    if incident is not None:
        incident.add_evidence(lines)
    return spec


def report_key(spec: JobSpec, state: JobState, occasion: str) -> str:
    """A quarantine report's key, ``job#run-<key>#incident N``: incident ids and
    generations start at 1 again with each start of a job name, so without the run a
    new start's first failure on a node looked like a retry of the earlier start's
    report and was ignored (issue 26). Jobs from before runs were named keep
    ``job#incident N``."""
    run = f"#{state.run_key}" if state.run_key else ""
    return f"{spec.job_id}{run}#{occasion}"


async def ask_for_spare(
    spec: JobSpec, state: JobState, fleet: FleetLeaseSpec, failure: FailureReport
) -> tuple[JobSpec, FailureReport]:
    """A node failed and the job has no spare of its own left: ask the fleet for one
    before the playbook weighs the failure, so the playbook and the swap see it. Called
    before the failure's incident exists: the fleet's answer goes into the failure's
    evidence, and so into that incident (not into one still open from before)."""
    if failure.node is None:
        return spec, failure
    lines: list[str] = []
    spec = await _call_fleet(spec, state, fleet, failure.node, None, lines)
    if lines:
        # After the root cause, ahead of log tails that the incident's cap may cut.
        evidence = [*failure.evidence[:1], *lines, *failure.evidence[1:]]
        failure = failure.model_copy(update={"evidence": evidence})
    return spec, failure


async def _call_fleet(
    spec: JobSpec,
    state: JobState,
    fleet: FleetLeaseSpec,
    node: str,
    report: QuarantineReport | None,
    evidence: list[str],
) -> JobSpec:
    """Send ``report`` (if any) and, when ``node`` trains and no spare of the job's own
    is left, ask for a replacement: it joins the job's spares."""
    pool = state.pool
    wanted = node if node in pool.active and not pool.spares else None
    if report is None and wanted is None:
        return spec
    found = await report_loss(spec, state, fleet, report=report, replace=wanted, evidence=evidence)
    return spec if found is None else _take_spare(spec, state, found)


def _take_spare(spec: JobSpec, state: JobState, found: NodeSpec) -> JobSpec:
    """The fleet's replacement joins the job's spares. A node the job handed back may
    come back repaired: the spec still knows it, and it joins the spares again."""
    pool = state.pool
    known = {n.name for n in (*spec.nodes, *spec.spares)}
    if found.name in known:
        if hands_back(spec) and found.name not in pool.held():
            pool.spares.append(found.name)
            state.handed_back = [n for n in state.handed_back if n != found.name]
        return spec
    pool.spares.append(found.name)
    return spec.model_copy(update={"spares": [*spec.spares, found]})
