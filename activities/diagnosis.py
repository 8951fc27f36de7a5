"""Turning a dead rank's log tail and exit status into a failure class with evidence."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from lazarus.domain.failure_classes import FailureClass

TAIL_BYTES = 64 * 1024

NO_KERNEL_RECORD = (
    "killed by SIGKILL from outside; no OOM message in the log and no kernel OOM record "
    "(cgroup memory.events, kernel log): cause unknown"
)
KERNEL_NOT_VISIBLE = (
    "killed by SIGKILL from outside; no OOM message in the log, and the node's kernel "
    "records are not visible from the controller: cause unknown"
)


@dataclass(frozen=True)
class Diagnosis:
    failure_class: FailureClass
    evidence: list[str]


def last_lines(text: str, lines: int = 20) -> list[str]:
    return list(deque((line.rstrip() for line in text.splitlines() if line.strip()), maxlen=lines))


def killed_by_sigkill(exit_code: int | None, signal: str | None) -> bool:
    """A SIGKILL as the wrapper records it (signal name, -9) or as a shell reports it (137)."""
    if signal is not None and signal.strip().upper().removeprefix("SIG") in ("KILL", "9"):
        return True
    return exit_code in (-9, 137)


def diagnose_crash(
    log_text: str,
    exit_code: int | None,
    signal: str | None,
    kernel_evidence: Sequence[str] | None = None,
) -> Diagnosis:
    """Classify a dead rank. ``kernel_evidence`` holds the kernel's OOM records for its
    pid ([] when the kernel was asked and said nothing, None when it could not be
    asked, e.g. on a remote node). A SIGKILL is ``oom_host`` only with evidence: the
    kernel's record, or an explicit OOM message in the log; otherwise ``killed``."""
    from lazarus.domain.classifier import classify  # imported on first crash: keeps workers light

    tail = last_lines(log_text, lines=200)
    result = classify("\n".join(tail), exit_code=exit_code, signal=signal)
    failure_class = FailureClass(result.failure_class)
    evidence = list(result.evidence) or tail[-10:]
    if kernel_evidence and killed_by_sigkill(exit_code, signal):
        failure_class = FailureClass.OOM_HOST
        evidence = [*kernel_evidence, *result.evidence]
    elif result.failure_class == FailureClass.OOM_HOST and result.circumstantial:
        failure_class = FailureClass.KILLED
        why = KERNEL_NOT_VISIBLE if kernel_evidence is None else NO_KERNEL_RECORD
        evidence = [why, *result.evidence]
    if signal:
        evidence.insert(0, f"rank ended by {signal} (exit code {exit_code})")
    elif exit_code is not None:
        evidence.insert(0, f"rank exited with code {exit_code}")
    return Diagnosis(failure_class=failure_class, evidence=evidence[:12])


def diagnose_vanished(kernel_evidence: Sequence[str] | None) -> Diagnosis:
    """A rank whose whole process group died with no exit status: SIGKILLed from
    outside, the wrapper included. ``oom_host`` when the kernel recorded an OOM kill
    of the rank (a cgroup with ``memory.oom.group`` kills every member), else ``killed``."""
    if kernel_evidence:
        return Diagnosis(FailureClass.OOM_HOST, list(kernel_evidence))
    why = KERNEL_NOT_VISIBLE if kernel_evidence is None else NO_KERNEL_RECORD
    return Diagnosis(FailureClass.KILLED, [why])
