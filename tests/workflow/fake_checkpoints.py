"""The fake cluster's checkpoints, by tier and by the generation that wrote them.

The fake ``find_verified_checkpoint`` of :mod:`tests.workflow.fakes` searches them
with the product's own rules, so a workflow test sees what the real search would
choose: the memory tier through :func:`activities.checkpoints.memory_tier.choose`
(snapshots a generation commits on every node once it is launched), and the disk
tiers through the request's ``disk_candidates`` and ``off_timeline`` (the timeline
cuts, the rollback's bound, the checkpoints retired by identity or by number). No
files: a snapshot is its manifest and sizes, a disk checkpoint its step and writer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath

from activities.checkpoints.memory_tier import choose
from activities.nodes.agent import MemorySnapshot
from lazarus.domain import contracts
from lazarus.domain.checkpoint_layout import MANIFEST, step_dir_name

STATE_FILE = "state.pt"


def memory_snapshot(root: str, step: int, generation: int, job_id: str) -> MemorySnapshot:
    """One node's whole, committed copy of ``step`` as the rank helper writes it."""
    manifest = {
        "step": step,
        "generation": generation,
        "job_id": job_id,
        "files": {STATE_FILE: {"size": 1}},
    }
    path = str(PurePosixPath(root) / step_dir_name(step))
    return MemorySnapshot(
        step=step, path=path, manifest=manifest, sizes={STATE_FILE: 1, MANIFEST: 1}
    )


@dataclass
class Holdings:
    """What one job's fake cluster holds beyond ``Script.checkpoint_steps`` (those
    were there before the job started: their writer is ``checkpoint_writer``)."""

    checkpoint_writer: int | None = None
    """The generation in the manifests of ``checkpoint_steps`` (None: none recorded:
    those are judged by number only, as the fake search always judged them)."""
    memory_by_generation: dict[int, list[int]] = field(default_factory=dict)
    """generation -> memory snapshot steps it commits on every node once launched."""
    disk_by_generation: dict[int, list[int]] = field(default_factory=dict)
    """generation -> disk checkpoint steps it commits once launched (local, and its
    durable copy, which a rollback leaves where it is)."""

    def disk_copies(self, steps: list[int], launched: set[int]) -> list[tuple[int, int | None]]:
        """Every disk copy, ``(step, writer)``, the newest writer last at each step."""
        copies: list[tuple[int, int | None]] = [(s, self.checkpoint_writer) for s in steps]
        for generation in sorted(self.disk_by_generation):
            if generation in launched:
                copies += [(s, generation) for s in self.disk_by_generation[generation]]
        return copies

    def writer(self, step: int, steps: list[int], launched: set[int]) -> int | None:
        """Who wrote the newest copy of ``step``: the one a rollback moves aside."""
        writers = [w for s, w in self.disk_copies(steps, launched) if s == step]
        return writers[-1] if writers else None

    def search(
        self,
        request: contracts.FindVerifiedCheckpointRequest,
        steps: list[int],
        launched: set[int],
    ) -> contracts.CheckpointSearch:
        """The resume point the real search would choose from these holdings."""
        memory: contracts.CheckpointRef | None = None
        if request.memory_dir is not None and request.below_step is None:
            root = request.memory_dir
            names = [node.name for node in request.access.nodes] or ["local"]
            snapshots = {
                step: memory_snapshot(root, step, generation, request.job_id or "")
                for generation in sorted(self.memory_by_generation)
                if generation in launched
                for step in self.memory_by_generation[generation]
            }
            memory = choose(request, root, names, {name: dict(snapshots) for name in names}).chosen
        disk = self.disk_copies(steps, launched)
        floor = memory.step if memory is not None else None
        for step in request.disk_candidates({s for s, _ in disk}, floor):
            writers = [w for s, w in disk if s == step]
            if any(w is None or request.off_timeline(w, step) is None for w in writers):
                ref = contracts.CheckpointRef(
                    step=step, path=f"{request.checkpoint_dir}/{step_dir_name(step)}"
                )
                return contracts.CheckpointSearch(chosen=ref, location="local")
        if memory is not None:
            return contracts.CheckpointSearch(chosen=memory, location="memory")
        return contracts.CheckpointSearch()


HOLDINGS: dict[str, Holdings] = {}


def holdings_for(job_id: str) -> Holdings:
    return HOLDINGS.setdefault(job_id, Holdings())
