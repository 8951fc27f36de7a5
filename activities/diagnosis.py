"""Turning a dead rank's log tail and exit status into a failure class with evidence."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class Diagnosis:
    failure_class: str
    evidence: list[str]


def last_lines(text: str, lines: int = 20) -> list[str]:
    return list(deque((line.rstrip() for line in text.splitlines() if line.strip()), maxlen=lines))


def diagnose_crash(log_text: str, exit_code: int | None, signal: str | None) -> Diagnosis:
    from lazarus.classifier import classify  # imported on first crash: keeps workers light

    tail = last_lines(log_text, lines=200)
    result = classify("\n".join(tail), exit_code=exit_code, signal=signal)
    evidence = list(result.evidence) or tail[-10:]
    if signal:
        evidence.insert(0, f"rank ended by {signal} (exit code {exit_code})")
    elif exit_code is not None:
        evidence.insert(0, f"rank exited with code {exit_code}")
    return Diagnosis(failure_class=str(result.failure_class), evidence=evidence[:12])
