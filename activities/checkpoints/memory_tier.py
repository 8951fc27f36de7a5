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
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from activities.nodes.agent import MemorySnapshot, NodeAgent
from activities.nodes.factory import agents, on_each_settled
from lazarus.domain.checkpoint_layout import (
    MANIFEST,
    manifest_size_problem,
    step_dir_name,
)
from lazarus.domain.contracts import CheckpointRef, FindVerifiedCheckpointRequest, SkippedCheckpoint
from lazarus.domain.timeline import abandoned_reason

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryChoice:
    chosen: CheckpointRef | None = None
    skipped: list[SkippedCheckpoint] = field(default_factory=list)
    """Newer than ``chosen``, newest first."""
    unavailable: str | None = None
    """Why the tier could not be searched on every node (it then holds nothing)."""


def search_memory(request: FindVerifiedCheckpointRequest) -> MemoryChoice:
    """The newest step committed and whole on every node of ``request.access``
    (this machine when empty) in ``request.memory_dir``, and the newer ones skipped."""
    root = request.memory_dir
    if root is None or (request.below_step is not None):
        return MemoryChoice()
    access = request.access.or_this_machine()

    def listing(agent: NodeAgent) -> list[MemorySnapshot]:
        return agent.memory_snapshots(root)

    with agents(access) as opened:
        answers = on_each_settled(opened, listing)
    per_node: dict[str, dict[int, MemorySnapshot]] = {}
    for node, answer in zip(access.nodes, answers, strict=True):
        if isinstance(answer, Exception):
            why = f"node {node.name}: {answer}"
            log.warning("memory tier not searched: %s", why)
            return MemoryChoice(unavailable=why)
        per_node[node.name] = {snapshot.step: snapshot for snapshot in answer}
    return choose(request, root, [node.name for node in access.nodes], per_node)


def choose(
    request: FindVerifiedCheckpointRequest,
    root: str,
    node_names: list[str],
    per_node: dict[str, dict[int, MemorySnapshot]],
) -> MemoryChoice:
    """The cross-node choice, given what each node reported (pure: unit-tested)."""
    floor = None if request.timeline else max(request.exclude_steps, default=None)
    steps = {step for listed in per_node.values() for step in listed}
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
        for name in node_names:
            snapshot = per_node.get(name, {}).get(step)
            if snapshot is None:
                everywhere = False
                continue
            problem = snapshot_problem(snapshot, request)
            if problem is not None:
                problems.append(f"node {name}: {problem}")
            elif snapshot.manifest is not None:
                writers[name] = snapshot.manifest.get("generation")
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
            return MemoryChoice(chosen=CheckpointRef(step=step, path=path), skipped=skipped)
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
    written_by = manifest.get("generation")
    abandoned = abandoned_reason(
        written_by if isinstance(written_by, int) and not isinstance(written_by, bool) else None,
        snapshot.step,
        request.timeline,
    )
    if abandoned is not None:
        return abandoned
    expected = request.expected_world_size
    if expected is not None and manifest.get("world_size") != expected:
        return (
            f"{MANIFEST}: written by a world of {manifest.get('world_size')} ranks, "
            f"expected {expected}"
        )
    return None
