"""The simulated cluster itself: the real activity names answered from the seeded
failure trace and the cost model, on the clock of :mod:`workers.simulate.clock`."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NoReturn

from temporalio import activity
from temporalio.client import (
    AsyncActivityCancelledError,
    Client,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from activities.stand_ins import StandIn, launched_without_ranks, stand_ins
from lazarus.domain import contracts
from lazarus.domain.activity_refs import ALL, FLEET_CALLS
from lazarus.domain.api import (
    FLEET_QUERY_STATUS,
    FLEET_UPDATE_RETURN,
    QUERY_STATUS,
    SIGNAL_RESUME,
    UPDATE_RETURN,
)
from lazarus.domain.fleet import FleetStatus, NodeState, ReturnRequest
from workers.simulate.clock import (
    CHUNK_S,
    REPORT_S,
    SINCE_HEARTBEAT,
    Abandoned,
    LockLedger,
    advance_clock,
    simulated,
)
from workers.simulate.model import (
    DAY_S,
    ClusterTrace,
    CostModel,
    FailureEvent,
    Ledger,
    effective_step_s,
    memory_snapshot_s,
    newest_snapshot,
    progress_at,
    snapshot_reachable,
)

PROBATION_COMMAND = ["sim-probation"]
"""The fleet's probation health command in the simulation (never run as a program):
:meth:`SimCluster.preflight` answers it from the repair model, without moving the
job's clock."""

OPERATOR_HOLD_S = 300.0
"""The longest the checkpoint watch holds the clock, in real seconds, while the simulated
operator acts (:meth:`SimCluster._hold_for_operator`): below the heartbeat timeout, as
a held clock creeps on in real time."""

OPERATOR_HEARTBEAT_S = 30.0
"""Real seconds between the holding watch's heartbeats."""


@dataclass
class Generation:
    number: int
    nodes: frozenset[str]
    resume_step: int
    every: int
    launched_at: float
    first_step_at: float
    first_step_reported: bool = False
    frozen_at: float | None = None
    """When its ranks stopped stepping (the fault, or the stop)."""
    segment_step: int = 0
    """The step at which the interval in force took effect (``resume_step`` at first)."""
    segment_at: float = 0.0
    """When it took effect (``first_step_at`` at first)."""
    committed_before: int | None = None
    """The newest checkpoint committed under earlier intervals of this generation."""
    blocked_before: float = 0.0
    """Seconds blocked in checkpoints under earlier intervals of this generation."""
    interval_changes: int = 0
    order: tuple[str, ...] = ()
    """Its nodes in rank order: which slot each holds (the memory tier's buddy ring)."""
    step_s: float = 0.0
    """A step's wall time, the memory tier's snapshots included."""
    memory_every: int = 0
    """The spec's ``checkpoints.memory_every_steps`` (0: the memory tier is off)."""
    replicas: bool = False
    """The spec's ``checkpoints.memory_replicas``."""
    final_outcome: contracts.SuperviseOutcome | None = None
    """The failure (or success) that froze it: delivered again to a supervision of it
    that asks later (the one that carried it was cancelled, or its run had closed)."""

    def __post_init__(self) -> None:
        self.segment_step = self.resume_step
        self.segment_at = self.first_step_at


def stops_generation(request: contracts.StopRequest, gen: Generation) -> bool:
    """Whether a stop reaches the running generation's ranks: it does not keep that
    generation, and it targets one of its nodes (no nodes: this machine, taken as all)."""
    if request.keep_generation == gen.number:
        return False
    targets = {n.name for n in request.access.nodes} - set(request.skip_nodes)
    return not request.access.nodes or bool(targets & gen.nodes)


def stop_reach(request: contracts.StopRequest, gen: Generation | None) -> int:
    """How many nodes a stop reaches: the ones it names (a rejoin's replacement names
    only the failed node), or the generation's (none named: this machine, taken as all)."""
    targets = {n.name for n in request.access.nodes} - set(request.skip_nodes)
    if targets:
        return len(targets)
    return len(gen.nodes) if gen is not None else 1


