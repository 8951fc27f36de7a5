"""Bounds on incident evidence: small enough to carry in every query and across
continue-as-new for a job's whole life.

One log line once made 64 KB of evidence; about 30 such incidents reached
Temporal's 2 MB payload limit and the job could no longer answer a query. The
bound is applied where evidence is made (``FailureReport``) and again where it is
kept (the workflow's incidents).
"""

from __future__ import annotations

MAX_EVIDENCE_LINES = 20
MAX_EVIDENCE_CHARS = 2_000
_TRUNCATED = " [truncated]"


def cap_evidence(lines: list[str]) -> list[str]:
    """The first lines (the root cause comes first), each cut to a bound, and a note
    of how many were left out."""
    kept = [
        line
        if len(line) <= MAX_EVIDENCE_CHARS
        else line[: MAX_EVIDENCE_CHARS - len(_TRUNCATED)] + _TRUNCATED
        for line in lines[:MAX_EVIDENCE_LINES]
    ]
    if len(lines) > MAX_EVIDENCE_LINES:
        kept.append(f"[{len(lines) - MAX_EVIDENCE_LINES} more lines left out]")
    return kept
