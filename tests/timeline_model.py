"""One job's checkpoints under the real timeline policy, event by event, and an oracle.

For the property tests of ``tests/unit/test_timeline_property.py`` (issue 37). The
model holds what a cluster holds: each node's memory snapshots, the replicas each
node keeps of its ring predecessor's slot, the local disk and the durable tier. It
moves them through events (training, snapshots committed on some nodes only, disk
commits, uploads, crashes, NaN rollbacks, node loss, preflight escalations, an
operator's return, resume and forced recovery, a fleet's new node, continue-as-new)
and decides with the product's own pure policy, called as the workflow calls it:

- the playbook (``decide`` on the real ``failure_context``) and the state's moves
  (``count_restart``, ``record_rollback``, ``cut_timeline``);
- the node pool (a preflight's swap, or its escalation) and ``reopen_pool``;
- the resume-point request (``resume_points.search_request``), judged as
  ``find.search_verified`` composes the tiers: the memory tier's real ``choose``,
  then the disk tiers above its choice, through the request's ``disk_candidates``
  and ``off_timeline``.

The oracle knows nothing of cuts, bounds or retired checkpoints: it records which
state each generation resumed from, and says from that lineage which states are on
the job's timeline; and it bounds a rollback by the steps the divergence touched.
At every launch :meth:`Cluster.launch` checks the invariant that
``docs/guides/guarantees.md`` states.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Literal

from activities.checkpoints.memory_tier import HeldReplicas, choose
from activities.nodes.agent import MemorySnapshot
from lazarus.domain.checkpoint_layout import MANIFEST, step_dir_name
from lazarus.domain.contracts import (
    CheckpointRef,
    FailureReport,
    FindVerifiedCheckpointRequest,
)
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.spec import JobSpec, parse_spec
from workflows.failures import failure_context
from workflows.operator_requests import reopen_pool
from workflows.playbook import Action, decide
from workflows.resume_points import record_rollback, search_request
from workflows.state import Incident, JobState, NodePool

JOB = "prop"
FLEET_NODES = ("fleet1", "fleet2", "fleet3", "fleet4")
"""Nodes a fleet may lease the job later: in the spec (each node's address), not in
the pool until leased."""
STATE_FILE = "state.pt"
Tier = Literal["memory", "local", "durable"]


@dataclass(frozen=True)
class Config:
    nodes: int
    spares: int
    replicas: bool
    shrinks: bool
    """``min_nodes`` one below the node count: a node that fails and has no spare
    shrinks the job instead of asking a person."""
    disk_every: int
    memory_keep: int


@cache
def job_spec(config: Config) -> JobSpec:
    """The spec for ``config`` (parsed once: specs are immutable)."""
    data: dict[str, object] = {
        "name": JOB,
        "command": ["python", "train.py"],
        "workdir": "/w",
        "checkpoint_dir": "/w/checkpoints",
        "run_dir": "/w/runs",
        "nodes": [{"name": f"n{i}"} for i in range(config.nodes)],
        "spares": [{"name": f"s{i}"} for i in range(config.spares)]
        + [{"name": name} for name in FLEET_NODES],
        "checkpoints": {
            "memory_every_steps": 1,
            "memory_keep": config.memory_keep,
            "memory_replicas": config.replicas,
            "durable_uri": "s3://bucket/prop",
        },
        "recovery": {"max_restarts": 6},
    }
    if config.shrinks:
        data["min_nodes"] = config.nodes - 1
    return parse_spec(data, "<property>")


@cache
def snapshot(step: int, generation: int) -> MemorySnapshot:
    """A whole, committed copy of ``step`` written by ``generation`` (as reported)."""
    manifest = {
        "step": step,
        "generation": generation,
        "job_id": JOB,
        "files": {STATE_FILE: {"size": 1}},
    }
    return MemorySnapshot(
        step=step,
        path=f"/memory/{step_dir_name(step)}",
        manifest=manifest,
        sizes={STATE_FILE: 1, MANIFEST: 1},
    )


@dataclass(frozen=True)
class Found:
    """A resume point: the state ``writer`` reached at ``step``, from ``tier``."""

    step: int
    writer: int
    tier: Tier


class InvariantBroken(AssertionError):
    """The chosen resume point breaks the timeline invariant."""


@dataclass
class Cluster:
    """The cluster, the workflow state and the oracle; one event per method."""

    config: Config
    spec: JobSpec = field(init=False)
    state: JobState = field(init=False)
    memory: dict[str, dict[int, int]] = field(default_factory=dict)
    """node -> step -> the generation that wrote that node's snapshot."""
    replicas: dict[str, dict[int, dict[int, int]]] = field(default_factory=dict)
    """holder node -> the slot it holds replicas of -> step -> writer."""
    local: dict[int, int] = field(default_factory=dict)
    durable: dict[int, int] = field(default_factory=dict)
    live: int | None = None
    """The generation training now (None: stopped, waiting or about to relaunch)."""
    position: int = 0
    waiting: str | None = None
    """Why the job waits (NEEDS_OPERATOR): ``node`` (no spare) or ``person``."""
    bad_at_preflight: set[str] = field(default_factory=set)
    rollback_fails: bool = False
    """The next rollback activity fails (the workflow goes on without its answer)."""
    now: float = 0.0
    fleet_nodes: int = 0
    # The oracle.
    parents: dict[int, tuple[int, int] | None] = field(default_factory=dict)
    """generation -> (step, writer) of the state it resumed from; None: scratch."""
    diverged_below: int | None = None
    """A rollback under way: the next launch must resume below this step."""
    launches: int = 0
    checks: int = 0

    def __post_init__(self) -> None:
        self.spec = job_spec(self.config)
        self.state = JobState(
            pool=NodePool(
                active=[n.name for n in self.spec.nodes],
                spares=[n.name for n in self.spec.spares if n.name not in FLEET_NODES],
            ),
            run_key="run",
        )
        self.launch()

    # ------------------------------------------------------------------ events

    def train(self, steps: int, torn: bool) -> None:
        """``steps`` steps: a snapshot every step on every node (the last one on the
        first node only when ``torn``: the others crashed before their commit),
        pushed to the next node's replicas, and a disk commit every ``disk_every``."""
        if self.live is None:
            return
        active = self.state.pool.active
        for index in range(steps):
            self.position += 1
            step = self.position
            whole = not (torn and index == steps - 1)
            committing = active if whole else active[:1]
            for slot, node in enumerate(active):
                if node not in committing:
                    continue
                self._keep(self.memory.setdefault(node, {}), step)
                if self.config.replicas and len(active) > 1:
                    holder = active[(slot + 1) % len(active)]
                    self._keep(self.replicas.setdefault(holder, {}).setdefault(slot, {}), step)
            if whole and step % self.config.disk_every == 0:
                self.local[step] = self.live
        self.state.step = self.position
        self.now += 10.0 * steps
        if steps and self.state.open_incident is not None:
            self.state.close_incident(self.now)

    def upload(self) -> None:
        """Tiering: every local checkpoint gets its durable copy."""
        self.durable.update(self.local)

    def fail(
        self,
        failure_class: FailureClass,
        node_slot: int | None = None,
        *,
        rollback_fails: bool = False,
    ) -> None:
        """A failure of the live generation, recovered as ``RecoverySteps.recover``
        decides: the playbook's action, a node swapped out, or a person. With
        ``rollback_fails``, a rollback it decides gets no answer from its activity."""
        if self.live is None:
            return
        self.rollback_fails = rollback_fails
        active = self.state.pool.active
        node = active[node_slot % len(active)] if node_slot is not None else None
        if failure_class == FailureClass.NODE_LOST and node is not None:
            self.memory.pop(node, None)  # tmpfs goes with the node
            self.replicas.pop(node, None)
        self.now += 5.0
        failure = FailureReport(
            kind="node_lost" if failure_class == FailureClass.NODE_LOST else "crash",
            failure_class=failure_class,
            rank=0,
            node=node,
            exit_code=1,
            step_at_failure=self.position,
            fault_at=self.now,
            detected_at=self.now,
            evidence=[],
        )
        state = self.state
        state.consecutive_failures += 1
        context = failure_context(self.spec, state, failure, self.now)
        incident = state.add_incident(
            Incident.from_failure(failure, id=state.next_incident_id, generation=state.generation)
        )
        decision = decide(context, self.spec.recovery, self.spec.playbook)
        incident.apply(decision)
        self.live = None
        state.generation_live = False
        if decision.action == Action.NEEDS_OPERATOR:
            if failure.kind == "node_lost" and node in state.pool.active:
                state.pool.quarantine(node, "node_lost", self.now)
            self.waiting = "node" if decision.strategy == "replace_node" else "person"
            return
        swaps = decision.action in (Action.REPLACE_NODE, Action.SHRINK, Action.GROW)
        if (
            swaps
            and node
            and not state.pool.swap_out(node, "failed", self.now, self.spec.min_nodes)
        ):
            self.waiting = "node"
            return
        state.count_restart(decision.action, failure.step_at_failure, self.now)
        if decision.action == Action.ROLLBACK:
            self.diverged_below = _lowest(self.diverged_below, self.position)
        self.launch()

    def lose_node(self, slot: int) -> None:
        """A node dies. Training: a node loss for the playbook. Stopped: its memory is
        gone and the next preflight finds it bad."""
        if self.live is not None:
            self.fail(FailureClass.NODE_LOST, slot)
            return
        active = self.state.pool.active
        if active:
            node = active[slot % len(active)]
            self.memory.pop(node, None)
            self.replicas.pop(node, None)
            self.bad_at_preflight.add(node)

    def bad_preflight(self, slot: int) -> None:
        """The next preflight finds this node bad (its memory is intact)."""
        active = self.state.pool.active
        if active:
            self.bad_at_preflight.add(active[slot % len(active)])

    def operator_return(self, index: int) -> None:
        """``lazarus return`` of a quarantined node: back among the spares, with
        whatever its tmpfs still holds."""
        quarantined = self.state.pool.quarantined
        if quarantined:
            node = quarantined[index % len(quarantined)].node
            self.state.pool.release(node)
            self.bad_at_preflight.discard(node)

    def operator_resume(self) -> None:
        """``lazarus resume`` of a job waiting for a person or a node."""
        if self.waiting is None:
            return
        if reopen_pool(self.spec, self.state, None, self.now) is None:
            self.launch()

    def fleet_grants_node(self) -> None:
        """A fleet job's re-ask: the fleet leases it a fresh node, and it relaunches."""
        if self.waiting != "node" or self.fleet_nodes == len(FLEET_NODES):
            return
        self.state.pool.spares.append(FLEET_NODES[self.fleet_nodes])
        self.fleet_nodes += 1
        if reopen_pool(self.spec, self.state, None, self.now) is None:
            self.launch()

    def operator_recover(self, checkpoint_first: bool) -> None:
        """``lazarus recover`` (optionally ``--checkpoint-first``: a just-in-time
        disk checkpoint of the step reached) and a relaunch."""
        if self.live is None:
            return
        if checkpoint_first and self.position > 0:
            self.local[self.position] = self.live
        self.live = None
        self.state.generation_live = False
        self.launch()

    def continue_as_new(self) -> None:
        """The state crosses into a new run the way the workflow carries it."""
        self.state = JobState.model_validate_json(self.state.model_dump_json())

    # ------------------------------------------------------------------ launch

    def launch(self) -> None:
        """``JobWorkflow._launch_next``: the rollback (if pending) and the search beside
        the preflight; the preflight may swap a node (search again) or escalate (no
        launch); then the resume point, checked against the oracle, and its cut."""
        self.waiting = None
        state = self.state
        planned_on = list(state.pool.active)
        if state.rollback_pending:
            self._roll_back()
        found = self.search()
        if not self._preflight():
            return
        if state.pool.active != planned_on:
            found = self.search()
        self._check(found)
        if found is not None and found.tier == "durable":
            self.local[found.step] = found.writer  # restored onto the local disk
        resume = (
            CheckpointRef(
                step=found.step, path=f"{self.spec.checkpoint_dir}/{step_dir_name(found.step)}"
            )
            if found is not None
            else None
        )
        state.resume = resume
        state.cut_timeline(resume)
        state.generation += 1
        state.generation_live = True
        self.parents[state.generation] = (found.step, found.writer) if found else None
        self.diverged_below = None
        self.live = state.generation
        self.position = found.step if found is not None else 0
        self.launches += 1

    def _roll_back(self) -> None:
        """``retire_newest``: the newest local checkpoint moved aside, reported with
        the generation that wrote it; its durable copy stays."""
        self.state.rollback_pending = False
        if self.rollback_fails:  # ``CheckpointSteps.roll_back`` warns and goes on
            return
        if not self.local:
            record_rollback(self.state, [])
            return
        step = max(self.local)
        writer = self.local.pop(step)
        path = f"/w/checkpoints/.rolled-back/{step_dir_name(step)}"
        record_rollback(self.state, [CheckpointRef(step=step, path=path, generation=writer)])
        self.diverged_below = _lowest(self.diverged_below, step)

    def _preflight(self) -> bool:
        """Every active node checked; a bad one swapped out (a spare, a shrink) or,
        with neither, the job waits for a node (``StopSteps.swap_out``)."""
        pool = self.state.pool
        for node in sorted(self.bad_at_preflight & set(pool.active)):
            self.bad_at_preflight.discard(node)
            if not pool.swap_out(node, "preflight", self.now, self.spec.min_nodes):
                self.waiting = "node"
                return False
        return True

    # ------------------------------------------------------------------ search

    def search(self) -> Found | None:
        """What ``find_verified_checkpoint`` would choose: the request the workflow
        builds, the memory tier's ``choose`` on the nodes that launch, then the disk
        tiers above its choice (``search_verified``)."""
        request = search_request(self.spec, self.state, include_durable=True)
        memory: Found | None = None
        if request.memory_dir is not None and request.below_step is None:
            memory = self._memory_choice(request)
        floor = memory.step if memory is not None else None
        tiers: tuple[tuple[Tier, dict[int, int]], ...] = (
            ("local", self.local),
            ("durable", self.durable),
        )
        for step in request.disk_candidates({*self.local, *self.durable}, floor):
            for tier, held in tiers:
                writer = held.get(step)
                if writer is not None and request.off_timeline(writer, step) is None:
                    return Found(step, writer, tier)
        return memory

    def _memory_choice(self, request: FindVerifiedCheckpointRequest) -> Found | None:
        names = [node.name for node in request.access.nodes]
        root = str(request.memory_dir)
        per_node = {
            name: {step: snapshot(step, gen) for step, gen in self.memory.get(name, {}).items()}
            for name in names
        }
        held: dict[str, HeldReplicas] = {}
        if self.spec.checkpoints.memory_replicas and len(names) > 1:
            for index, holder in enumerate(names):
                slot = (index - 1) % len(names)
                kept = self.replicas.get(holder, {}).get(slot, {})
                held[names[slot]] = HeldReplicas(
                    holder, {step: snapshot(step, gen) for step, gen in kept.items()}
                )
        chosen = choose(request, root, names, per_node, held).chosen
        if chosen is None:
            return None
        step = chosen.step
        writers = {self._memory_copy(name, index, names, step) for index, name in enumerate(names)}
        writer = writers.pop()
        assert writer is not None and not writers, f"step {step}: copies of {writers | {writer}}"
        return Found(step, writer, "memory")

    def _memory_copy(self, name: str, index: int, names: list[str], step: int) -> int | None:
        """Who wrote the copy of ``step`` that node ``name`` would resume from: its
        own, else (replicas on) the one its ring successor holds of its slot."""
        own = self.memory.get(name, {}).get(step)
        if own is not None or not self.config.replicas or len(names) < 2:
            return own
        holder = names[(index + 1) % len(names)]
        return self.replicas.get(holder, {}).get(index, {}).get(step)

    # ------------------------------------------------------------------ oracle

    def on_timeline(self, step: int, writer: int) -> bool:
        """Whether generation ``writer``'s state at ``step`` is on the job's timeline:
        ``writer`` is the last generation launched or one of its ancestors, and the
        step is not above where the line left it (a child resumed from lower). A
        state saved at the step a generation resumed from (a just-in-time save before
        its first step) is its parent's state."""
        parent = self.parents.get(writer)
        while parent is not None and parent[0] == step:
            step, writer = parent  # saved before it made a step: its parent's state
            parent = self.parents.get(writer)
        generation: int | None = self.state.generation
        limit: float = float("inf")
        while generation is not None and generation > 0:
            if writer == generation:
                return step <= limit
            parent = self.parents.get(generation)
            if parent is None:
                return False
            limit, generation = parent
        return False

    def usable(self) -> list[int]:
        """Every step a relaunch on the active nodes could resume from without leaving
        the timeline (or a rollback's bound, which takes the memory tier out)."""
        bound = self.diverged_below
        steps = [
            step
            for tier in (self.local, self.durable)
            for step, writer in tier.items()
            if self.on_timeline(step, writer) and (bound is None or step < bound)
        ]
        if bound is None:
            names = list(self.state.pool.active)
            candidates = {step for held in self.memory.values() for step in held}
            candidates |= {s for slots in self.replicas.values() for r in slots.values() for s in r}
            for step in candidates:
                copies = [self._memory_copy(n, i, names, step) for i, n in enumerate(names)]
                if names and all(c is not None and self.on_timeline(step, c) for c in copies):
                    steps.append(step)
        return steps

    def _check(self, found: Found | None) -> None:
        """The invariant, at a launch: the resume point is on the timeline (and below a
        rollback's bound), no newer than the newest surviving copy, and no usable
        checkpoint of the timeline is newer than it."""
        self.checks += 1
        usable = self.usable()
        newest = max(usable, default=None)
        if found is None:
            if newest is not None:
                raise InvariantBroken(f"resumed from scratch; step {newest} was usable")
            return
        if not self.on_timeline(found.step, found.writer):
            raise InvariantBroken(f"resumed from a left timeline: {found}")
        if self.diverged_below is not None and found.step >= self.diverged_below:
            raise InvariantBroken(
                f"resumed {found} at or above the rollback's {self.diverged_below}"
            )
        surviving = [*self.local, *self.durable, *(s for m in self.memory.values() for s in m)]
        surviving += [s for slots in self.replicas.values() for r in slots.values() for s in r]
        if found.step > max(surviving, default=-1):
            raise InvariantBroken(f"resumed {found}, newer than every surviving copy")
        if newest is not None and newest > found.step:
            raise InvariantBroken(f"resumed {found}; step {newest} of the timeline was usable")

    # ------------------------------------------------------------------ helpers

    def _keep(self, held: dict[int, int], step: int) -> None:
        """Commit ``step`` for the live generation and keep the newest ``memory_keep``."""
        assert self.live is not None
        held[step] = self.live
        for old in sorted(held)[: -self.config.memory_keep]:
            del held[old]


def _lowest(current: int | None, step: int) -> int:
    return step if current is None else min(current, step)
