"""Launching a generation of ranks: idempotent per (job, generation), fenced by generation.

A retried ``launch`` (the worker died mid-launch, or Temporal timed it out) must
adopt whatever already started rather than start duplicates. The run directory
is the source of truth: the port is fixed in ``plan.json`` before any rank
starts, each rank's wrapper writes its pid file, and ``launch.json`` marks the
launch complete. A file lock serialises two attempts that overlap in time.

Fencing: a launch of generation N refuses if a newer generation exists, and kills
anything still alive from older ones, and from every other run of the same job (a
terminated earlier run may have left ranks behind), so two generations are never
alive at once. Only groups whose pid files' start ticks match are signalled.

Warm starts (``warm_start`` in the spec): each local node's ranks are forked from
that node's zygote for the run (:mod:`activities.nodes.warm`), which writes
the same pid files as a cold start, so adoption and fencing above are unchanged; a
fork that cannot happen starts the rank cold, and ``LaunchResult.warm_start`` says
which ranks went which way and why. Fencing another run also stops its zygotes.
The spares the request names (``LaunchRequest.prewarm``) get the run's zygote started
beside the rank starts, not waited for (:meth:`NodeAgent.prewarm`), so a relaunch
onto one after a node loss forks warm; ``warm_start`` lists them, and why any was not.

Rejoin in place (``rejoin`` in the spec, ``LaunchRequest.rejoin_ranks``): the
previous generation's live ranks named there are carried over in their own process
instead of fenced and restarted (:mod:`activities.nodes.rejoin`); only the others
start. Each node's agent carries the ranks of its own slots where they run
(``NodeAgent.carry_survivors``: in this worker for local nodes, on the node through
the shim for ssh nodes) and fences everything else older there, so still no process
acts for an older generation once the survivors have read their rejoin request. A
survivor is carried only into its own node's slot (:func:`carry_slots`), and a rank
with no slot in the new world refuses the launch (``LaunchRefused``, naming it): the
workflow planned on other nodes. A group the carry's fencing could not kill refuses
the launch before any rank starts (:class:`~activities.nodes.rejoin.RanksWouldNotDie`).

A node that cannot be reached fails the launch at once (``NodeUnreachable``, not
retried: the workflow treats it as a node failure) after what this launch started
elsewhere is stopped, so no half-launched generation is left running.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.checkpoints.replica_key import ReplicaKeyError, run_secret
from activities.command_policy import CommandNotAllowed, enforce
from activities.heartbeat import in_thread_heartbeating
from activities.host_identity import this_host
from activities.nodes.agent import (
    NodeAgent,
    NodeRefused,
    NodeUnreachable,
    RankStartFailed,
    ShimError,
)
from activities.nodes.code_root import lazarus_code_root
from activities.nodes.factory import agents, on_each, on_each_settled
from activities.nodes.node_records import (
    CarryRequest,
    CarryResult,
    RankLaunch,
    StartedRank,
    WarmStart,
)
from activities.nodes.rejoin import RanksWouldNotDie, rejoin_variables
from activities.nodes.rundir import (
    GenerationDir,
    control_document,
    generation_lock,
    generations,
    job_root,
    read_json,
    runs,
    write_json_atomic,
)
from activities.nodes.secret_env import (
    SecretEnvError,
    passed_env,
    read_env_file,
    without_worker_secrets,
)
from activities.nodes.warm_starts import stop_run_zygotes
from activities.program import rank_paths, rank_search_path, rendezvous_host
from lazarus.domain import chaos_points
from lazarus.domain import environment as env_names
from lazarus.domain.chaos_points import chaos_point
from lazarus.domain.contracts import (
    CheckpointRef,
    LaunchRequest,
    LaunchResult,
    NodeAccess,
    RankProcess,
    WarmStartOutcome,
)
from lazarus.domain.memory_tier import (
    memory_checkpoint_dir,
    node_memory_dir,
    on_node_dir,
    replica_environment,
)
from lazarus.domain.ports import free_port
from lazarus.domain.process_groups import UnkillableGroup
from lazarus.domain.spec import JobSpec, NodeSpec

RANK_IMPORT_ROOT = lazarus_code_root()
"""Where ranks import Lazarus's code from (:func:`lazarus_code_root`), once per worker."""
FENCE_KILL_WAIT_S = 10.0
"""How long fencing waits for SIGKILLed groups of other generations to die."""
FENCE_LOCK_WAIT_S = 10.0
"""How long fencing waits for another generation's launch lock before fencing anyway."""

log = logging.getLogger(__name__)
T = TypeVar("T")

__all__ = ["LaunchRefused", "LaunchUnreachable", "RanksWouldNotDie", "launch_generation"]


