"""The memory tier in the checkpoint search: the newest snapshot every relaunch node holds.

Each node's local rank 0 writes its node's copy of a step into the run's memory
directory (tmpfs) and commits it only after every node wrote theirs (see
:mod:`lazarus.rank.torch`). A relaunch may resume from step k only when every node
it will run on holds step k committed and whole: a rank reads its own node's copy.
So the search asks every relaunch node (local nodes directly, ssh nodes through the
shim), and takes the newest step they all hold. A node that cannot answer, or a
replacement node with no snapshot at all, makes the memory tier hold nothing, and
disk or durable serves: exactly what a node loss needs.

Judged alike for every node, from the facts the node reports (manifest and sizes):

* a snapshot whose sizes do not match its manifest is torn;
* one whose manifest names another job, or no job, is not this job's;
* one written by another world size is refused, like a disk checkpoint.

Those are listed in ``skipped`` (``location="memory"``). A step committed on some
nodes and absent on others is not a resume point but no fault either (a commit in
flight, or a new node), so it is passed over silently.

Never a timeline the job has left (:mod:`lazarus.domain.timeline`). Each
relaunch records where it resumed; a snapshot written by an older generation above
such a cut is refused as ``abandoned`` (after a rollback, a disk or durable
fallback, or a node that got further than the step everyone resumed from), and the
copies of one step must all come from one generation, so a resume never mixes two
trainings across nodes. A search with ``below_step`` (a rollback going back in
time) ignores the tier. A workflow that records no cuts yet (one started before
them) keeps the older, weaker rule: nothing at or below the newest retired step.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from activities.checkpoints.replica_key import run_secret
from activities.nodes.agent import MemorySnapshot, NodeAgent, RestoreEnd
from activities.nodes.code_root import lazarus_code_root
from activities.nodes.factory import agents, on_each_settled
from activities.program import rank_search_path
from lazarus.domain.checkpoint_layout import (
    MANIFEST,
    manifest_size_problem,
    step_dir_name,
)
from lazarus.domain.contracts import CheckpointRef, FindVerifiedCheckpointRequest, SkippedCheckpoint
from lazarus.domain.memory_tier import (
    address,
    keyed_port,
    node_memory_dir,
    on_node_dir,
    replica_dir,
    restore_key,
)
from lazarus.domain.timeline import manifest_generation
from lazarus.rank.transfer import deadline_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplicaRestore:
    """Copy the replica ``source`` on node ``holder`` to ``target`` on node ``node``
    (the slot's node, which lacks the step) before the launch."""

    node: str
    holder: str
    source: str
    target: str
    step: int
    bytes: int = 0
    """The replica's size, from its listing: the copy's deadline scales with it."""

    def describe(self) -> str:
        return f"step {self.step} of node {self.node} restored from the replica on {self.holder}"


@dataclass(frozen=True)
class HeldReplicas:
    """The replicas node ``holder`` holds of one slot's node, by step."""

    holder: str
    snapshots: dict[int, MemorySnapshot]


@dataclass(frozen=True)
class MemoryChoice:
    chosen: CheckpointRef | None = None
    skipped: list[SkippedCheckpoint] = field(default_factory=list)
    """Newer than ``chosen``, newest first."""
    unavailable: str | None = None
    """Why the tier could not be searched on every node (it then holds nothing)."""
    restores: list[ReplicaRestore] = field(default_factory=list)
    """Replicas ``chosen`` needs copied onto the nodes that lack it (a spare)."""
    restored: list[str] = field(default_factory=list)
    """The restores done, in words (for the search's answer)."""


def search_memory(request: FindVerifiedCheckpointRequest, *, restore: bool = False) -> MemoryChoice:
    """The newest step committed and whole on every node of ``request.access``
    (this machine when empty) in ``request.memory_dir``, or held for a node that lacks
    it by a live buddy's replica (``checkpoints.memory_replicas``), and the newer ones
    skipped. With ``restore`` (not in a read-only preview), the replicas the choice
    needs are copied onto the nodes that lack them before this returns; a copy that
    fails leaves the tier holding nothing (disk serves)."""
    root = request.memory_dir
    if root is None or (request.below_step is not None):
        return MemoryChoice()
    access = request.access.or_this_machine()
    names = [node.name for node in access.nodes]
    replicas = request.checkpoints.memory_replicas and len(names) > 1

    def listing(agent: NodeAgent) -> _NodeListing:
        return _list_node(agent, root, names, replicas)

    with agents(access) as opened:
        answers = on_each_settled(opened, listing)
        per_node: dict[str, dict[int, MemorySnapshot]] = {}
        held: dict[str, HeldReplicas] = {}
        for index, (name, answer) in enumerate(zip(names, answers, strict=True)):
            if isinstance(answer, Exception):
                why = f"node {name}: {answer}"
                log.warning("memory tier not searched: %s", why)
                return MemoryChoice(unavailable=why)
            own, replica_listing = answer
            per_node[name] = {snapshot.step: snapshot for snapshot in own}
            if replica_listing is not None:
                origin = names[(index - 1) % len(names)]
                held[origin] = HeldReplicas(name, {s.step: s for s in replica_listing})
        choice = choose(request, root, names, per_node, held)
        if restore and choice.restores:
            choice = _restore(choice, dict(zip(names, opened, strict=True)), request)
    return choice


_NodeListing = tuple[list[MemorySnapshot], list[MemorySnapshot] | None]
"""A node's own snapshots, and the replicas it holds (None: not asked, or not listed)."""


def _list_node(agent: NodeAgent, root: str, names: list[str], replicas: bool) -> _NodeListing:
    """One node's snapshots and, with ``replicas``, what it holds of its ring
    predecessor's slot (the node in slot ``i`` pushes to slot ``i + 1``; a spare takes
    its lost node's slot, so the buddy of a lost node still holds that slot's
    replicas), in one round trip. When that fails the two are listed apart: a node
    that cannot list its replicas holds none (the replicas only ever add resume
    points), while its own listing's failure is the tier's."""
    own = node_memory_dir(root, agent.node.name)
    if not replicas:
        return agent.memory_snapshots(own), None
    slot = (names.index(agent.node.name) - 1) % len(names)
    held_root = replica_dir(own, slot)
    try:
        mine, held = agent.memory_snapshots_in([own, held_root])
        return mine, held
    except Exception as exc:  # which root failed is found below
        log.debug("node %s: memory listed apart: %s", agent.node.name, exc)
    mine = agent.memory_snapshots(own)
    try:
        return mine, agent.memory_snapshots(held_root)
    except Exception as exc:  # replicas only ever add resume points
        log.warning("memory replicas on node %s not listed: %s", agent.node.name, exc)
        return mine, None


def _restore(
    choice: MemoryChoice, by_name: dict[str, NodeAgent], request: FindVerifiedCheckpointRequest
) -> MemoryChoice:
    """Copy each replica the choice needs onto its node, node to node: the node that
    lacks the step listens, its holder streams the replica there, both under a key
    derived for this copy alone, and the receiving end commits it only once every
    file matches the sender's MACed hashes and the manifest (:mod:`lazarus.rank.
    replica_restore`). This process starts the two ends and waits for their answers;
    it never holds a byte of state. A copy that fails leaves the tier holding nothing
    (disk serves), with the reason in one line."""
    done: list[str] = []
    names = list(by_name)
    for plan in choice.restores:
        started = time.monotonic()
        try:
            answer = _copy_node_to_node(plan, by_name, names.index(plan.node), request)
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        whole = time.monotonic() - started
        if "error" in answer:
            why = f"{plan.describe()} failed: {answer['error']}"
            log.warning("memory tier: %s", why)
            return MemoryChoice(skipped=choice.skipped, unavailable=why)
        copying = float(answer.get("copy_seconds") or answer.get("seconds") or 0.0)
        rate = f", {plan.bytes / copying / 1e9:.2f} GB/s" if copying > 0 else ""
        line = (
            f"{plan.describe()} ({plan.bytes / 2**20:.0f} MiB copied in {copying:.2f} s"
            f"{rate}; {whole:.2f} s with the two ends' start)"
        )
        log.info("memory tier: %s", line)
        done.append(line)
    return MemoryChoice(
        chosen=choice.chosen, skipped=choice.skipped, restores=choice.restores, restored=done
    )


def _node_side(agent: NodeAgent) -> dict[str, str]:
    """How a node runs its end of a restore: its own interpreter (``lazarus-rank``
    only), on its ranks' PATH (an ssh node's own), with Lazarus's checkout on the
    PYTHONPATH of local nodes only."""
    node = agent.node
    local = agent.runs_here
    return {
        "python": agent.node_python(),
        "search_path": rank_search_path(node.env.get("PATH"), node.launcher),
        "python_path": str(lazarus_code_root() or "") if local else "",
    }


def _copy_node_to_node(
    plan: ReplicaRestore,
    by_name: dict[str, NodeAgent],
    slot: int,
    request: FindVerifiedCheckpointRequest,
) -> dict[str, Any]:
    """Both ends of one restore at once; the receiving end's answer decides."""
    secret = run_secret(str(request.memory_dir))
    key = restore_key(secret, plan.step, slot)
    target, holder = by_name[plan.node], by_name[plan.holder]
    common = {
        "step": plan.step,
        "job_id": request.job_id,
        "timeout_s": deadline_for(plan.bytes),
        "key_hex": key.hex(),
        "address": address(target.node.host, keyed_port(key, slot)),
    }
    root = str(request.memory_dir)
    receive = RestoreEnd(
        verb="receive",
        path=on_node_dir(plan.target, root, plan.node),
        **common,
        **_node_side(target),
    )
    send = RestoreEnd(
        verb="send",
        path=on_node_dir(plan.source, root, plan.holder),
        **common,
        **_node_side(holder),
    )
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="replica-restore") as pool:
        received = pool.submit(target.restore_end, receive)
        sent = pool.submit(holder.restore_end, send)
        answer = received.result()
        sent_answer = sent.result()
    if "error" in answer and "error" in sent_answer:
        answer = {"error": f"{answer['error']}; the holder: {sent_answer['error']}"}
    return answer


