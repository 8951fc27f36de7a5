"""The slow phases this rank is in now (issue 38): a stack, innermost last.

Its one home is here, apart from :mod:`lazarus.rank.slow_phases` (the API, which
writes a heartbeat at each entry and exit), because the heartbeat itself reads it
(:mod:`lazarus.rank.heartbeats`) and the API imports the heartbeat: state here, both
import it, no circle. The same split as :mod:`lazarus.rank.heartbeat_throttle`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpenPhase:
    name: str
    budget_s: float | None
    """The script's own bound for the phase (None: the job's ``hang_timeout_s``)."""
    until_step: int | None = None
    """For a phase the helper opened itself (a save's ``checkpoint_save``): a heartbeat
    beyond this step closes it, so a rank that never commits (ranks other than 0)
    does not stay in it."""


_open: list[OpenPhase] = []


def current() -> dict[str, object] | None:
    """The innermost open phase as the heartbeat carries it, or None."""
    if not _open:
        return None
    top = _open[-1]
    return {"name": top.name, "budget_s": top.budget_s}


def close_passed(step: int) -> bool:
    """Close the helper's own phases that ``step`` is beyond; whether any was."""
    kept = [p for p in _open if p.until_step is None or step <= p.until_step]
    closed = len(kept) != len(_open)
    _open[:] = kept
    return closed