class LaunchRefused(Exception):
    """A launch that must not be retried: fenced, or a command that cannot start."""


class LaunchUnreachable(Exception):
    """Nodes could not be reached during a launch: a node failure for the workflow's
    playbook (a spare, or NEEDS_OPERATOR), never a terminal failure of the job."""

    def __init__(
        self, message: str, nodes: list[str], started_on: list[NodeSpec] | None = None
    ) -> None:
        super().__init__(message)
        self.nodes = nodes
        self.started_on = started_on or []
        """Nodes that were reached, so may run ranks of this launch: to be stopped."""


DERIVED_PORTS = range(20000, 32768)
"""Where derived rendezvous ports fall: below Linux's default ephemeral range
(``ip_local_port_range``, 32768 to 60999). A port inside it may already be the local
end of an outgoing connection on the master node, and the TCPStore then fails with
EADDRINUSE: CI lost a relaunch to port 32840 on a busy host."""


def derived_port(job_id: str, generation: int) -> int:
    """A port the whole world agrees on without asking a remote node: stable per
    (job, generation), so a retried launch computes the same one (it also reads it
    back from the generation's plan, so a controller upgrade never moves it)."""
    digest = hashlib.sha256(f"{job_id}/{generation}".encode()).digest()
    return DERIVED_PORTS[int.from_bytes(digest[:4], "big") % len(DERIVED_PORTS)]


def rank_environment(
    spec: JobSpec,
    nodes: list[NodeSpec],
    node_index: int,
    gen: GenerationDir,
    rank: int,
    master_port: int,
    resume: CheckpointRef | None,
    worker_env: Mapping[str, str] | None = None,
    replica_secret: str | None = None,
) -> dict[str, str]:
    """The environment torchrun would set, plus Lazarus's own contract.

    Precedence, lowest first: the worker's environment (local nodes only), the
    ``env_from_file`` values (local nodes; the shim reads it on ssh nodes, see
    :func:`rank_env_file`), ``env``, the node's ``env``, ``pass_env``, then Lazarus's
    own variables (PATH and PYTHONPATH: :func:`~activities.program.rank_paths`).
    Raises :class:`LaunchRefused` for a secret that cannot be supplied.

    ``worker_env`` stands in for this worker's environment (default ``os.environ``):
    ``start --dry-run`` passes only placeholders, since it cannot know the worker's.
    """
    source = os.environ if worker_env is None else worker_env
    local = nodes[node_index].transport.runs_here
    # The worker's credentials for Temporal are not the job's to use.
    env = without_worker_secrets(source) if local else {}
    try:
        if local and spec.env_from_file is not None:
            env.update(read_env_file(spec.env_from_file))
        env.update(spec.env)
        env.update(nodes[node_index].env)
        env.update(passed_env(spec.pass_env, source))
    except SecretEnvError as exc:
        raise LaunchRefused(str(exc)) from None
    env.update(
        env_names.torchrun_environment(
            rank=rank,
            nproc_per_node=spec.nproc_per_node,
            node_index=node_index,
            nodes=len(nodes),
            master_addr=rendezvous_host(nodes[0], spec.ssh),
            master_port=master_port,
            generation=gen.generation,
            max_restarts=spec.recovery.max_restarts,
            job_id=spec.job_id,
            job_env=env,
        )
    )
    env.update(
        {
            env_names.JOB_ID: spec.job_id,
            env_names.GENERATION: str(gen.generation),
            env_names.HEARTBEAT_FILE: str(gen.heartbeat_file(rank)),
            env_names.CHECKPOINT_DIR: spec.checkpoint_dir,
            env_names.CONTROL_FILE: str(gen.control_file),
            env_names.RUN_DIR: str(gen.path),
            env_names.NODE: nodes[node_index].name,
            "PYTHONUNBUFFERED": "1",
        }
    )
    for name in CHECKPOINT_TIER_VARIABLES:  # the worker's own must never leak into a rank
        env.pop(name, None)
    node = nodes[node_index].name
    env.update(checkpoint_tier_environment(spec, gen, node))
    memory_dir = run_memory_dir(spec, gen)
    if spec.checkpoints.memory_replicas and memory_dir is not None:
        hosts = [rendezvous_host(node, spec.ssh) for node in nodes]
        secret = replica_secret or _run_secret(memory_dir)
        env.update(replica_environment(secret, gen.generation, hosts, node_index))
    env.pop(env_names.RESUME_FROM, None)
    env.pop(env_names.RESUME_STEP, None)
    if resume is not None:
        # A memory step is named once for every node: each rank reads its own node's copy.
        where = resume.path if memory_dir is None else on_node_dir(resume.path, memory_dir, node)
        env[env_names.RESUME_FROM] = where
        env[env_names.RESUME_STEP] = str(resume.step)
    env.pop(env_names.REJOIN_TIMEOUT_S, None)
    if spec.rejoins is not None:
        env[env_names.REJOIN_TIMEOUT_S] = str(spec.rejoins.timeout_s)
    for name, value in rank_paths(spec, nodes[node_index], source, RANK_IMPORT_ROOT).items():
        if value:
            env[name] = value
        else:
            env.pop(name, None)
    return env


