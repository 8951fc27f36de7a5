"""How a job ended, as a waiting script sees it: the one table of ``lazarus wait``'s
(and ``lazarus start --wait``'s) exit codes.

A batch script (``sbatch``, a CI step) runs ``lazarus wait JOB`` and branches on the
exit code, as it would on torchrun's. Every outcome a script must tell apart has its
own code; the two the whole CLI shares keep theirs (1: the request could not be
made, such as no server; 2: bad input). A job waiting for a person
(NEEDS_OPERATOR) is an outcome: a wait that blocked on it would hang the script
until someone happened to look, so by default the wait ends there, and
``--through-operator`` keeps waiting for the end instead.

=====  ================  ===================================================
code   outcome           meaning
=====  ================  ===================================================
0      SUCCEEDED         the training command finished on every rank
3      FAILED            the job ended FAILED (restarts spent, a launch that
                         cannot work, a workflow terminated or failed)
4      CANCELLED         someone cancelled it
5      NEEDS_OPERATOR    it waits for a person (see ``lazarus status``)
6      TIMEOUT           ``--timeout`` passed first; the job goes on
7      NO_SUCH_JOB       Temporal has never seen a job of this name
=====  ================  ===================================================

Code 7 is every verb's that names a job (``status``, ``logs``, ``pause``...), not only
``wait``'s: a script tells a typo from a server that is down.
"""

from __future__ import annotations

from enum import StrEnum

from lazarus.domain.job_view import Phase

__all__ = ["EXIT_CODES", "Outcome", "outcome_of"]


class Outcome(StrEnum):
    """Where a wait ended (the module's table gives each its exit code)."""

    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    NEEDS_OPERATOR = "NEEDS_OPERATOR"
    TIMEOUT = "TIMEOUT"
    NO_SUCH_JOB = "NO_SUCH_JOB"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self]


EXIT_CODES: dict[Outcome, int] = {
    Outcome.SUCCEEDED: 0,
    Outcome.FAILED: 3,
    Outcome.CANCELLED: 4,
    Outcome.NEEDS_OPERATOR: 5,
    Outcome.TIMEOUT: 6,
    Outcome.NO_SUCH_JOB: 7,
}
"""The exit code of each outcome; 1 and 2 are the CLI's own (no server, bad input)."""

_BY_PHASE = {
    Phase.SUCCEEDED.value: Outcome.SUCCEEDED,
    Phase.FAILED.value: Outcome.FAILED,
    Phase.CANCELLED.value: Outcome.CANCELLED,
}

_OPEN = ("RUNNING", "UNKNOWN")
"""Temporal's words for a workflow that has not closed (UNKNOWN: it did not say)."""


def outcome_of(
    execution_status: str, phase: str | None, stop_at_operator: bool = True
) -> Outcome | None:
    """The outcome a job in this state has reached, or None while it goes on.

    ``execution_status`` is Temporal's (RUNNING, COMPLETED, CANCELED, ...) and ``phase``
    the job's own (None when nothing said it). The job's phase decides when it names
    an end, even a moment before the workflow closes; a closed workflow without one
    decides by Temporal's word: CANCELED is CANCELLED, anything else (terminated,
    timed out, failed, or completed without a final status) is FAILED, because a
    script that reads success from a job that never said so would go on wrongly.
    """
    if phase in _BY_PHASE:
        return _BY_PHASE[phase]
    if execution_status in _OPEN:
        if stop_at_operator and phase == Phase.NEEDS_OPERATOR.value:
            return Outcome.NEEDS_OPERATOR
        return None
    if execution_status == "CANCELED":
        return Outcome.CANCELLED
    return Outcome.FAILED