def choose(
    request: FindVerifiedCheckpointRequest,
    root: str,
    node_names: list[str],
    per_node: dict[str, dict[int, MemorySnapshot]],
    replicas: dict[str, HeldReplicas] | None = None,
) -> MemoryChoice:
    """The cross-node choice, given what each node reported and the replicas live
    buddies hold for a node, by that node's name (pure: unit-tested). A node's own
    copy comes first; a replica serves only a node without one, and is judged like
    one (torn, another job, a timeline the job left, the world size), and its
    generation must match the other copies': one step, one timeline, every slot."""
    replicas = replicas or {}
    floor = None if request.timeline else max(request.exclude_steps, default=None)
    steps = {step for listed in per_node.values() for step in listed}
    steps |= {step for held in replicas.values() for step in held.snapshots}
    steps -= set(request.exclude_steps)
    if floor is not None:
        steps = {step for step in steps if step > floor}
    if request.below_step is not None:
        steps = {step for step in steps if step < request.below_step}
    skipped: list[SkippedCheckpoint] = []
    for step in sorted(steps, reverse=True):
        path = str(PurePosixPath(root) / step_dir_name(step))
        problems: list[str] = []
        everywhere = True
        writers: dict[str, object] = {}
        restores: list[ReplicaRestore] = []
        for name in node_names:
            snapshot = per_node.get(name, {}).get(step)
            where = f"node {name}"
            held = replicas.get(name)
            if snapshot is None and held is not None and step in held.snapshots:
                snapshot = held.snapshots[step]
                where = f"node {held.holder} (replica of node {name})"
                source = PurePosixPath(replica_dir(root, node_names.index(name)))
                restores.append(
                    ReplicaRestore(
                        node=name,
                        holder=held.holder,
                        source=str(source / step_dir_name(step)),
                        target=path,
                        step=step,
                        bytes=sum(snapshot.sizes.values()),
                    )
                )
            if snapshot is None:
                everywhere = False
                continue
            problem = snapshot_problem(snapshot, request)
            if problem is not None:
                problems.append(f"{where}: {problem}")
            elif snapshot.manifest is not None:
                writers[where] = snapshot.manifest.get("generation")
        if len(set(map(repr, writers.values()))) > 1:
            problems.append(
                "copies from different generations ("
                + ", ".join(f"{name}: {gen}" for name, gen in sorted(writers.items()))
                + "): two timelines"
            )
        if problems:
            skipped.append(
                SkippedCheckpoint(step=step, path=path, location="memory", problems=problems)
            )
        elif everywhere:
            return MemoryChoice(
                chosen=CheckpointRef(step=step, path=path), skipped=skipped, restores=restores
            )
    return MemoryChoice(skipped=skipped)


def snapshot_problem(
    snapshot: MemorySnapshot, request: FindVerifiedCheckpointRequest
) -> str | None:
    """Why one node's copy of a snapshot cannot be resumed from, or None."""
    manifest = snapshot.manifest
    if manifest is None:
        return f"{MANIFEST} unreadable"
    torn = manifest_size_problem(manifest, snapshot.step, snapshot.sizes.get)
    if torn is not None:
        return f"torn: {torn}"
    owner = manifest.get("job_id")
    if request.job_id is not None and owner != request.job_id:
        return f"written by job {owner}" if owner else "written outside Lazarus (no job id)"
    off = request.off_timeline(manifest_generation(manifest), snapshot.step)
    if off is not None:
        return off
    expected = request.expected_world_size
    if expected is not None and manifest.get("world_size") != expected:
        return (
            f"{MANIFEST}: written by a world of {manifest.get('world_size')} ranks, "
            f"expected {expected}"
        )
    return None