def _run_secret(memory_dir: str) -> str:
    """The run's replica secret (:mod:`activities.checkpoints.replica_key`); a worker
    whose key is unusable refuses the launch, naming the file."""
    try:
        return run_secret(memory_dir)
    except ReplicaKeyError as exc:
        raise LaunchRefused(str(exc)) from None


def run_memory_dir(spec: JobSpec, gen: GenerationDir) -> str | None:
    """The memory tier's directory for ``gen``'s run on every node
    (:func:`lazarus.domain.memory_tier.memory_checkpoint_dir`), or None when
    ``checkpoints.memory_every_steps`` leaves the tier off."""
    if spec.checkpoints.memory_every_steps is None:
        return None
    run_root = gen.path.parent
    legacy = run_root == job_root(spec.run_dir, spec.job_id)
    return memory_checkpoint_dir(spec.job_id, None if legacy else str(run_root))


CHECKPOINT_TIER_VARIABLES = (
    env_names.CHECKPOINT_EVERY_STEPS,
    env_names.MEMORY_CHECKPOINT_DIR,
    env_names.MEMORY_EVERY_STEPS,
    env_names.MEMORY_KEEP,
    env_names.MEMORY_REPLICA_LISTEN,
    env_names.MEMORY_REPLICA_TO,
    env_names.MEMORY_REPLICA_FROM,
    env_names.MEMORY_REPLICA_SECRET,
)


def checkpoint_tier_environment(spec: JobSpec, gen: GenerationDir, node: str) -> dict[str, str]:
    """The checkpoint tiers' variables ``checkpoints:`` sets: the disk interval when
    ``every_steps`` is given, the memory tier's three when ``memory_every_steps`` is
    (the directory ``node``'s own, :func:`lazarus.domain.memory_tier.node_memory_dir`)."""
    checkpoints = spec.checkpoints
    env: dict[str, str] = {}
    if checkpoints.every_steps is not None:
        env[env_names.CHECKPOINT_EVERY_STEPS] = str(checkpoints.every_steps)
    memory_dir = run_memory_dir(spec, gen)
    if memory_dir is not None:
        env[env_names.MEMORY_CHECKPOINT_DIR] = node_memory_dir(memory_dir, node)
        env[env_names.MEMORY_EVERY_STEPS] = str(checkpoints.memory_every_steps)
        env[env_names.MEMORY_KEEP] = str(checkpoints.memory_keep)
    return env


def initial_control_document(spec: JobSpec) -> dict[str, object]:
    """``control.json`` as a launch writes it: no request, the spec's intervals."""
    return control_document(
        0,
        checkpoint_every_steps=spec.checkpoints.every_steps,
        memory_every_steps=spec.checkpoints.memory_every_steps,
    )


def rank_env_file(spec: JobSpec, node: NodeSpec) -> str | None:
    """The ``env_from_file`` the node itself must read: ssh nodes only (for local
    nodes :func:`rank_environment` has read it already)."""
    return None if node.transport.runs_here else spec.env_from_file


def _older_generations(run_root: Path, generation: int) -> list[GenerationDir]:
    """The run's generations before ``generation``; refuses when a newer one exists."""
    older: list[GenerationDir] = []
    for gen in generations(run_root):
        if gen.generation > generation:
            raise LaunchRefused(
                f"generation {generation} is fenced: generation {gen.generation} already exists"
            )
        if gen.generation < generation:
            older.append(gen)
    return older


def _fence_older_steps(opened: list[NodeAgent], run_root: Path, generation: int) -> None:
    """The safety net where :meth:`NodeAgent.fence_here` cannot reach (Slurm: an older
    generation's ranks run on compute nodes): every node's agent fences the older
    generations it took part in (:meth:`NodeAgent.fence_older_generations`)."""

    def fence_on(agent: NodeAgent) -> None:
        result = agent.fence_older_generations(str(run_root), generation, FENCE_KILL_WAIT_S)
        if result is None:
            return
        for group in result.unkillable:
            log.warning("fencing: %s", group.reason)
        if not result.reachable:
            log.warning("fencing on node %s: %s", agent.node.name, result.error)

    on_each(opened, fence_on)


