"""What a client is told about a job's checkpoints, as data: the resume point a start
would take (:class:`ResumePlan`), what ``start --fresh`` moved aside
(:class:`SetAside`) and one row of ``lazarus checkpoints`` (:class:`CheckpointListing`).

Pure models (issue 40, part 2: "the CLI is a client"): the worker's checkpoint code
(``activities.checkpoints.resume_plan`` and ``.listing``) makes them, the app renders
them, so the app needs only this module, never the code that reads the store.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from lazarus.domain.contracts import CheckpointRef, SkippedCheckpoint

if TYPE_CHECKING:
    from lazarus.domain.spec import JobSpec

PREVIOUS_PREFIX = ".previous-"
"""``<checkpoint_dir>/.previous-<UTC time>/``: where ``start --fresh`` moves checkpoints."""


class ResumePlan(BaseModel):
    """The checkpoint a job would resume from if it started now (None fields: fresh)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    checkpoint_dir: str
    step: int | None = None
    path: str | None = None
    location: Literal["local", "durable"] | None = None
    written_by: str | None = None
    """The job id recorded in its manifest (None: written outside Lazarus)."""
    written_at: float | None = None
    """When it was committed (Unix seconds): the marker's time, else the manifest's."""
    skipped: list[SkippedCheckpoint] = Field(default_factory=list)
    durable_unavailable: str | None = None


def resume_ref(plan: ResumePlan | None, spec: JobSpec) -> CheckpointRef | None:
    """The checkpoint the first launch would be told to resume from: a durable one is
    restored first, under the same name in the checkpoint directory."""
    if plan is None or plan.step is None or plan.path is None:
        return None
    if plan.location == "durable":
        name = plan.path.rstrip("/").rsplit("/", 1)[-1]
        return CheckpointRef(step=plan.step, path=str(PurePath(spec.checkpoint_dir) / name))
    return CheckpointRef(step=plan.step, path=plan.path)


class SetAside(BaseModel):
    """What ``start --fresh`` moved, and where to find it again."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    moved_to: str | None
    """None: there was nothing to move."""
    steps: list[int] = Field(default_factory=list)


TierState = Literal["verified", "corrupt", "uncommitted"]


class CheckpointListing(BaseModel):
    """One step of ``lazarus checkpoints``, in each tier that holds it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int
    time: float | None = None
    """When it was committed (Unix seconds), or the newest file time without a marker."""
    size_bytes: int = 0
    local: TierState | None = None
    """None: not in the local tier."""
    local_path: str | None = None
    local_problems: list[str] = Field(default_factory=list)
    durable: TierState | None = None
    durable_path: str | None = None
    durable_problems: list[str] = Field(default_factory=list)
    verification: Literal["sha256", "sizes"] = "sizes"
