"""The RECOVERING phase's durable steps: a failure, a forced recovery, a straggler swap.

Each opens an incident, stops what must stop (or, with ``rejoin``, only what
failed), moves nodes (quarantine, a spare, a shrink, ``slurm.grow``, the fleet's
replacement) and leaves the job LAUNCHING, or NEEDS_OPERATOR when the playbook
escalates or no node is left. What to do is decided by pure modules (``playbook``,
``failures``, ``rejoin``, ``stragglers``); here is the order the workflow does it
in, which the released histories pin.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from lazarus.domain.contracts import FailureReport, StragglerReport
    from lazarus.domain.recovery_timeline import RecoveryTimeline
    from lazarus.domain.spec import JobSpec, StrategyName
    from workflows.checkpoint_steps import CheckpointSteps
    from workflows.failures import failure_context
    from workflows.fleet_link import hands_back
    from workflows.fleet_steps import FleetSteps
    from workflows.patches import (
        PATCH_NO_REJOIN_IN_REJOIN,
        PATCH_NODE_LOSS_RESTARTS_WHOLE,
        PATCH_REJOIN,
        PATCH_REJOIN_HANDS_BACK,
    )
    from workflows.playbook import Action, decide, straggler_decision
    from workflows.rejoin import plan_rejoin, rejoin_dropped
    from workflows.run_context import JobRun
    from workflows.slurm_steps import SlurmSteps
    from workflows.state import ForceRecover, Incident, Phase, PlannedMove
    from workflows.stop_steps import StopSteps
    from workflows.stops import checkpoint_evidence, reached
    from workflows.stragglers import (
        open_straggler_incident,
        record_straggler,
        straggler_context,
    )

DOOMED_KINDS = frozenset({"crash", "hang", "vanished", "node_lost"})
"""Failures whose surviving ranks are stuck in a collective with a dead (or frozen)
peer: they cannot checkpoint, so they are killed at once instead of given a grace."""


def node_loss_rejoins(spec: JobSpec, failure: FailureReport) -> bool:
    """Whether a node loss may rejoin (``rejoin.node_loss``). Asked of the history only
    for a node loss without it, so histories recorded before the setting replay as
    they ran (a node loss then always rejoined)."""
    rejoin = spec.rejoins
    if failure.kind != "node_lost" or rejoin is None or rejoin.node_loss:
        return True
    return not workflow.patched(PATCH_NODE_LOSS_RESTARTS_WHOLE)


class RecoverySteps:
    """The recoveries of one run."""

    def __init__(
        self,
        run: JobRun,
        stops: StopSteps,
        checkpoints: CheckpointSteps,
        fleet: FleetSteps,
        slurm: SlurmSteps,
    ) -> None:
        self.run = run
        self.stops = stops
        self.checkpoints = checkpoints
        self.fleet = fleet
        self.slurm = slurm

    async def recover(self, failure: FailureReport) -> None:
        spec = self.run.spec
        state = self.run.state
        self.run.set_phase(Phase.RECOVERING)
        state.consecutive_failures += 1
        if failure.node is not None:  # out of spares: the fleet's, before the playbook weighs
            failure = await self.fleet.ask_for_spare(failure)
        context = failure_context(spec, state, failure, self.run.now(), fast_path=self.run.fast)
        incident = state.add_incident(
            Incident.from_failure(failure, id=state.next_incident_id, generation=state.generation)
        )
        decision = decide(context, spec.recovery, spec.playbook)
        incident.apply(decision)
        timeline = RecoveryTimeline(
            fault_at=incident.fault_at, detected_at=incident.detected_at, decided_at=self.run.now()
        )
        incident.timeline = timeline
        dead = [failure.node] if failure.kind == "node_lost" and failure.node else []
        fenced_by_stop = False
        rejoin = (
            plan_rejoin(
                spec,
                state.pool,
                failure,
                decision.action,
                state.generation_live,
                # Asked only when it matters, so other histories replay as recorded.
                mid_rejoin=bool(state.rejoining) and workflow.patched(PATCH_NO_REJOIN_IN_REJOIN),
                node_loss_rejoins=node_loss_rejoins(spec, failure),
            )
            if spec.rejoins is not None
            else None
        )
        if rejoin is not None and workflow.patched(PATCH_REJOIN):
            incident.add_evidence([rejoin.why])
            incident.restart_path = rejoin.path
        else:
            rejoin = None
        if rejoin is not None and rejoin.ranks:
            # Survivors keep their process: stop only what failed (a crashed rank is
            # gone already), and the relaunch fences every other group of this generation.
            last_step = failure.step_at_failure
            if decision.action == Action.REPLACE_NODE and failure.node not in dead:
                assert failure.node is not None  # plan_rejoin keeps ranks only then
                stopped = await self.stops.stop_all(
                    f"incident {incident.id}: {failure.kind} on node {failure.node}",
                    only=[failure.node],
                    kill_at_once=True,
                )
                last_step = stopped.last_step
                # Fenced as by the whole generation's stop below, so it can go back.
                fenced_by_stop = (
                    reached(failure.node, stopped)
                    and hands_back(spec)
                    and workflow.patched(PATCH_REJOIN_HANDS_BACK)
                )
            incident.record_stop(self.run.now(), last_step)
            timeline.survivors_stopped_at = incident.stopped_at
            state.rejoin_ranks = rejoin.ranks
            state.stopped_generation = state.generation
        else:
            skip = [*dead, *self.stops.dead_nodes()] if self.run.fast else []
            stopping_failed_node = failure.node in state.pool.active and failure.node not in skip
            stopped = await self.stops.stop_all(
                f"incident {incident.id}: {failure.kind} on rank {failure.rank}",
                kill_at_once=failure.kind in DOOMED_KINDS,
                skip=skip,
            )
            if stopping_failed_node and failure.node is not None:
                fenced_by_stop = reached(failure.node, stopped)
            incident.record_stop(self.run.now(), stopped.last_step)
            timeline.survivors_stopped_at = incident.stopped_at
            if not stopped.unkillable:
                state.stopped_generation = state.generation
        if decision.action == Action.NEEDS_OPERATOR:
            if failure.kind == "node_lost" and failure.node in state.pool.active:
                # Never relaunch on a dead node, even when a person resumes without looking.
                state.pool.quarantine(
                    failure.node, f"incident {incident.id}: node_lost", self.run.now()
                )
                await self.fleet.tell(failure.node, "node_lost", "node_lost")
            # Only "no spare left" waits for a node; a guard (budget, crash loop) or an
            # escalating rung waits for a person even though the job is short too.
            self.run.needs_operator(
                decision.reason, waits_for_node=decision.strategy == StrategyName.REPLACE_NODE
            )
            return
        swaps_node = decision.action in (Action.REPLACE_NODE, Action.SHRINK, Action.GROW)
        why = f"incident {incident.id}: {failure.failure_class}"
        if decision.action == Action.GROW and failure.node is not None:
            await self.slurm.maybe_grow(failure.node, incident)
        if swaps_node and failure.node is not None:
            await self.fleet.tell(failure.node, failure.failure_class.value, why)
            swapped = self.stops.swap_out(failure.node, why)
            if fenced_by_stop and hands_back(self.run.spec):
                # The stop above found its ranks dead: the fleet may have it back now.
                state.pool.mark_fenced(failure.node)
            if not swapped:
                return
        state.count_restart(decision.action, failure.step_at_failure, self.run.now())
        if decision.backoff_s > 0:
            await workflow.sleep(
                decision.backoff_s,
                summary=(
                    f"backoff {decision.backoff_s:.1f} s before generation {state.generation + 1}"
                ),
            )
        self.run.set_phase(Phase.LAUNCHING)

    async def forced(self, request: ForceRecover) -> None:
        now = self.run.now()
        self.run.set_phase(Phase.RECOVERING)
        incident = self.run.state.open_incident_now(
            "operator",
            PlannedMove.OPERATOR,
            now,
            action=Action.RESTART,
            reason=f"forced by operator: {request.reason}",
            evidence=[f"force_recover: {request.reason}"],
        )
        if request.checkpoint_first:
            planned = await self.checkpoints.planned_stop(f"forced recovery: {request.reason}")
            incident.evidence.append(checkpoint_evidence(planned.checkpoint_step))
            last_step = planned.step_at_stop
        else:
            last_step = (await self.stops.stop_all(f"forced recovery: {request.reason}")).last_step
        incident.record_stop(self.run.now(), last_step)
        incident.timeline = RecoveryTimeline(
            fault_at=now, detected_at=now, decided_at=now, survivors_stopped_at=incident.stopped_at
        )
        if request.exclude_node is not None:
            incident.node = request.exclude_node
            incident.action = Action.REPLACE_NODE
            await self.fleet.tell(request.exclude_node, "operator", request.reason)
            if not self.stops.swap_out(
                request.exclude_node, f"excluded by operator: {request.reason}"
            ):
                return
        self.run.set_phase(Phase.LAUNCHING)

    async def straggler_swap(self, report: StragglerReport) -> None:
        """Swap a slow node for a spare when that pays off, else note it and alert.
        A swap is planned, so it checkpoints first and costs no steps."""
        state = self.run.state
        decision = straggler_decision(straggler_context(self.run.spec, state, report))
        record_straggler(state, report, decision)
        workflow.logger.warning("straggler: %s", decision.reason)
        if decision.action != Action.REPLACE_NODE:
            state.noted_stragglers.append(report.node)
            return
        self.run.set_phase(Phase.RECOVERING)
        incident = open_straggler_incident(state, report, decision)
        planned = await self.checkpoints.planned_stop(
            f"incident {incident.id}: straggler on {report.node}"
        )
        if planned.checkpoint_step is None:
            incident.evidence.append(checkpoint_evidence(None))
        incident.record_stop(self.run.now(), planned.step_at_stop)
        await self.fleet.tell(report.node, "straggler", f"incident {incident.id}: straggler")
        if self.stops.swap_out(report.node, f"incident {incident.id}: straggler"):
            self.run.set_phase(Phase.LAUNCHING)

    async def drop_rejoin(self, planned_on: list[str]) -> bool:
        """The preflight changed the nodes after ``_recover`` planned a rejoin on
        ``planned_on``: restart the whole generation instead (``rejoin_dropped``).
        The survivors are stopped first, as a recovery without rejoin stops them, so
        none acts for a slot that moved or left the world. The quarantined node is
        not skipped: the stop fences it (a local node costs nothing to reach; an ssh
        node that cannot be reached costs the connect timeout, stays unfenced, and a
        later stop that reaches it fences it, as without rejoin). Also when the
        preflight has just asked for an operator: a person resuming must not meet
        survivors planned for other nodes. False when ranks would not die: a person
        must look (the next launch escalates if the job waits for one already)."""
        state = self.run.state
        why = rejoin_dropped(planned_on, state.pool.active)
        state.rejoin_ranks = []
        incident = state.current_incident
        if incident is not None and why is not None:
            incident.add_evidence([why])
            incident.restart_path = "whole_generation"
        await self.stops.stop_all(
            f"fence generation {state.generation}: the rejoin is dropped", kill_at_once=True
        )
        if state.stuck_ranks is None:
            return True
        if state.phase == Phase.LAUNCHING:
            stuck, state.stuck_ranks = state.stuck_ranks, None
            self.run.needs_operator(stuck)
        return False
