"""Which checkpoints belong to the job's current timeline: the cuts a relaunch makes.

Every relaunch resumes generation ``g`` from some step ``r`` (0: from scratch). From
then on, the job's timeline is the state at ``r`` plus what ``g`` and later
generations compute. A checkpoint at step ``s > r`` written by a generation older
than ``g`` describes a future the job has left: a rollback went back below it, a
disk or durable fallback resumed below it, or a rank of the old generation got
further than the step everyone resumed from. Resuming from it would silently
undo the rollback (issue 26, defect 1) or mix two timelines across nodes (defect 4).

So each relaunch records a :class:`TimelineCut` ``(g, r)``, and a checkpoint is on
the timeline only if no cut abandons it::

    abandoned(written by w, step s)  <=>  some cut (g, r) has w < g and s > r

A cut is recorded when the job *decides* to leave, not only when it relaunches:
a numerical rollback bounds the next generation at once (:func:`with_bound`, the
workflow's ``JobState.bound_rollback``), in the workflow state, before a preflight
or an operator can get in between. A relaunch that is then sent back (no spare,
NEEDS_OPERATOR) and made later by a ``resume`` or a fleet's re-ask still finds the
bound there (issue 37, the audit's N1). Every tier's search reads the cuts: the
memory tier, the local disk and the durable copies.

A rollback also retires the checkpoint it went back past by identity
(:class:`RetiredCheckpoint`): the state generation ``w`` reached at step ``s``,
wherever a copy of it lies (moved aside, uploaded, a snapshot). A later generation's
own fresh checkpoint of the same step is another state and is resumed from (N10).

Walk-through, memory snapshots every step, disk every 50:

1. Generation 1 trains to 154 (snapshots 153, 154 in tmpfs). A NaN: the rollback
   retires disk 150 and generation 2 resumes from 100: cut ``(2, 100)``.
2. Generation 2 trains to 120 and crashes. Snapshots 153 and 154 (generation 1,
   above 100) are abandoned; 120 (generation 2) is not: the relaunch resumes there.
3. Generation 3 resumes from 120: cut ``(3, 120)``. Generation 2's 120 is at the
   cut, so it stays on the timeline; 153 and 154 stay abandoned for good.

The list stays short. A cut ``(g, r)`` makes every older cut ``(g', r')`` with
``r' >= r`` redundant (whatever that one abandons, this one does too), so the cuts
kept have rising generations *and* rising steps. Beyond :data:`MAX_CUTS`, the two
oldest merge into ``(g2, r1)``, which abandons more, never less: the price is that a
snapshot older than the last :data:`MAX_CUTS` relaunches may be passed over (and
disk serves), never that an abandoned one is taken.

Pure and deterministic: the workflow records cuts, the checkpoint search (any
tier) and the rank-side prune apply them.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

MAX_CUTS = 32
"""More than a job needs to tell its live snapshots apart (each node keeps
``memory_keep`` of them), few enough that the search request stays small."""


class TimelineCut(BaseModel):
    """Generation ``generation`` resumed from step ``step`` (0: from scratch)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    generation: int = Field(ge=1)
    step: int = Field(ge=0)


def with_cut(cuts: list[TimelineCut], generation: int, step: int) -> list[TimelineCut]:
    """``cuts`` after generation ``generation`` resumed from ``step``. A cut already
    recorded for that generation or a newer one is replaced (its launch never
    happened: the preflight sent the workflow back to choose again)."""
    new = TimelineCut(generation=generation, step=step)
    kept = [cut for cut in cuts if cut.generation < generation and cut.step < step]
    kept.append(new)
    while len(kept) > MAX_CUTS:
        oldest, second = kept[0], kept[1]
        kept[:2] = [TimelineCut(generation=second.generation, step=oldest.step)]
    return kept


def with_bound(cuts: list[TimelineCut], generation: int, step: int) -> list[TimelineCut]:
    """``cuts`` once the job has decided that generation ``generation`` resumes at or
    below ``step`` (a rollback, before its launch is even planned). Only ever
    tightens: a lower cut already recorded for that generation stays."""
    for cut in cuts:
        if cut.generation == generation and cut.step <= step:
            return cuts
    return with_cut(cuts, generation, step)


class RetiredCheckpoint(BaseModel):
    """A checkpoint a numerical rollback went back past: the state generation
    ``generation`` reached at step ``step``. Every copy of that state is refused (the
    directory moved aside, its durable upload, a memory snapshot of it); a fresh
    checkpoint of the same step by a later generation is another state."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int = Field(ge=0)
    generation: int = Field(ge=0)


def manifest_generation(manifest: Mapping[str, object]) -> int | None:
    """The generation a checkpoint's manifest says wrote it; None when it records none
    (or not as a plain integer): such a checkpoint counts as the oldest generation's."""
    written_by = manifest.get("generation")
    return written_by if isinstance(written_by, int) and not isinstance(written_by, bool) else None


def off_timeline_reason(
    written_by: int | None,
    step: int,
    cuts: list[TimelineCut],
    retired: list[RetiredCheckpoint],
) -> str | None:
    """Why a checkpoint of ``step`` written by generation ``written_by`` (None: not
    recorded) is not a resume point, in words, or None when it may be one: a rollback
    retired it, or a cut abandons it. The one rule every tier's search applies."""
    if written_by is not None and RetiredCheckpoint(step=step, generation=written_by) in retired:
        return f"retired by a rollback (generation {written_by}'s state at step {step})"
    return abandoned_reason(written_by, step, cuts)


def abandoning_cut(
    written_by: int | None, step: int, cuts: list[TimelineCut]
) -> TimelineCut | None:
    """The cut that puts a checkpoint of ``step`` written by generation
    ``written_by`` off the timeline, or None when it is on it. A checkpoint that does
    not say who wrote it counts as the oldest generation's (0)."""
    writer = written_by if written_by is not None else 0
    for cut in cuts:
        if writer < cut.generation and step > cut.step:
            return cut
    return None


def abandoned_reason(written_by: int | None, step: int, cuts: list[TimelineCut]) -> str | None:
    """Why a checkpoint is off the timeline, in words for ``skipped``; None if it is on it."""
    cut = abandoning_cut(written_by, step, cuts)
    if cut is None:
        return None
    who = f"generation {written_by}" if written_by is not None else "an unknown generation"
    return (
        f"written by {who}, on a timeline the job left: generation {cut.generation} "
        f"resumed from step {cut.step}"
    )