def _other_runs(job_dir: Path, run_root: Path) -> list[Path]:
    """Every other run of this job with generations: earlier runs in their own
    directories, and the legacy generations directly under the job directory."""
    others = [r for r in runs(job_dir) if r.resolve() != run_root.resolve()]
    if job_dir.resolve() != run_root.resolve() and generations(job_dir):
        others.append(job_dir)
    return others


def _fence_here(
    opened: list[NodeAgent],
    older: list[GenerationDir],
    others: list[Path],
    keep: frozenset[int] = frozenset(),
) -> list[UnkillableGroup]:
    """The machine-wide net behind each node's own fencing (:meth:`NodeAgent.fence_here`,
    asked of the first node's agent: a job's nodes share one launcher). Returns the
    groups of ``older`` that would not die."""
    other_gens = [g for other in others for g in generations(other)]
    return opened[0].fence_here(older, other_gens, keep, FENCE_KILL_WAIT_S, FENCE_LOCK_WAIT_S)


def _fence_other_runs_remotely(opened: list[NodeAgent], others: list[Path], job_id: str) -> None:
    """Earlier runs' ranks on nodes of their own live in the nodes' own run directories:
    stop them there too, with their zygotes (which would fork for nobody) and their
    memory-tier snapshots (:meth:`NodeAgent.fence_earlier_runs`). Raises
    :class:`LaunchUnreachable` for nodes that cannot be reached (nothing has been
    started yet)."""
    if not others:
        return
    earlier = {
        str(other): [memory_checkpoint_dir(job_id, None if other.name == job_id else str(other))]
        for other in others
    }
    outcomes = on_each(opened, lambda agent: agent.fence_earlier_runs(earlier, FENCE_KILL_WAIT_S))
    errors = {a.node.name: e for a, e in zip(opened, outcomes, strict=True) if e}
    if errors:
        raise LaunchUnreachable(
            f"cannot reach {', '.join(errors)} to fence earlier runs: "
            + "; ".join(errors.values()),
            list(errors),
        )


def _master_port(spec: JobSpec, nodes: list[NodeSpec], generation: int) -> int:
    if nodes[0].transport.runs_here:
        return free_port(nodes[0].host)
    return derived_port(spec.job_id, generation)


def launch_generation(request: LaunchRequest) -> LaunchResult:
    """Blocking core of :func:`launch`; also used directly by tests and benches."""
    nodes = request.nodes or request.spec.nodes
    # The worker is the trust boundary: its allow-list, not the client, decides.
    enforce(
        "command",
        request.spec.command,
        workdir=request.spec.workdir,
        search_path=rank_search_path(request.spec.env.get("PATH")),
        remote=not nodes[0].transport.runs_here,
    )
    try:
        return _launch_generation(request)
    except LaunchUnreachable as exc:
        _stop_half_launch(request, exc)
        drained = _drain_lost(request, exc)
        if drained:
            raise LaunchUnreachable(
                f"{exc}; {'; '.join(drained)}", exc.nodes, exc.started_on
            ) from exc
        raise


def _drain_lost(request: LaunchRequest, exc: LaunchUnreachable) -> list[str]:
    """Nodes a launch found lost that their scheduler says are lost too (Slurm: DOWN,
    DRAIN, ...) are drained as the supervisor drains them, since the workflow takes
    this as a node loss; the lines say what happened, for the incident's evidence.
    Nodes without a scheduler answer None (:meth:`NodeAgent.drain_if_lost`)."""
    spec = request.spec
    lost = [node for node in request.nodes or spec.nodes if node.name in exc.nodes]
    with agents(NodeAccess.of(spec, lost)) as opened:
        done = [agent.drain_if_lost("node_lost", spec.job_id) for agent in opened]
    return [result.evidence() for result in done if result is not None]


def outside_the_world(request: LaunchRequest) -> list[int]:
    """Ranks the launch is asked to carry over that have no slot in its world: the
    workflow planned them on more nodes than launch now (a shrink after the plan)."""
    world = len(request.nodes or request.spec.nodes) * request.spec.nproc_per_node
    return sorted(r for r in set(request.rejoin_ranks) if not 0 <= r < world)


