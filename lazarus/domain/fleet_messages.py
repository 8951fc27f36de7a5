"""What crosses into the fleet workflow and back: the requests of its updates
(lease, report, replace, release, hand back, drain, return) and their replies, the
status query's view, and the activity calls a job makes into its fleet."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from lazarus.domain.fleet_state import FleetEvent, NodeState
from lazarus.domain.spec import NodeSpec


class LeaseRequest(BaseModel):
    job: str
    nodes: Annotated[int, Field(ge=1)]
    spares: Annotated[int, Field(ge=0)] = 0
    run: str = ""
    """The requesting start of ``job`` (its run key, ``run-<first run id>``, kept across
    continue-as-new). A retried lease is one with the same run; a job's name alone
    does not say whether an earlier start's lease is this one's. Empty from jobs from
    before runs were named."""


class Lease(BaseModel):
    """What a job holds: its training nodes in rank order, then its own spares."""

    nodes: list[NodeSpec]
    spares: list[NodeSpec] = Field(default_factory=list)
    excluded_lemons: list[str] = Field(default_factory=list)
    """Free nodes the lemon rule kept out of this lease."""


class ReleaseRequest(BaseModel):
    job: str
    fenced: list[str] = Field(default_factory=list)
    """Quarantined nodes the job's last stop confirmed empty: they may go on probation."""
    run: str = ""
    """The releasing start (:attr:`LeaseRequest.run`): a late release of an earlier start
    never frees a later start's nodes. Empty: every node leased to ``job``."""


class OrphanRelease(BaseModel):
    """``lazarus fleet release JOB``: an operator frees the nodes of a job whose workflow
    has closed without releasing them (terminated, or its release never reached the
    fleet). The client checks that the job's workflow is closed first: the fleet cannot."""

    job: str
    fenced: bool = False
    """The operator vouches that no rank of the job runs on its nodes any more (its last
    stop reached them, or they were checked or rebooted): they go back to service.
    Without it they are quarantined, not fenced: a terminated job's ranks may still run
    there, so each is checked and returned (``lazarus fleet return NODE --fenced``)."""


class HandBackRequest(BaseModel):
    """A running job gives back quarantined nodes its stops have fenced, so they need
    not wait for the job's end (weeks, for a large run) to be checked back into
    service: probation starts now, and a repaired node serves any job again."""

    job: str
    nodes: list[str] = Field(min_length=1)


class HandBackReply(BaseModel):
    gone: list[str] = Field(default_factory=list)
    """Nodes no longer the job's: taken now, or by an earlier (retried) call."""
    note: str = ""


class QuarantineReport(BaseModel):
    job: str
    node: str
    failure_class: str
    reason: str = ""
    key: str = ""
    """``job#incident``: the same key twice is counted once (a retried report)."""


class ReplaceRequest(BaseModel):
    job: str
    lost: str
    key: str = ""
    """One loss of ``lost`` (``job#node@gen N``): asked again with the same key, the
    fleet answers with the same node. Empty, as jobs from before sent it, the lost
    node's name alone was the key, so a node lost a second time (back from repair)
    got its first replacement again, a node the job already ran on, and no spare."""


class DrainRequest(BaseModel):
    node: str
    reason: str


class ReturnRequest(BaseModel):
    node: str
    fenced: bool = False
    """The operator vouches that no stale rank runs on the node (checked or rebooted):
    needed for a node its job's stops never reached, such as a host that was dead
    when the job ended."""


class NodeView(BaseModel):
    """A node as ``lazarus fleet nodes`` shows it."""

    name: str
    state: NodeState
    job: str | None = None
    role: str | None = None
    reason: str = ""
    failure_class: str | None = None
    since: float
    fenced: bool = False
    passes: int = 0
    lemon: bool = False
    incidents: int = 0
    """Incidents within the lemon window that count toward the rule."""
    failures_per_node_hour: float | None = None
    drain_pending: str | None = None


class FleetStatus(BaseModel):
    name: str
    counts: dict[str, int]
    nodes: list[NodeView]
    log: list[FleetEvent]
    runs: int
    lemons: list[str]
    spare_target: int
    probation_passes: int | None
    """Passes a quarantined node needs; None when no health command is configured."""


# ------------------------------------------------- a job's calls into its fleet
#
# A workflow cannot send an update to another workflow, and a signal cannot answer: a
# job calls its fleet through these activities, which send the update with the
# worker's Temporal client and bring back the fleet's validated reply. A refusal
# comes back as a non-retryable ``FleetRefused`` error; a fleet that is not running
# (or not answering) as a retryable ``FleetUnreachable``.

FLEET_REFUSED = "FleetRefused"
FLEET_UNREACHABLE = "FleetUnreachable"


class FleetLeaseCall(BaseModel):
    fleet: str
    request: LeaseRequest


class FleetReportCall(BaseModel):
    """Report a quarantine, ask for a node in place of ``replace``, or both (in that
    order)."""

    fleet: str
    job: str
    report: QuarantineReport | None = None
    replace: str | None = None
    replace_key: str = ""
    """The loss ``replace`` answers (:attr:`ReplaceRequest.key`)."""


class FleetReportReply(BaseModel):
    note: str = ""
    replacement: NodeSpec | None = None


class FleetReleaseCall(BaseModel):
    fleet: str
    request: ReleaseRequest


class FleetHandBackCall(BaseModel):
    fleet: str
    request: HandBackRequest


class FleetReply(BaseModel):
    note: str
