"""The fleet row of the chaos matrix: what a job started again under the same name
must see after its first start ended hard (issue 26, defects 6-8).

The first start's workflow is terminated, so its lease is orphaned. A new start of the
name must be refused with the operator's way out (``lazarus fleet release JOB``),
never handed the old lease, and its own end must not free that lease. Once an operator
has released it, a third start leases afresh and ends with nothing held. These checks
read the fleet's own status and the job's, each a list of problems in words (empty:
it held); :mod:`tests.chaos.matrix` raises on any.
"""

from __future__ import annotations

from lazarus.domain.fleet_messages import FleetStatus
from lazarus.domain.fleet_state import NodeState
from workflows.state import JobStatus, Phase

FLEET_NODES = ("n0", "n1", "n2")
"""The cell's fleet: three local logical nodes, one more than the job leases, so a
refusal cannot be a shortage of nodes."""
LEASED_NODES = 2


def held_by(fleet: FleetStatus, job: str) -> list[str]:
    """The nodes the fleet has leased to ``job`` (any of its runs)."""
    return sorted(v.name for v in fleet.nodes if v.state == NodeState.LEASED and v.job == job)


def orphan_problems(fleet: FleetStatus, job: str, leased: list[str]) -> list[str]:
    """The first start's lease must still be held, exactly as it was leased: its
    workflow was terminated (no release ran), and nothing since may have freed or
    grown it (a refused start's own end releases only what that start leased)."""
    held = held_by(fleet, job)
    if held != sorted(leased):
        return [f"the fleet holds {held} for {job}, expected the orphaned lease {sorted(leased)}"]
    return []


def refusal_problems(status: JobStatus, launches: int, job: str, fleet: str) -> list[str]:
    """The second start: FAILED for want of a lease, the reason naming the command that
    frees the old one, and no rank launched (it was never handed the stale lease)."""
    problems: list[str] = []
    if status.phase != Phase.FAILED:
        problems.append(f"the new start ended {status.phase.value}, expected failed (refused)")
    reason = status.operator_reason or ""
    command = f"lazarus fleet release {job}"
    if command not in reason:
        problems.append(f"the refusal does not name {command!r}: {reason!r}")
    if fleet not in reason:
        problems.append(f"the refusal does not name fleet {fleet}: {reason!r}")
    if launches:
        problems.append(f"the refused start launched {launches} generation(s)")
    handed = sorted(set(status.nodes.active) & set(FLEET_NODES))
    if handed:  # (its pool is the spec's default local node until a lease lands)
        problems.append(f"the refused start runs on the fleet's nodes {handed}")
    return problems


def released_problems(fleet: FleetStatus, job: str, leased: list[str]) -> list[str]:
    """After ``fleet release --fenced``: the job holds nothing and its old nodes are
    healthy again (vouched fenced: nothing of the first start runs there)."""
    problems: list[str] = []
    held = held_by(fleet, job)
    if held:
        problems.append(f"{job} still holds {held} after the release")
    states = {v.name: v.state for v in fleet.nodes}
    unhealthy = {n: states.get(n) for n in leased if states.get(n) != NodeState.HEALTHY}
    if unhealthy:
        problems.append(f"released nodes not healthy: {unhealthy}")
    return problems


def lease_problems(status: JobStatus) -> list[str]:
    """The third start ran on a fresh lease of the right size, from the fleet."""
    active = status.nodes.active
    problems: list[str] = []
    if len(active) != LEASED_NODES:
        problems.append(f"the new start runs on {active}, expected {LEASED_NODES} nodes")
    if not set(active) <= set(FLEET_NODES):
        problems.append(f"the new start runs on {active}, not the fleet's nodes")
    return problems


def leftover_problems(fleet: FleetStatus, job: str) -> list[str]:
    """Once the last start ended: the job holds no node, and every node is healthy."""
    problems: list[str] = []
    held = held_by(fleet, job)
    if held:
        problems.append(f"{job} still holds {held} after it ended")
    other = {v.name: v.state.value for v in fleet.nodes if v.state != NodeState.HEALTHY}
    if other:
        problems.append(f"fleet nodes not healthy after the job ended: {other}")
    return problems