def carry_slots(
    previous_plan: Mapping[str, Any] | None,
    ranks: list[int],
    nodes: list[NodeSpec],
    nproc_per_node: int,
) -> tuple[dict[str, list[int]], list[str]]:
    """Which node carries each rank the launch is asked to carry (its slot's node:
    ``rank // nproc_per_node``), and why the others are not carried. A rank whose slot
    now names another node than the one that ran it (a spare swapped in after the
    rejoin was planned) is not: it would act for the new node's slot from one that has
    left the pool. Its rank starts afresh on the new node; the old process is fenced
    by the stop the workflow sends the node that left (and here, for local nodes). A
    previous plan that does not say its nodes keeps every rank in its slot.
    ``ranks`` must be inside the world (:func:`outside_the_world`)."""
    before = (previous_plan or {}).get("nodes")
    per_node = (previous_plan or {}).get("nproc_per_node", nproc_per_node)
    known = isinstance(before, list) and isinstance(per_node, int) and per_node >= 1
    slots: dict[str, list[int]] = {node.name: [] for node in nodes}
    refused: list[str] = []
    for rank in sorted(set(ranks)):
        now = nodes[rank // nproc_per_node].name
        if known:
            assert isinstance(before, list) and isinstance(per_node, int)
            was = before[rank // per_node] if rank // per_node < len(before) else None
            if was != now:
                refused.append(f"rank {rank}: its node {was} left the pool ({now} took its slot)")
                continue
        slots[now].append(rank)
    return slots, refused


def _carry_everywhere(
    opened: list[NodeAgent],
    previous: GenerationDir,
    gen: GenerationDir,
    slots: Mapping[str, list[int]],
    environment_of: Callable[[int], dict[str, str]],
    command: list[str],
    workdir: str,
    start: tuple[Callable[[NodeAgent], list[RankLaunch]], WarmStart] | None = None,
) -> list[tuple[CarryResult, dict[int, StartedRank]]]:
    """Every node carries its own survivors and fences the rest of the older
    generations there (:meth:`NodeAgent.carry_survivors`), all nodes at once. A node
    asked to carry nothing is still fenced: a rank that failed may have left a process.

    With ``start`` (warm starts: each node's launches, and ``warm_start``) a node that
    can also forks the ranks it did not carry in the same call
    (:meth:`NodeAgent.carry_and_start`); the ranks started so are returned beside each
    node's carry, and the launch starts the rest as usual."""

    def carry_on(agent: NodeAgent) -> tuple[CarryResult, dict[int, StartedRank]]:
        ranks = slots.get(agent.node.name, [])
        first = environment_of(ranks[0] if ranks else 0)
        request = CarryRequest(
            run_root=str(gen.path.parent),
            previous_gen_dir=str(previous.path),
            gen_dir=str(gen.path),
            generation=gen.generation,
            ranks=ranks,
            env={r: rejoin_variables(environment_of(r)) for r in ranks},
            node=agent.node.name,
            kill_wait_s=FENCE_KILL_WAIT_S,
            lock_timeout_s=FENCE_LOCK_WAIT_S,
            program=command[0],
            workdir=workdir,
            search_path=first.get("PATH", ""),
            python_path=first.get("PYTHONPATH", ""),
        )
        if start is None:
            return agent.carry_survivors(request), {}
        launches_on, warm = start
        return agent.carry_and_start(request, str(gen.path), launches_on(agent), warm)

    results = _on_every_node(opened, carry_on, "the carry of survivors")
    for result, _ in results:
        for group in result.unkillable:
            log.warning("fencing: %s", group.reason)
    return results


def _generation_plan(spec: JobSpec, nodes: list[NodeSpec], gen: GenerationDir) -> dict[str, Any]:
    """The generation's ``plan.json``, written before any rank starts (or carries
    over) and read back by a retried launch, so the port never moves."""
    plan = read_json(gen.plan_file)
    if plan is None:
        plan = {
            "master_port": _master_port(spec, nodes, gen.generation),
            "nodes": [n.name for n in nodes],
            # With the node order, says which logical node launched each rank: a
            # stop of one node must never touch another's (local nodes share files).
            "nproc_per_node": spec.nproc_per_node,
        }
        write_json_atomic(gen.plan_file, plan)
    return plan


_PROCESS_FIELDS = {"rank", "pid", "pgid", "start_ticks", "log_file"}


def _launch_generation(request: LaunchRequest) -> LaunchResult:
    spec = request.spec
    nodes = request.nodes or spec.nodes
    outside = outside_the_world(request)
    if outside:
        # Before anything is fenced or started: the same request can only fail again.
        raise LaunchRefused(
            f"rejoin: rank{'s' if len(outside) > 1 else ''} {', '.join(map(str, outside))} "
            f"cannot be carried into a world of {len(nodes) * spec.nproc_per_node} ranks "
            f"on {', '.join(n.name for n in nodes)}; relaunch the whole generation"
        )
    job_dir = job_root(spec.run_dir, spec.job_id)
    root = Path(request.run_root) if request.run_root is not None else job_dir
    gen = GenerationDir.of(root, request.generation)
    gen.path.mkdir(parents=True, exist_ok=True)
    with generation_lock(gen), agents(NodeAccess.of(spec, nodes)) as opened:
        older = _older_generations(root, request.generation)
        others = _other_runs(job_dir, root)
        previous = max(older, key=lambda g: g.generation) if older else None
        stopped = gen.stopped_file.exists()
        carrying = previous is not None and bool(request.rejoin_ranks) and not stopped
        # Carrying tells the survivors the new generation's port: fix it first.
        plan = _generation_plan(spec, nodes, gen) if carrying else None

        def environment_of(rank: int) -> dict[str, str]:
            index = rank // spec.nproc_per_node
            assert plan is not None
            port = int(plan["master_port"])
            return rank_environment(spec, nodes, index, gen, rank, port, request.resume)

        warm = (
            WarmStart(run_root=str(root), preload=spec.warm.preload, standby=spec.warm.standby)
            if spec.warm is not None
            else None
        )

        def launches_on(agent: NodeAgent, kept: frozenset[int] = frozenset()) -> list[RankLaunch]:
            """The node's ranks to start: all of its slot but those ``kept`` (carried)."""
            first = nodes.index(agent.node) * spec.nproc_per_node
            return [
                RankLaunch(
                    rank=rank,
                    command=spec.command,
                    env=environment_of(rank),
                    workdir=spec.workdir,
                    env_file=rank_env_file(spec, agent.node),
                )
                for rank in range(first, first + spec.nproc_per_node)
                if rank not in kept
            ]

        carried: list[RankProcess] = []
        refused: list[str] = []
        stuck: list[UnkillableGroup] = []
        started_early: dict[str, dict[int, StartedRank]] = {}
        if carrying and previous is not None:
            slots, refused = carry_slots(
                read_json(previous.plan_file), request.rejoin_ranks, nodes, spec.nproc_per_node
            )
            results = _carry_everywhere(
                opened,
                previous,
                gen,
                slots,
                environment_of,
                spec.command,
                spec.workdir,
                start=(launches_on, warm) if warm is not None else None,
            )
            for node, (answer, early) in zip(nodes, results, strict=True):
                started_early[node.name] = early
                carried += [
                    RankProcess(node=node.name, **r.model_dump(include=_PROCESS_FIELDS))
                    for r in answer.carried
                ]
                refused += answer.refused
                stuck += answer.unkillable
        # The machine-wide net behind each node's own fencing (Slurm: by step, below).
        stuck += _fence_here(opened, older, others, keep=frozenset(r.pgid for r in carried))
        if stuck:
            # Without rejoin the workflow's stop finds them and never launches (its
            # stuck_ranks); a carry replaces that stop, so it must refuse in its place.
            raise RanksWouldNotDie(list({(g.node, g.pgid): g for g in stuck}.values()))
        for other in others:  # an earlier run's zygotes would fork for nobody
            stop_run_zygotes(other)
        if stopped:
            raise LaunchRefused(f"generation {request.generation} was stopped; launch a new one")
        done = read_json(gen.launch_file)
        if done is not None:
            return LaunchResult.model_validate({**done, "adopted": True})
        refusal = opened[0].prepare_launch(spec, carried=bool(carried))
        if refusal is not None:
            raise LaunchRefused(refusal)
        plan = _generation_plan(spec, nodes, gen)
        master_port = int(plan["master_port"])
        write_json_atomic(gen.control_file, initial_control_document(spec))
        kept = frozenset(r.rank for r in carried)

        def start_on(agent: NodeAgent) -> list[StartedRank]:
            early = started_early.get(agent.node.name, {})
            launches = [launch for launch in launches_on(agent, kept) if launch.rank not in early]
            started = [early[rank] for rank in sorted(early) if rank not in kept]
            if not launches:
                return started
            if warm is not None:
                return started + agent.start_ranks_warm(str(gen.path), launches, warm)
            return started + agent.start_ranks(str(gen.path), launches)

        chaos_point(chaos_points.LAUNCH_BEFORE_PIDS)
        first_launch = all(g.generation == request.generation for g in generations(root))
        if first_launch:  # later launches of this run already fenced them
            _fence_other_runs_remotely(opened, others, spec.job_id)
        if older and not carrying:
            # A carry fenced every node already, the survivors excepted: this net's
            # stop, which keeps no group, would kill them after their rejoin request.
            _fence_older_steps(opened, root, request.generation)
        spares = prewarm_targets(request, nodes) if warm is not None else []
        if warm is not None and spares:
            with ThreadPoolExecutor(max_workers=1) as beside:  # never delays a rank's start
                prewarming = beside.submit(
                    _prewarm_spares, request, spares, nodes, gen, master_port, warm
                )
                per_node = _start_everywhere(opened, start_on)
                prewarmed = prewarming.result()
        else:
            per_node = _start_everywhere(opened, start_on)
            prewarmed = Prewarmed()
        ranks = [
            RankProcess(
                rank=r.rank,
                node=node.name,
                pid=r.pid,
                pgid=r.pgid,
                start_ticks=r.start_ticks,
                log_file=r.log_file,
            )
            for node, started in zip(nodes, per_node, strict=True)
            for r in started
        ]
        ranks += carried
        ranks.sort(key=lambda r: r.rank)
        result = LaunchResult(
            generation=request.generation,
            master_addr=rendezvous_host(nodes[0], spec.ssh),
            master_port=master_port,
            run_dir=str(gen.path),
            ranks=ranks,
            launched_at=time.time(),
            adopted=any(r.adopted for started in per_node for r in started),
            ranks_started_at=ranks_started_at(gen, nodes, ranks),
            warm_start=(
                warm_start_outcome(nodes, per_node, prewarmed) if spec.warm is not None else None
            ),
            rejoined=sorted(kept),
            rejoin_refused=refused,
        )
        chaos_point(chaos_points.LAUNCH_BEFORE_LAUNCH_JSON)
        write_json_atomic(gen.launch_file, result.model_dump(mode="json", exclude={"adopted"}))
        return result


def ranks_started_at(
    gen: GenerationDir, nodes: list[NodeSpec], ranks: list[RankProcess]
) -> float | None:
    """When the last rank's process started, from the pid files (adopted ranks
    included): the recovery timeline's "rank process started" for scripts without
    the rank helper. Only where the run directory is this machine's (local nodes);
    None elsewhere, or when a pid file does not say (the rank helper's own mark
    still fills the phase)."""
    if not ranks or not all(node.transport.runs_here for node in nodes):
        return None
    times: list[float] = []
    for rank in ranks:
        record = read_json(gen.pid_file(rank.rank))
        at = record.get("started_at") if record is not None else None
        if not isinstance(at, int | float) or isinstance(at, bool):
            return None
        times.append(float(at))
    return max(times)


@dataclass(frozen=True)
class Prewarmed:
    """What a launch's prewarm of the spares did (:func:`_prewarm_spares`)."""

    nodes: list[str] = field(default_factory=list)
    """Spares whose zygote runs: started now, or found running."""
    failed: list[str] = field(default_factory=list)
    """``"<node>: <reason>"`` for each spare whose zygote could not be started."""


def prewarm_targets(request: LaunchRequest, nodes: list[NodeSpec]) -> list[NodeSpec]:
    """The spares to prewarm: those the request names, less any node that runs ranks
    in this generation (its zygote is the launch's own to start)."""
    running = {node.name for node in nodes}
    return [node for node in request.prewarm if node.name not in running]


def _prewarm_spares(
    request: LaunchRequest,
    spares: list[NodeSpec],
    nodes: list[NodeSpec],
    gen: GenerationDir,
    master_port: int,
    warm: WarmStart,
) -> Prewarmed:
    """Start the run's zygote on each spare (:meth:`NodeAgent.prewarm`), all at once,
    beside the launch's rank starts: no rank waits for it, and each is bounded by one
    round trip. The zygote gets the environment the spare's ranks would share were it
    the next node of this generation (the per-rank variables are the fork's to set).
    A spare that cannot be prewarmed is only noted: its first launch starts the
    zygote itself, as without prewarming."""
    spec = request.spec

    def on(agent: NodeAgent) -> str | None:
        rank = len(nodes) * spec.nproc_per_node
        world = [*nodes, agent.node]
        env = rank_environment(spec, world, len(nodes), gen, rank, master_port, request.resume)
        launch = RankLaunch(
            rank=rank,
            command=spec.command,
            env=env,
            workdir=spec.workdir,
            env_file=rank_env_file(spec, agent.node),
        )
        return agent.prewarm(launch, warm)

    done = Prewarmed()
    try:
        with agents(NodeAccess.of(spec, spares)) as opened:
            outcomes = on_each_settled(opened, on)
    except Exception as exc:  # the spares only: the launch itself goes on
        return Prewarmed(failed=[f"{node.name}: {exc}" for node in spares])
    for node, outcome in zip(spares, outcomes, strict=True):
        if outcome is None:
            done.nodes.append(node.name)
        else:
            done.failed.append(f"{node.name}: {outcome}")
            log.warning("prewarm of spare %s: %s", node.name, outcome)
    return done


def warm_start_outcome(
    nodes: list[NodeSpec],
    per_node: list[list[StartedRank]],
    prewarmed: Prewarmed | None = None,
) -> WarmStartOutcome:
    """Which ranks were forked warm and which started cold, with each node's reasons,
    and which spares were prewarmed."""
    warm = [r for started in per_node for r in started if r.warm]
    cold = [r for started in per_node for r in started if not r.warm]
    reasons: list[str] = []
    for node, started in zip(nodes, per_node, strict=True):
        for reason in dict.fromkeys(r.cold_reason for r in started if r.cold_reason):
            reasons.append(f"{node.name}: {reason}")
    return WarmStartOutcome(
        warm_ranks=sorted(r.rank for r in warm),
        cold_ranks=sorted(r.rank for r in cold),
        from_standby=sum(1 for r in warm if r.from_standby),
        fallback_reasons=reasons,
        prewarmed=prewarmed.nodes if prewarmed is not None else [],
        not_prewarmed=prewarmed.failed if prewarmed is not None else [],
    )


def _start_everywhere(
    opened: list[NodeAgent], start_on: Callable[[NodeAgent], list[StartedRank]]
) -> list[list[StartedRank]]:
    """Start on every node at once (see :func:`_on_every_node`)."""
    return _on_every_node(opened, start_on, "launch")


def _on_every_node(opened: list[NodeAgent], fn: Callable[[NodeAgent], T], what: str) -> list[T]:
    """Run one step of the launch on every node at once; every node's call finishes
    before this returns or raises, so a failure never leaves one running in the
    background. Unreachable nodes raise :class:`LaunchUnreachable` (the others were
    reached, so may run ranks of this launch: they are stopped), a node that refuses
    or a command that cannot start :class:`LaunchRefused`."""
    outcomes = on_each_settled(opened, fn)
    unreachable = [
        (agent, exc)
        for agent, exc in zip(opened, outcomes, strict=True)
        if isinstance(exc, NodeUnreachable)
    ]
    if unreachable:
        names = [agent.node.name for agent, _ in unreachable]
        raise LaunchUnreachable(
            f"node{'s' if len(names) > 1 else ''} {', '.join(names)} unreachable during "
            f"{what}: " + "; ".join(str(exc) for _, exc in unreachable),
            names,
            started_on=[a.node for a in opened if a.node.name not in names],
        )
    done: list[T] = []
    for outcome in outcomes:
        if isinstance(outcome, RankStartFailed):
            raise LaunchRefused(f"command: {outcome}; fix the spec's command or PATH") from outcome
        if isinstance(outcome, (NodeRefused, ShimError)):
            raise LaunchRefused(str(outcome)) from outcome
        if isinstance(outcome, BaseException):
            raise outcome
        done.append(outcome)
    return done


def _stop_half_launch(request: LaunchRequest, exc: LaunchUnreachable) -> None:
    """Stop what a launch that met an unreachable node started on the others: a
    half-launched generation would wait forever for its missing peers. Run after the
    launch lock is released (the local stop takes that lock itself). The generation is
    marked stopped: the next launch must use a new generation number."""
    if not exc.started_on:
        return
    root = request.run_root or str(job_root(request.spec.run_dir, request.spec.job_id))
    with agents(NodeAccess.of(request.spec, exc.started_on)) as opened:
        results = on_each(opened, lambda agent: agent.stop(root, None, 0.0, FENCE_KILL_WAIT_S))
    for result in results:
        for group in result.unkillable:
            log.warning("stopping a half launch: %s", group.reason)


@activity.defn(name="launch")
async def launch(request: LaunchRequest) -> LaunchResult:
    """Start (or adopt) every rank of one generation, detached from this worker.

    Heartbeats while it works, so a worker killed mid-launch is noticed within the
    heartbeat timeout and the retry (on any worker) adopts what was started, instead
    of waiting out the whole start-to-close timeout."""
    try:
        result = await in_thread_heartbeating(
            lambda: launch_generation(request), lambda: "launching"
        )
    except LaunchRefused as exc:
        raise ApplicationError(str(exc), type="LaunchRefused", non_retryable=True) from exc
    except RanksWouldNotDie as exc:
        # Not retried: a retry would carry again and meet the same processes.
        raise ApplicationError(
            str(exc), *(g.node for g in exc.groups), type="RanksWouldNotDie", non_retryable=True
        ) from exc
    except CommandNotAllowed as exc:
        raise exc.application_error() from exc
    except LaunchUnreachable as exc:
        raise ApplicationError(
            str(exc), *exc.nodes, type="NodeUnreachable", non_retryable=True
        ) from exc
    if all(node.transport.runs_here for node in request.nodes or request.spec.nodes):
        # Local ranks live on this machine: the job routes its machine-bound work here.
        result = result.model_copy(update={"host": this_host()})
    return result
