"""Names a client needs to talk to a job workflow, without importing the workflow.

The CLI, tests and benches address workflows, signals and queries by these names,
so they never import workflow code (and its sandbox rules) just to send a signal.
"""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

from lazarus.domain import environment

WORKFLOW_TYPE = "LazarusJob"
DEFAULT_TASK_QUEUE = "lazarus"
WORKFLOW_ID_PREFIX = "lazarus-"

SIGNAL_PAUSE = "pause"
SIGNAL_RESUME = "resume"
SIGNAL_FORCE_RECOVER = "force_recover"
QUERY_STATUS = "status"
UPDATE_DRAIN = "drain"
UPDATE_RETURN = "return_node"
UPDATE_RECOVER = "recover"
"""Forced recovery as an update: a bad ``--exclude-node`` is refused with the reason."""

PHASE_ATTRIBUTE = SearchAttributeKey.for_keyword("LazarusPhase")
STEP_ATTRIBUTE = SearchAttributeKey.for_int("LazarusStep")
JOB_ATTRIBUTE = SearchAttributeKey.for_keyword("LazarusJob")
FAILURE_CLASS_ATTRIBUTE = SearchAttributeKey.for_keyword("LazarusFailureClass")
"""The newest incident's class (crash, hang, node_lost, ...): filter the UI's list by it."""
GENERATION_ATTRIBUTE = SearchAttributeKey.for_int("LazarusGeneration")
"""The generation running now: ``LazarusGeneration > 1`` lists jobs that relaunched."""
SEARCH_ATTRIBUTES = (
    PHASE_ATTRIBUTE,
    STEP_ATTRIBUTE,
    JOB_ATTRIBUTE,
    FAILURE_CLASS_ATTRIBUTE,
    GENERATION_ATTRIBUTE,
)


def workflow_id_for(job_name: str) -> str:
    """One workflow per job, derived from its name, so a second start is refused."""
    return f"{WORKFLOW_ID_PREFIX}{job_name}"


def job_name_from(workflow_id: str) -> str:
    return workflow_id.removeprefix(WORKFLOW_ID_PREFIX)


API_KEY_ENV = environment.TEMPORAL_API_KEY
"""The Temporal Cloud API key's variable (:data:`lazarus.domain.environment.TEMPORAL_API_KEY`)."""


FLEET_WORKFLOW_TYPE = "LazarusFleet"
FLEET_WORKFLOW_ID_PREFIX = "lazarus-fleet-"
"""Fleet workflows are ``lazarus-fleet-<name>``, beside jobs' ``lazarus-<job>``: a job
named ``fleet-<name>`` would want the same id, and whichever starts second is refused
(ids are unique among open workflows), so one never acts as the other."""
FLEET_QUERY_STATUS = "fleet_status"
FLEET_UPDATE_LEASE = "lease"
FLEET_UPDATE_RELEASE = "release"
FLEET_UPDATE_HAND_BACK = "hand_back"
FLEET_UPDATE_REPORT_QUARANTINE = "report_quarantine"
FLEET_UPDATE_REPLACE = "replace"
FLEET_UPDATE_DRAIN = "drain"
FLEET_UPDATE_RETURN = "return_node"
FLEET_UPDATE_RELEASE_ORPHAN = "release_orphan"
"""An operator frees the lease of a job whose workflow closed without releasing it."""


def fleet_workflow_id(fleet_name: str) -> str:
    """One workflow per fleet, derived from its name: a second start is refused."""
    return f"{FLEET_WORKFLOW_ID_PREFIX}{fleet_name}"
