"""Slow phases a rank declares (issue 38): stretches allowed to be slower than a step.

The supervisor learns how often a job's ranks make progress and calls a rank hung
after a few times that of silence (``health.hang_budget``). A checkpoint save, an
evaluation or a data-loader stall is longer than that by design; declared here, it
gets its own budget instead: the ``budget_s`` given, or the job's
``health.hang_timeout_s`` (which caps both). Its peers, waiting for the rank in their
next collective, get the same budget while it lasts.

Entering and leaving a phase writes a heartbeat at once (the last reported step, the
throttle bypassed), so the supervisor knows within one poll; the heartbeat carries the
innermost open phase under ``"slow_phase"``. Outside Lazarus, or before the first
:func:`~lazarus.rank.heartbeat`, the marks are kept but nothing is written (the
start-up clock covers a rank that has not stepped yet).

The helper declares ``checkpoint_save`` itself: from rank 0's first
:func:`~lazarus.rank.checkpoint_path` of a step to its
:func:`~lazarus.rank.commit_checkpoint`, around all of
:func:`lazarus.rank.torch.save` on every rank, and ``planned_stop_hold`` while a
just-in-time checkpoint holds for its stop. Usage::

    with lz.slow_phase("evaluation"):            # hang_timeout_s allowed
        evaluate(model)
    with lz.slow_phase("data_loader", budget_s=30):
        batch = next(loader)
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from lazarus.rank import slow_phase_stack
from lazarus.rank.heartbeats import flush_heartbeat
from lazarus.rank.slow_phase_stack import OpenPhase


@contextmanager
def slow_phase(name: str, budget_s: float | None = None) -> Iterator[None]:
    """Declare that this rank is in the slow phase ``name`` for the block's duration.

    Standard names are in :mod:`lazarus.domain.phases` (``evaluation``,
    ``data_loader``, ``checkpoint_save``); any short name works. ``budget_s``: how long
    the phase may stay silent (None: the job's ``hang_timeout_s``, which also caps it).
    Calls to :func:`~lazarus.rank.heartbeat` inside the block are fine."""
    enter_slow_phase(name, budget_s)
    try:
        yield
    finally:
        exit_slow_phase(name)


def enter_slow_phase(
    name: str, budget_s: float | None = None, *, until_step: int | None = None
) -> None:
    """Open ``name`` (see :func:`slow_phase`); :func:`exit_slow_phase` closes it.
    ``until_step``: the helper's own phases end at the first heartbeat beyond it."""
    if not name:
        raise ValueError("a slow phase needs a name")
    if budget_s is not None and not (budget_s > 0 and math.isfinite(budget_s)):
        raise ValueError(f"budget_s must be a positive number of seconds, not {budget_s!r}")
    slow_phase_stack._open.append(OpenPhase(name, budget_s, until_step))
    flush_heartbeat()


def exit_slow_phase(name: str) -> None:
    """Close the innermost open phase called ``name`` (and write a heartbeat); a name
    not open is ignored, so a phase the helper closed itself may be exited again."""
    stack = slow_phase_stack._open
    for index in range(len(stack) - 1, -1, -1):
        if stack[index].name == name:
            del stack[index]
            flush_heartbeat()
            return
