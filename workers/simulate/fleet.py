"""The fleet in the simulation: the real ``FleetWorkflow`` holds the cluster's nodes.

Rows with lemon exclusion do not pick their nodes themselves. They start the fleet
workflow beside the job, with the memory a fleet would hold after the look-back
window: every node's incidents of those weeks, drawn from the trace's own rates (a
lemon had about ``lemon_rate_factor`` times an ordinary node's), with their classes
in the profile's proportions. The job then names the fleet in its spec and runs the
fleet path unchanged: it leases its nodes and spares (the lemon rule and the
reputation order decide which), reports every quarantine, asks the fleet for a
replacement when its own spares are gone, and releases everything at the end.

The fleet holds just enough nodes: the first physical nodes of the cluster, in order,
until ``nodes + spares`` of them are not lemons. So, as in the rows without a fleet,
a job that runs out of spares waits for the operator, unless a lemon's incidents age
out of the window by then, and the fleet hands it out as a replacement as its rule
says it may.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from temporalio.client import Client

from lazarus.domain.api import FLEET_QUERY_STATUS, fleet_workflow_id
from lazarus.domain.fleet import (
    FleetConfig,
    FleetIncident,
    FleetInput,
    FleetState,
    FleetStatus,
    LemonRule,
    NodeRecord,
    ProbationSpec,
    Reputation,
    decay,
    is_lemon,
)
from lazarus.domain.spec import NodeSpec
from workers.simulate.clock import run_chain
from workers.simulate.model import DAY_S, ClusterTrace

FLEET_NAME = "sim-cluster"
PAST_JOB = "before-the-simulation"
"""The job the look-back incidents are filed under."""
LEMON_INCIDENTS = 2
"""The lemon rule's K: the trace's ``lemon_k``."""


@dataclass(frozen=True)
class FleetPlan:
    fleet: FleetInput
    lemons_at_start: list[str]
    """The fleet's nodes its rule excludes when the job leases."""


def fleet_plan(
    trace: ClusterTrace,
    wanted: int,
    lookback_days: float,
    start: float,
    seed: int,
    probation: ProbationSpec | None = None,
) -> FleetPlan:
    """The fleet's config and its memory at ``start`` (the clock's epoch seconds): the
    first physical nodes until ``wanted`` of them are not lemons. ``probation``: how
    the fleet checks handed-back nodes (None: off, an operator returns them)."""
    rule = LemonRule(incidents=LEMON_INCIDENTS, window_h=lookback_days * 24.0)
    half_life_h: float = FleetConfig.model_fields["reputation_half_life_h"].default
    window_s = lookback_days * DAY_S
    rng = random.Random(f"fleet-lookback-{seed}")  # the failure trace's draws stay as they are
    shares = [e.share for e in trace.events] or None
    records: list[NodeRecord] = []
    lemons: list[str] = []
    eligible = 0
    for name in trace.nodes:
        if eligible == wanted:
            break
        incidents = []
        for index in range(trace.lookback.get(name, 0)):
            share = rng.choice(shares) if shares else None
            incidents.append(
                FleetIncident(
                    failure_class=share.failure_class.value if share else "gpu_hardware",
                    at=start - rng.uniform(0.0, window_s),
                    job=PAST_JOB,
                    key=f"{PAST_JOB}#{name}#{index}",
                    reason=share.name if share else "",
                )
            )
        served = decay(Reputation(at=start - window_s), start, half_life_h, in_service=True)
        failures = sum(0.5 ** ((start - i.at) / 3600.0 / half_life_h) for i in incidents)
        record = NodeRecord(
            spec=NodeSpec(name=name),
            since=start,
            incidents=incidents,
            reputation=served.model_copy(update={"failures": failures}),
        )
        records.append(record)
        if is_lemon(record, rule, start):
            lemons.append(name)
        else:
            eligible += 1
    if eligible < wanted:
        raise ValueError(f"the cluster has {eligible} nodes that are not lemons; {wanted} wanted")
    config = FleetConfig(
        name=FLEET_NAME,
        nodes=[r.spec for r in records],
        lemon=rule,
        probation=probation or ProbationSpec(),
    )
    state = FleetState(nodes=records, started_at=start - window_s)
    return FleetPlan(FleetInput(config=config, state=state), lemons)


async def fleet_figures(client: Client, plan: FleetPlan, first_run: str) -> dict[str, object]:
    """What the fleet did for the job: its updates by name across its runs (its own
    log is bounded), and its node counts at the end."""
    updates: dict[str, int] = {}
    events = 0
    workflow_id = fleet_workflow_id(FLEET_NAME)
    chain = await run_chain(client, workflow_id, first_run)
    for run_id in chain:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        events += len(history.events)
        for event in history.events:
            if event.HasField("workflow_execution_update_accepted_event_attributes"):
                accepted = event.workflow_execution_update_accepted_event_attributes
                update = accepted.accepted_request.input.name
                updates[update] = updates.get(update, 0) + 1
    handle = client.get_workflow_handle(workflow_id)
    status: FleetStatus = await handle.query(FLEET_QUERY_STATUS, result_type=FleetStatus)
    return {
        "nodes": len(status.nodes),
        "lemons_at_start": len(plan.lemons_at_start),
        "updates": dict(sorted(updates.items())),
        "counts_at_end": status.counts,
        "history_events": events,
        "continue_as_new": len(chain) - 1,
    }
