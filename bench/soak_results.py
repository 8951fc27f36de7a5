"""What a chaos soak found (:mod:`bench.soak`), as data: the fault schedule and each
system's incidents, trace and figures. Apart from the soak itself so that a reader
of a result (:mod:`bench.plot`) need not import the harness that produced it, and
the soak can call that reader without an import circle."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from bench.systems import System

FaultKind = Literal["crash", "hang", "controller_crash"]
FAULT_KINDS: tuple[FaultKind, ...] = ("crash", "hang", "controller_crash")


class SoakFault(BaseModel):
    at_s: float
    """Due this long after the soak starts."""
    kind: FaultKind
    rank: int


class SoakIncident(BaseModel):
    kind: str
    """A fault kind, or ``operator`` for the harness's own intervention."""
    rank: int | None = None
    due_s: float | None = None
    at_s: float
    """When it was injected, seconds since the soak started."""
    generation: int
    step: int | None
    recovery_s: float | None = None
    """Injection to the first step of a later generation (crash, hang)."""
    handled: bool = True
    note: str | None = None


class SoakSystemResult(BaseModel):
    system: System
    wall_s: float
    productive_s: float
    ettr: float
    mttr_s: float | None
    incident_count: int
    unhandled: int
    operator_interventions: int
    final_step: int | None
    controller_reported_ettr: float | None = None
    note: str | None = None
    """How the system's figures were counted, where it differs from the others."""
    incidents: list[SoakIncident]
    trace: list[tuple[float, int, int]]
    """(seconds since start, generation, step), thinned to one point per 0.5 s per generation."""


class SoakResult(BaseModel):
    minutes: float
    seed: int
    fault_every_s: float
    operator_after_s: float
    step_time_s: float
    schedule: list[SoakFault]
    systems: dict[str, SoakSystemResult]
    plot: str | None = None
