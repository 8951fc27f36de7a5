"""What a feature's durable steps see of the job workflow: one :class:`JobRun` per run.

``JobWorkflow`` (``job``) keeps the message handlers and the turn loop; the durable
steps of each feature (``checkpoint_steps``, ``fleet_steps``, ``slurm_steps``,
``stop_steps``, ``hand_over``) are collaborators that get this narrow context
rather than the whole workflow: the spec (read-only), the state, the clock, the
phase, the host queue activities are routed to, and an escalation. So a feature
cannot reach into another's fields, and what the core shares is written here.

It holds no decision of its own (those are pure modules beside it) and issues the
same commands the workflow issued when these were its methods: search attributes
when the phase, step, failure class or generation change, and the escalation hook's
activity.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeUpdate
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from lazarus.domain.activity_refs import ActivityRef
    from lazarus.domain.api import (
        FAILURE_CLASS_ATTRIBUTE,
        GENERATION_ATTRIBUTE,
        PHASE_ATTRIBUTE,
        STEP_ATTRIBUTE,
    )
    from lazarus.domain.contracts import EscalationHookRequest
    from lazarus.domain.spec import JobSpec
    from workflows.current_details import current_details, failure_class_attribute
    from workflows.escalation import queue_escalation
    from workflows.housekeeping import Housekeeper
    from workflows.patches import PATCH_HOST_TASK_QUEUE
    from workflows.placement import run_root
    from workflows.routing import (
        declared_host,
        host_task_queue,
        learned_host_queue,
        route,
        routes_by_host,
    )
    from workflows.state import (
        JobState,
        NodeRoster,
        Phase,
        undrawn_transition,
    )


class JobRun:
    """One workflow run of a job, as its steps see it.

    Only the workflow's event loop touches it, one coroutine at a time; what several
    coroutines edit across an ``await`` (the node pool) is guarded by
    :attr:`pool_lock`."""

    def __init__(self, state: JobState) -> None:
        self._spec: JobSpec | None = None
        self._effective: tuple[NodeRoster, JobSpec] | None = None
        """The last spec derived from ``state.roster``, with the roster it came from."""
        self.state = state
        self.escalate: Callable[[EscalationHookRequest], None] = _no_delivery
        """Delivers an escalation hook beside the state machine: set by ``hand_over``."""
        self.housekeeper: Housekeeper | None = None
        self.continue_anywhere = False
        """PATCH_CONTINUE_AS_NEW_ANY_PHASE applies to this run."""
        self.fast = False
        """PATCH_FAST_RECOVERY applies to this run."""
        self.strict_phases = False
        """``JobInput.strict_phases``: an undrawn phase change fails the job."""
        self.by_host = False
        """PATCH_HOST_TASK_QUEUE applies to this run (a job of local nodes)."""
        self.attributes_v2 = False
        """PATCH_SEARCH_ATTRIBUTES_V2 applies to this run."""
        self.published: tuple[str | None, int | None] = (None, None)
        """The failure class and generation last upserted by this run."""
        self.pool_lock = asyncio.Lock()
        """Held by whatever edits the node pool across an ``await``: a recovery, a
        launch (its preflight swaps), the fleet's retry, and ``return``'s fence and
        release, so a message handler never interleaves with a swap (Temporal's safe
        message handlers). Taken without waiting when free: no command changes."""

    def editing_pool(self, locked: bool) -> AbstractAsyncContextManager[Any]:
        """The pool lock for a handler, or (a history from before it) nothing."""
        return self.pool_lock if locked else contextlib.nullcontext()

    def begin(self, spec: JobSpec) -> None:
        """The run starts: the spec it was started (or continued) with, its intent,
        assigned here only; where it runs since lives in ``state.roster``."""
        self._spec = spec

    @property
    def intent(self) -> JobSpec:
        """The spec as started (continue-as-new carries it, with the state)."""
        assert self._spec is not None, "the workflow has not started"
        return self._spec

    @property
    def spec(self) -> JobSpec:
        """The job as it runs now (its intent on ``state.roster``): read-only for steps."""
        roster = self.state.roster
        if roster is None:
            return self.intent
        if self._effective is None or self._effective[0] is not roster:
            self._effective = (roster, roster.applied_to(self.intent))
        return self._effective[1]

    def move_to(self, spec: JobSpec) -> None:
        """The job runs on other nodes from now on (leased, granted, grown, the fleet's
        spares): they go into the state, the intent stays as it was."""
        if spec is self.spec:
            return  # nothing moved (the fleet had no node to give)
        roster = NodeRoster.of(spec)
        self.state.roster = roster
        self._effective = (roster, spec)

    def route(self, ref: ActivityRef[Any, Any]) -> dict[str, str]:
        """``execute`` options that send ``ref`` to the job's host queue, if it has one."""
        return route(ref, self.state.host_task_queue)

    def now(self) -> float:
        return workflow.now().timestamp()

    def set_phase(self, phase: Phase) -> None:
        """Change phase, along a transition drawn on :class:`Phase` (one that is not is
        logged, never fatal in production; ``JobInput.strict_phases`` makes it fatal)."""
        problem = undrawn_transition(self.state.phase, phase)
        if problem is not None:
            workflow.logger.warning(problem)
            if self.strict_phases:
                raise ApplicationError(problem, type="UndrawnTransition", non_retryable=True)
        if self.state.phase != phase:
            self.state.phase = phase
            self.publish_phase()

    def publish_phase(self) -> None:
        workflow.upsert_search_attributes([PHASE_ATTRIBUTE.value_set(self.state.phase.value)])
        self.explain()

    def explain(self) -> None:
        """The Web UI's current details (no history event: the UI reads them by query)
        and, from PATCH_SEARCH_ATTRIBUTES_V2 on, the failure class and generation
        search attributes, upserted only when they changed."""
        workflow.set_current_details(current_details(self.spec, self.state, self.now()))
        if not self.attributes_v2:
            return
        failure_class, generation = failure_class_attribute(self.state), self.state.generation
        if (failure_class, generation) == self.published:
            return
        updates: list[SearchAttributeUpdate[Any]] = [GENERATION_ATTRIBUTE.value_set(generation)]
        if failure_class is not None:
            updates.append(FAILURE_CLASS_ATTRIBUTE.value_set(failure_class))
        workflow.upsert_search_attributes(updates)
        self.published = (failure_class, generation)

    def set_step(self, step: int) -> None:
        if self.state.step != step:
            self.state.step = step
            workflow.upsert_search_attributes([STEP_ATTRIBUTE.value_set(step)])

    def fail(self, reason: str) -> None:
        self.state.operator_reason = reason
        self.state.finished_at = self.now()
        self.set_phase(Phase.FAILED)

    def needs_operator(self, reason: str, *, waits_for_node: bool = False) -> None:
        """Escalate: stop automatic recovery, say why, and run the spec's hook once.
        ``waits_for_node``: the job lacks nothing but nodes, so its fleet may end the
        wait (``fleet_link.waits_on_fleet``); every other escalation waits for a person."""
        self.state.operator_reason = reason
        self.state.waits_for_node = waits_for_node
        self.set_phase(Phase.NEEDS_OPERATOR)
        request = queue_escalation(self.spec, self.state, reason, run_root(self.spec, self.state))
        if request is not None:
            self.escalate(request)

    def pin_to_host(self) -> None:
        """A local job's ranks live on one machine: its machine-bound activities go to
        that host's task queue (``routing``), named by the spec or, failing that, by
        the first launch. Only local jobs ask the patch: others issue the same commands."""
        if not routes_by_host(self.spec) or not workflow.patched(PATCH_HOST_TASK_QUEUE):
            return
        self.by_host = True
        host = declared_host(self.spec)
        if self.state.host_task_queue is None and host is not None:
            self.state.host_task_queue = host_task_queue(workflow.info().task_queue, host)

    def learn_host(self, launched_on: str | None) -> None:
        """After a launch: the job now follows the host its ranks were started on, and
        the checkpoint watch (started before anyone knew the host) moves there too."""
        if not self.by_host:
            return
        queue = learned_host_queue(
            self.state.host_task_queue, workflow.info().task_queue, launched_on
        )
        if queue == self.state.host_task_queue:
            return
        self.state.host_task_queue = queue
        workflow.logger.info("machine-bound activities now run on task queue %s", queue)
        if self.housekeeper is not None:
            self.housekeeper.restart_from(self.state.housekept_step)


def _no_delivery(request: EscalationHookRequest) -> None:
    raise AssertionError("no hand-over to deliver escalation hooks")
