"""Where a recovery's time goes: one timestamp per phase, from fault to first new step.

A restart is a relay: the supervisor sees the fault, the workflow decides, the
survivors are stopped (or, rejoining in place, tear their process group down and
later read the request to rejoin), a resume point is chosen, the launch is requested, the
rank processes start, import the framework, build the process group, load the
checkpoint and finish a step. Each leg has its own owner and its own fix (a
backoff, a grace period, a re-hash, an import), so the incident keeps a time for
each, and ``incidents --json``, ``status`` and the bench report show them.

The controller fills its own phases from the workflow's clock; the rank phases
come from the rank helper's marks in the heartbeat (:mod:`lazarus.domain.phases`),
taking the *latest* rank for each (the slowest rank gates the first collective
step). A script without the helper shows the controller's phases only. Rank
times are the nodes' wall clocks: across machines they include clock skew.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from lazarus.domain import phases as rank_phases

PHASES: tuple[tuple[str, str], ...] = (
    ("fault_at", "fault"),
    ("survivors_torn_down_at", "survivors torn down"),
    ("detected_at", "detected"),
    ("decided_at", "decision"),
    ("survivors_stopped_at", "survivors stopped"),
    ("resume_chosen_at", "resume point chosen"),
    ("launch_requested_at", "launch requested"),
    ("rank_started_at", "rank process started"),
    ("rejoin_received_at", "rejoin request read"),
    ("framework_imported_at", "framework imported"),
    ("process_group_ready_at", "process group initialised"),
    ("checkpoint_loaded_at", "checkpoint loaded"),
    ("first_step_at", "first new step"),
)
"""(field, label) in the order a recovery reaches them."""

RANK_FIELDS: dict[str, str] = {
    rank_phases.TORN_DOWN: "survivors_torn_down_at",
    rank_phases.REJOIN_RECEIVED: "rejoin_received_at",
    rank_phases.PROCESS_STARTED: "rank_started_at",
    rank_phases.FRAMEWORK_IMPORTED: "framework_imported_at",
    rank_phases.PROCESS_GROUP_READY: "process_group_ready_at",
    rank_phases.CHECKPOINT_LOADED: "checkpoint_loaded_at",
    rank_phases.FIRST_STEP: "first_step_at",
}
"""Which field each rank-side mark fills."""
TEARDOWN_SLACK_S = 0.5
"""A survivor tears down after its peer died, before any launch: its mark counts from
the fault on (less this slack, since the fault's time is the supervisor's estimate)."""


class PhaseDuration(BaseModel):
    model_config = ConfigDict(frozen=True)

    phase: str
    """The label of the phase reached (``"survivors stopped"``)."""
    seconds: float
    """Time from the previous phase that has a time to this one."""
    since_fault_s: float


class RecoveryTimeline(BaseModel):
    """Unix times of one recovery's phases; None where a phase was not seen (a
    script without the rank helper, a recovery still under way)."""

    fault_at: float
    survivors_torn_down_at: float | None = None
    """Rejoin in place: the surviving ranks destroyed their failed process group
    (they notice a dead peer on their own, often before the supervisor does)."""
    detected_at: float | None = None
    decided_at: float | None = None
    survivors_stopped_at: float | None = None
    resume_chosen_at: float | None = None
    launch_requested_at: float | None = None
    rank_started_at: float | None = None
    rejoin_received_at: float | None = None
    """Rejoin in place: the survivors read their request to join the new generation."""
    framework_imported_at: float | None = None
    process_group_ready_at: float | None = None
    checkpoint_loaded_at: float | None = None
    first_step_at: float | None = None

    def with_rank_marks(self, marks: Mapping[str, float]) -> RecoveryTimeline:
        """The timeline with the ranks' marks (already the latest rank's per phase)
        filled in; marks from before the launch request belong to an older process
        and are ignored."""
        floor = self.launch_requested_at or self.fault_at
        update = {
            field: at
            for name, field in RANK_FIELDS.items()
            if (at := marks.get(name)) is not None
            and at >= (self.fault_at - TEARDOWN_SLACK_S if name == rank_phases.TORN_DOWN else floor)
        }
        return self.model_copy(update=update)

    def durations(self) -> list[PhaseDuration]:
        """Each reached phase's time since the previous reached one, in order."""
        out: list[PhaseDuration] = []
        previous = self.fault_at
        for field, label in PHASES[1:]:
            at = getattr(self, field)
            if at is None:
                continue
            out.append(
                PhaseDuration(
                    phase=label,
                    seconds=round(max(0.0, at - previous), 3),
                    since_fault_s=round(at - self.fault_at, 3),
                )
            )
            previous = max(previous, at)
        return out


def latest_marks(per_rank: Mapping[int, Mapping[str, float]]) -> dict[str, float]:
    """For each rank phase, the latest rank's time: the phase is done when every
    rank has done it."""
    merged: dict[str, float] = {}
    for marks in per_rank.values():
        for name, at in marks.items():
            if name in RANK_FIELDS and isinstance(at, int | float):
                merged[name] = max(merged.get(name, float("-inf")), float(at))
    return merged