def carried_ranks(
    request: contracts.LaunchRequest, previous: Generation | None, nodes: list[str]
) -> list[int]:
    """The ranks the launch carries over (``rejoin_ranks``), as the launcher does: only
    into a slot that names the same node as in the generation they ran in (a rank's
    node is ``rank // nproc_per_node``), from the generation that ran before it."""
    if not request.rejoin_ranks or previous is None:
        return []
    per_node = request.spec.nproc_per_node
    if previous.number >= request.generation or len(previous.order) != len(nodes):
        return []
    return [
        rank
        for rank in sorted(set(request.rejoin_ranks))
        if rank < len(nodes) * per_node
        and previous.order[rank // per_node] == nodes[rank // per_node]
    ]


def starting_nodes(node_count: int, per_node: int, carried: list[int]) -> int:
    """Nodes that start at least one rank afresh (import, load) in a launch that
    carries ``carried``: all of them without rejoin, the failed node's with it."""
    kept = set(carried)
    return sum(
        1
        for node in range(node_count)
        if any(rank not in kept for rank in range(node * per_node, (node + 1) * per_node))
    )


def _page_reason(request: contracts.EscalationHookRequest) -> str:
    """The reason the job gave its operator, from the hook's stdin document."""
    try:
        return str(json.loads(request.payload).get("reason", ""))[:200]
    except ValueError:
        return "(payload is not JSON)"


def fault_reported_first(fault_at: float, first_step_at: float | None) -> bool:
    """Whether a supervision report carries the fault rather than the generation's
    first step (``first_step_at``: due in this report, else None). A fault after the
    first step waits for the next report, as the real supervision sees the step first.
    Reporting the fault instead left the generation without its first step: the
    workflow never sent it the tuned interval, so it trained on the spec's hourly one
    and lost up to an hour of work at that fault."""
    return first_step_at is None or fault_at < first_step_at


@dataclass
class Interruption:
    at_s: float
    node: str
    category: str
    kind: str
    detected_at_s: float
    step_at_fault: int
    resume_step: int | None = None
    first_step_at_s: float | None = None


@dataclass
class SimCluster:
    env: WorkflowEnvironment
    trace: ClusterTrace
    costs: CostModel
    horizon_s: float
    operator_delay_s: float
    repair_s: float = math.inf
    """A broken node works again this long after its fault (the repair shop's turn-
    around): the fleet's probation then finds it healthy. inf: only the operator
    repairs, when paged."""
    fleet_id: str | None = None
    """The fleet workflow's id, in the rows that lease from one: the paged operator
    repairs its handed-back nodes too."""
    started: datetime | None = None
    workflow_id: str = ""
    client: Client | None = None
    generation: Generation | None = None
    committed: int | None = None
    broken: dict[str, float] = field(default_factory=dict)
    """Nodes down for good until repaired, and when their repair is done."""
    cursor: int = 0
    interruptions: list[Interruption] = field(default_factory=list)
    ledger: Ledger = field(default_factory=Ledger)
    checkpointing_s: float = 0.0
    memory_snapshots_s: float = 0.0
    """Seconds the ranks were held back by memory snapshots and their replica pushes."""
    memory: dict[str, int] = field(default_factory=dict)
    """Resume searches by what served them: ``memory`` (every node held the snapshot),
    ``replica`` (some copied it from a buddy), ``disk (a snapshot lost)`` (a new node's
    buddy was replaced too) or ``disk (as new or newer)`` (a disk checkpoint at or past
    the snapshot)."""
    restarts: Counter[str] = field(default_factory=Counter)
    """Launches by how they started the ranks: ``rejoin`` (survivors carried over in
    place) or ``whole_generation`` (the first launch included)."""
    final_step: int = 0
    operator_actions: list[str] = field(default_factory=list)
    operator_due_s: float | None = None
    """When the simulated operator acts on the page it got (None: no page pending)."""
    pages: list[dict[str, Any]] = field(default_factory=list)
    """Each page as the operator found it: why the job asked, the job's spares, and
    the fleet's free nodes by why none could be leased (repair, probation, lemon)."""
    interval_changes: list[tuple[float, int]] = field(default_factory=list)
    """``(time, every_steps)`` for each interval the workflow sent (``interval: auto``)."""
    placed: set[str] = field(default_factory=set)
    """Every node a generation was launched on."""
    locks: LockLedger = field(init=False)
    overran: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the clock is a day past the horizon and the job still runs activities."""
    _operators: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.locks = LockLedger(self.env)

    # ------------------------------------------------------------------ the clock

    async def now(self) -> float:
        current = await self.env.get_current_time()
        if self.started is None:
            self.started = current
        seconds = (current - self.started).total_seconds()
        if seconds > self.horizon_s + DAY_S:
            self.overran.set()
        return seconds

    async def advance(self, seconds: float, phase: str | None = None) -> None:
        """Move the clock ``seconds`` for the running activity, heartbeating before any
        chunk that would take it past :data:`CHUNK_S` since its last heartbeat (or its
        start). The count spans the activity's successive advances: a failure's run-up
        then its detection (up to the hang timeout) are two advances, and one heartbeat
        per advance let them add up past the heartbeat timeout (at 2,048 nodes, seed 1,
        54 days: a supervision retried at day 1.07 while its first attempt still slept,
        and the clock stopped there)."""
        left = seconds
        while left > 0:
            chunk = min(left, CHUNK_S)
            if SINCE_HEARTBEAT.get() + chunk > CHUNK_S:
                await self._heartbeat()
                SINCE_HEARTBEAT.set(0.0)
            with self.locks.sleeping():
                await advance_clock(self.env, chunk)
            SINCE_HEARTBEAT.set(SINCE_HEARTBEAT.get() + chunk)
            left -= chunk
        if phase is not None:
            self.ledger.add(phase, max(0.0, seconds))

    async def _heartbeat(self) -> None:
        """Between chunks of a long advance: tell the server the activity lives, and
        stop (:class:`Abandoned`) if nobody waits for it any more."""
        handle = self.env.client.get_async_activity_handle(task_token=activity.info().task_token)
        try:
            await handle.heartbeat()
        except AsyncActivityCancelledError as err:
            raise Abandoned("cancelled") from err
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise Abandoned(err.message) from err
            raise

    # --------------------------------------------------------------- the training

    def _progress(self, gen: Generation, at: float) -> tuple[int, int | None, float]:
        """Step, newest committed checkpoint and seconds blocked in checkpoints of ``gen``
        at ``at``, across the intervals it was sent."""
        if at < gen.segment_at:
            return gen.segment_step, gen.committed_before, gen.blocked_before
        p = progress_at(
            gen.segment_step,
            at - gen.segment_at,
            gen.every,
            gen.step_s,
            self.costs.checkpoint_s,
        )
        checkpoint = p.checkpoint_step
        if gen.committed_before is not None:
            checkpoint = max(checkpoint or 0, gen.committed_before)
        return p.step, checkpoint, gen.blocked_before + p.checkpointing_s

    def _change_interval(self, gen: Generation, at: float, every: int) -> None:
        """The ranks follow a new interval from their next step (``should_checkpoint``
        reads the control file each step)."""
        if at > gen.segment_at:
            step, checkpoint, blocked = self._progress(gen, at)
            gen.segment_step, gen.segment_at = step, at
            gen.committed_before, gen.blocked_before = checkpoint, blocked
        gen.every = every
        gen.interval_changes += 1

    def _freeze(self, at: float) -> int:
        gen = self.generation
        if gen is None:
            return self.final_step
        if gen.frozen_at is None:
            gen.frozen_at = at
            step, checkpoint, blocked = self._progress(gen, at)
            self.checkpointing_s += blocked
            self.memory_snapshots_s += max(0, step - gen.resume_step) * (
                gen.step_s - self.costs.step_s
            )
            if checkpoint is not None:
                self.committed = max(checkpoint, self.committed or 0)
            self.final_step = step
        return self._progress(gen, gen.frozen_at)[0]

    def _newest_committed(self, at: float) -> int | None:
        gen = self.generation
        if gen is not None and gen.frozen_at is None:
            checkpoint = self._progress(gen, at)[1]
            if checkpoint is not None:
                return max(checkpoint, self.committed or 0)
        return self.committed

    def _consume_until(self, at: float, running: frozenset[str]) -> FailureEvent | None:
        """Walk the trace up to ``at``: the first failure on a node of the running
        generation is returned (not consumed); failures elsewhere break hardware."""
        events = self.trace.events
        while self.cursor < len(events) and events[self.cursor].at_s <= at:
            event = events[self.cursor]
            if event.node in running:
                return event
            if event.share.hardware:
                self._break(event.node, event.at_s)
            self.cursor += 1
        return None

    # ----------------------------------------------------------------- activities

    @simulated
    async def launch(self, request: contracts.LaunchRequest) -> contracts.LaunchResult:
        now = await self.now()
        await self.advance(self.costs.launch_s, "launch")
        launched = now + self.costs.launch_s
        self._freeze(now)
        nodes = [n.name for n in (request.nodes or request.spec.nodes)]
        resume = request.resume.step if request.resume is not None else 0
        if self.interruptions and self.interruptions[-1].resume_step is None:
            self.interruptions[-1].resume_step = resume
        self.placed.update(nodes)
        rejoined = carried_ranks(request, self.generation, nodes)
        starting = starting_nodes(len(nodes), request.spec.nproc_per_node, rejoined)
        self.restarts["rejoin" if rejoined else "whole_generation"] += 1
        checkpoints = request.spec.checkpoints
        memory_every = checkpoints.memory_every_steps or 0
        step_s = effective_step_s(
            self.costs.step_s,
            memory_every,
            memory_snapshot_s(checkpoints.memory_replicas, gpus_per_node=self.costs.gpus_per_node),
        )
        self.generation = Generation(
            number=request.generation,
            nodes=frozenset(nodes),
            resume_step=resume,
            every=request.spec.checkpoints.every_steps or 0,
            launched_at=launched,
            first_step_at=launched + self.costs.startup_of_s(starting),
            order=tuple(nodes),
            step_s=step_s,
            memory_every=memory_every,
            replicas=checkpoints.memory_replicas,
        )
        return launched_without_ranks(request, self._wall(launched), "10.0.0.1", rejoined=rejoined)

    def _wall(self, at: float) -> float:
        assert self.started is not None
        return self.started.timestamp() + at

    @simulated
    async def supervise(self, request: contracts.SuperviseRequest) -> contracts.SuperviseOutcome:
        now = await self.now()
        gen = self.generation
        if gen is not None and gen.number == request.generation and gen.final_outcome:
            return gen.final_outcome
        if gen is None or gen.number != request.generation or gen.frozen_at is not None:
            return contracts.SuperviseOutcome(
                kind="progress", generation=request.generation, observed_at=self._wall(now)
            )
        end = min(now + min(request.report_after_s, REPORT_S), self.horizon_s)
        event = self._consume_until(end, gen.nodes)
        first_step_due = (
            request.report_first_step and not gen.first_step_reported and gen.first_step_at <= end
        )
        if event is not None and fault_reported_first(
            event.at_s, gen.first_step_at if first_step_due else None
        ):
            detected = max(event.at_s, now) + self.costs.detection_s(event.share.kind)
            if detected <= end:
                return await self._fail(gen, event, now, detected)
        if first_step_due:
            await self.advance(max(0.0, gen.first_step_at - now), "startup")
            gen.first_step_reported = True
            last = self.interruptions[-1] if self.interruptions else None
            if last is not None and last.first_step_at_s is None:
                last.first_step_at_s = gen.first_step_at
            return contracts.SuperviseOutcome(
                kind="first_step",
                generation=gen.number,
                observed_at=self._wall(gen.first_step_at),
                first_step_at=self._wall(gen.first_step_at),
                step=gen.resume_step + 1,
                seconds_per_step=gen.step_s,
            )
        await self.advance(end - now, "running")
        step = self._progress(gen, end)[0]
        if end >= self.horizon_s:
            self._freeze(end)
            gen.final_outcome = contracts.SuperviseOutcome(
                kind="succeeded", generation=gen.number, observed_at=self._wall(end), step=step
            )
            return gen.final_outcome
        return contracts.SuperviseOutcome(
            kind="progress",
            generation=gen.number,
            observed_at=self._wall(end),
            step=step,
            seconds_per_step=gen.step_s,
            progress_signal="heartbeat",
            checkpoint_save_s=self._save_s(gen),
        )

    def _save_s(self, gen: Generation) -> float | None:
        """δ as the ranks would measure it: known once this generation has saved."""
        if gen.every <= 0 or gen.frozen_at is not None:
            return None
        return self.costs.checkpoint_s

    async def _fail(
        self, gen: Generation, event: FailureEvent, now: float, detected: float
    ) -> contracts.SuperviseOutcome:
        fault = max(event.at_s, now)
        await self.advance(fault - now, "running")
        await self.advance(detected - fault, "detection")
        if gen.final_outcome is not None:
            return gen.final_outcome  # a supervision of an older run got there first
        self.cursor += 1
        step = self._freeze(fault)
        if event.share.hardware:
            self._break(event.node, fault)
        self.interruptions.append(
            Interruption(fault, event.node, event.share.name, event.share.kind, detected, step)
        )
        rank = sorted(gen.nodes).index(event.node)
        gen.final_outcome = contracts.SuperviseOutcome(
            kind="failed",
            generation=gen.number,
            observed_at=self._wall(detected),
            step=step,
            failure=contracts.FailureReport(
                kind=event.share.kind,
                failure_class=event.share.failure_class,
                rank=rank,
                node=event.node,
                exit_code=1 if event.share.kind == "crash" else None,
                evidence=[f"simulated {event.share.name} on {event.node}"],
                fault_at=self._wall(fault),
                detected_at=self._wall(detected),
                step_at_failure=step,
            ),
        )
        return gen.final_outcome

    @simulated
    async def stop(self, request: contracts.StopRequest) -> contracts.StopResult:
        now = await self.now()
        gen = self.generation
        if gen is not None and gen.frozen_at is None and not stops_generation(request, gen):
            # A stop beside the running generation (a quarantined node's zygote before
            # its hand-back, with warm_start): its ranks train on. Freezing them here
            # left supervision answering "no step" forever (54 days, seed 1, day 35.5).
            await self.advance(self.costs.stop_s)
            return contracts.StopResult(
                generations=[],
                signalled_groups=0,
                killed_groups=0,
                last_step=self._progress(gen, now + self.costs.stop_s)[0],
            )
        if not self._operator_acting(now):  # their fence stops are part of their delay
            await self.advance(self.costs.stop_of_s(stop_reach(request, gen)), "stop")
        last = self._freeze(now)
        return contracts.StopResult(
            generations=[], signalled_groups=0, killed_groups=0, last_step=last
        )

    @simulated
    async def preflight(
        self, request: contracts.PreflightActivityRequest
    ) -> contracts.PreflightReport:
        """The job's preflight before a launch (it costs the job time), or the fleet's
        probation round (:data:`PROBATION_COMMAND`: beside the job, free)."""
        now = await self.now()
        if request.checks.health_command != PROBATION_COMMAND:
            await self.advance(self.costs.preflight_s, "preflight")
            self._consume_until(now + self.costs.preflight_s, frozenset())
            now += self.costs.preflight_s
        return contracts.PreflightReport(
            nodes=[
                contracts.NodeHealth(
                    node=n.name,
                    ok=not self._is_broken(n.name, now),
                    problems=["simulated: GPU/host down"] if self._is_broken(n.name, now) else [],
                )
                for n in request.access.nodes
            ]
        )

    def _break(self, node: str, at: float) -> None:
        self.broken[node] = at + self.repair_s

    def _is_broken(self, node: str, now: float) -> bool:
        """Down, and its repair not done by ``now`` (a repaired node is forgotten)."""
        if node in self.broken and now >= self.broken[node]:
            del self.broken[node]
        return node in self.broken

    @simulated
    async def find_verified_checkpoint(
        self, request: contracts.FindVerifiedCheckpointRequest
    ) -> contracts.CheckpointSearch:
        now = await self.now()
        await self.advance(self.costs.search_s, "resume_search")
        memory = await self._memory_resume(request)
        if memory is not None:
            return memory
        step = self._newest_committed(now)
        if step is None or step in request.exclude_steps:
            return contracts.CheckpointSearch()
        if request.below_step is not None and step >= request.below_step:
            return contracts.CheckpointSearch()
        return contracts.CheckpointSearch(
            chosen=contracts.CheckpointRef(
                step=step, path=f"{request.checkpoint_dir}/step-{step:08d}"
            ),
            location="local",
        )

    async def _memory_resume(
        self, request: contracts.FindVerifiedCheckpointRequest
    ) -> contracts.CheckpointSearch | None:
        """The memory tier's answer (``memory_dir``: the spec's ``memory_every_steps``):
        the newest snapshot of the stopped generation, when every relaunch node holds
        it or can copy it from its slot's buddy (:func:`snapshot_reachable`; each copy
        costs the measured restore, in parallel). None: disk serves."""
        gen = self.generation
        if request.memory_dir is None or gen is None or gen.frozen_at is None:
            return None
        if gen.memory_every <= 0:
            return None
        after = [n.name for n in request.access.nodes]
        reachable, copies = snapshot_reachable(list(gen.order), after, gen.replicas)
        frozen = self._progress(gen, gen.frozen_at)[0]
        step = newest_snapshot(frozen, gen.resume_step, gen.memory_every)
        disk = self.committed or 0
        if not reachable or step <= disk or step in request.exclude_steps:
            why = "disk (a snapshot lost)" if not reachable else "disk (as new or newer)"
            self.memory[why] = self.memory.get(why, 0) + 1
            return None
        if copies:
            await self.advance(self.costs.replica_restore_s, "replica_restore")
        served = "replica" if copies else "memory"
        self.memory[served] = self.memory.get(served, 0) + 1
        path = f"{request.memory_dir}/step-{step:08d}"
        return contracts.CheckpointSearch(
            chosen=contracts.CheckpointRef(step=step, path=path),
            location="memory",
            memory_restored=[f"step {step} restored from a buddy's replica"] * copies,
        )

    @simulated
    async def watch_checkpoints(
        self, request: contracts.WatchCheckpointsRequest
    ) -> contracts.CheckpointRef | None:
        now = await self.now()
        wait = min(max(request.min_interval_s, 1.0), REPORT_S)
        if self.operator_due_s is not None and self.operator_due_s > now:
            wait = min(wait, self.operator_due_s - now)  # the clock stops for the operator
        elif self.operator_due_s is not None:
            await self._hold_for_operator()
        await self.advance(wait)
        step = self._newest_committed(now + wait)
        if step is None or (
            request.newer_than_step is not None and step <= request.newer_than_step
        ):
            return None
        path = f"sim/step-{step:08d}"
        stamp = contracts.FileStamp(size=1, mtime_ns=step)
        verified = contracts.VerifiedCheckpoint(
            step=step, path=path, files={"state.pt": stamp}, verified_at=self._wall(now + wait)
        )
        return contracts.CheckpointRef(step=step, path=path, verified=verified)

    @simulated
    async def collect_garbage(
        self, request: contracts.GarbageCollectionRequest
    ) -> contracts.GarbageCollectionResult:
        return contracts.GarbageCollectionResult()

    @simulated
    async def checkpoint_now(
        self, request: contracts.CheckpointNowRequest
    ) -> contracts.CheckpointNowResult:
        return contracts.CheckpointNowResult(checkpoint=None, waited_s=0.0)

    @simulated
    async def roll_back_checkpoint(
        self, request: contracts.RollbackRequest
    ) -> contracts.RollbackResult:
        return contracts.RollbackResult(retired=[], resume=None)

    @simulated
    async def _no_durable_tier(self, request: object) -> NoReturn:
        raise ApplicationError("no durable tier in the simulation", non_retryable=True)

    restore_checkpoint = upload_checkpoint = _no_durable_tier
    """Every checkpoint of the simulation stays where it was written."""

    @simulated
    async def _no_slurm(self, request: object) -> NoReturn:
        raise ApplicationError("no Slurm in the simulation", non_retryable=True)

    submit_allocation = cancel_allocation = grow_allocation = _no_slurm
    """The simulated nodes are local ones: no allocation to submit or grow."""

    @simulated
    async def run_escalation_hook(
        self, request: contracts.EscalationHookRequest
    ) -> contracts.EscalationHookResult:
        """The page reaches the simulated operator, who acts ``operator_delay_s`` later
        (:meth:`_operate`, a task beside the worker: the hook itself returns now)."""
        now = await self.now()
        if self.operator_due_s is None:
            self.operator_due_s = now + self.operator_delay_s
            self.pages.append({"day": round(now / DAY_S, 3), "why": _page_reason(request)})
            self._operators.append(asyncio.create_task(self._operate(now)))
        return contracts.EscalationHookResult(ran=True, exit_code=0)

    async def _hold_for_operator(self) -> None:
        """The operator's moment has come, and their calls take real time: a status
        query, one ``return`` update per quarantined node, the resume signal. Between
        two of them only this watch would be asleep, and the clock would skip to its
        next wake, up to an hour (0.7% of a 10-day row at 2,048 nodes went that way,
        counted as "other"). So the watch keeps its lock without sleeping until the
        operator is done, and the clock stands still (it creeps on in real time, so
        the watch heartbeats). The fence stop of each node they return counts as part
        of their delay: :meth:`stop` does not move the clock while they act. Holding
        that time for a later advance instead put it on whichever activity advanced
        next. Given the fence stops of dozens of returned nodes, such an activity can
        outrun its start-to-close timeout (a stop's is its grace plus 60 s), and a
        54-day row's clock stopped on a completion the server refused as an "unknown
        activity": that cause is inferred, not traced."""
        deadline = time.monotonic() + OPERATOR_HOLD_S
        beat = time.monotonic()
        while self.operator_due_s is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            if time.monotonic() - beat > OPERATOR_HEARTBEAT_S:
                await self._heartbeat()
                beat = time.monotonic()
        await self._heartbeat()
        SINCE_HEARTBEAT.set(0.0)

    def _operator_acting(self, now: float) -> bool:
        return self.operator_due_s is not None and now >= self.operator_due_s

    async def _operate(self, paged_at: float) -> None:
        """Wait for the clock to reach the operator's moment (it never sleeps: outside
        an activity that would unbalance the time-skipping lock; the checkpoint watch
        stops the clock there), repair and return every quarantined node
        (``lazarus return``), and resume the job."""
        assert self.client is not None and self.operator_due_s is not None
        while await self.now() < self.operator_due_s:
            await asyncio.sleep(0.005)
        self.ledger.add("operator_wait", await self.now() - paged_at)
        handle = self.client.get_workflow_handle(self.workflow_id)
        status: Any = await handle.query(QUERY_STATUS)
        found: dict[str, Any] = {"job_spares": len(status["nodes"].get("spares", []))}
        if self.fleet_id is not None:
            found["fleet"] = await self._fleet_at_page(self.fleet_id, await self.now())
        if self.pages:
            self.pages[-1].update(found)
        for node in [q["node"] for q in status["nodes"]["quarantined"]]:
            self.broken.pop(node, None)  # the operator repairs it
            try:
                await handle.execute_update(UPDATE_RETURN, {"node": node})
            except Exception as err:
                self.operator_actions.append(f"return {node} refused: {err}")
            else:
                self.operator_actions.append(f"return {node}")
        if self.fleet_id is not None:
            await self._repair_in_fleet(self.fleet_id)
        self.operator_due_s = None
        await handle.signal(SIGNAL_RESUME)
        self.operator_actions.append("resume")

    async def _fleet_at_page(self, fleet_id: str, now: float) -> dict[str, int]:
        """The fleet's nodes that are no job's, by why none of them could replace a
        lost node: the page's diagnosis."""
        assert self.client is not None
        handle = self.client.get_workflow_handle(fleet_id)
        status = await handle.query(FLEET_QUERY_STATUS, result_type=FleetStatus)
        found: Counter[str] = Counter()
        for view in status.nodes:
            if view.job:
                continue
            if view.lemon:
                found[f"{view.state.value}, lemon"] += 1
            elif view.state in (NodeState.QUARANTINED, NodeState.PROBATION):
                repaired = not self._is_broken(view.name, now)
                found[f"{view.state.value}, {'repaired' if repaired else 'in repair'}"] += 1
            else:
                found[view.state.value] += 1
        return dict(sorted(found.items()))

    async def _repair_in_fleet(self, fleet_id: str) -> None:
        """The nodes the job handed back are the fleet's now: the operator repairs
        them as well, and returns each (``lazarus fleet return --fenced``: checked by
        hand). Nodes the fleet still counts as the job's are left to the job's return
        above, so no node is ever both a job's spare and free in the fleet."""
        assert self.client is not None
        handle = self.client.get_workflow_handle(fleet_id)
        status = await handle.query(FLEET_QUERY_STATUS, result_type=FleetStatus)
        for view in status.nodes:
            if view.state not in (NodeState.QUARANTINED, NodeState.PROBATION) or view.job:
                continue
            self.broken.pop(view.name, None)
            try:
                await handle.execute_update(
                    FLEET_UPDATE_RETURN, ReturnRequest(node=view.name, fenced=True)
                )
            except Exception as err:
                self.operator_actions.append(f"fleet return {view.name} refused: {err}")
            else:
                self.operator_actions.append(f"fleet return {view.name}")

    @simulated
    async def set_checkpoint_interval(
        self, request: contracts.SetCheckpointIntervalRequest
    ) -> contracts.SetCheckpointIntervalResult:
        """``checkpoints.interval: auto``: the ranks of the live generation follow it."""
        now = await self.now()
        gen = self.generation
        if gen is not None and gen.frozen_at is None:
            self._change_interval(gen, now, request.checkpoint_every_steps)
            self.interval_changes.append((now, request.checkpoint_every_steps))
        return contracts.SetCheckpointIntervalResult(nodes=[n.name for n in request.access.nodes])

    def activities(self) -> list[StandIn]:
        """This cluster's methods as the activities the workflow calls, every one but
        the fleet's (the simulation runs the real fleet calls)."""
        return stand_ins(self, [ref for ref in ALL if ref not in FLEET_CALLS])

    async def close(self) -> None:
        """End the operator tasks and the lock ledger; an operator task that failed is
        noted in ``operator_actions``."""
        await self.locks.close()
        for task in self._operators:
            if not task.done():
                task.cancel()
        results = await asyncio.gather(*self._operators, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                self.operator_actions.append(f"operator failed: {result!r}")
