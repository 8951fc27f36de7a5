"""The one scenario registry: every benchmark scenario, by name, with a runner per system.

A system that cannot run a scenario is ``not_possible`` with the reason, and a scenario
this machine cannot run is skipped with its reason: every table cell says why it is
empty. Adding a scenario: bench/README.md, "Structure".
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bench.jobs import JobShape
from bench.systems import LAZARUS_SETUPS, Measured, Reference, System, default_references

if TYPE_CHECKING:
    from bench.harness import BenchContext

Runner = Callable[["BenchContext", int], Awaitable[Measured]]


@dataclass
class Scenario:
    name: str
    summary: str
    run: Runner | None = None
    """How Lazarus runs it."""
    references: Callable[[JobShape], list[Reference]] = default_references
    """The fault-free reference runs its jobs are compared with, computed before
    any scenario runs so that no timing includes them."""
    unavailable: Callable[[], str | None] | None = None
    """Why it cannot run on this machine (then skipped, with the reason), or None."""
    others: dict[System, Runner] = field(default_factory=dict)
    """How the other systems run it."""
    not_possible: dict[System, str] = field(default_factory=dict)
    """Systems that cannot do this at all, and why."""
    doc: str = ""
    """The fault sequence, step by step."""

    def runner(self, system: System) -> Runner | None:
        """Every Lazarus system runs the Lazarus script (with its own setup)."""
        return self.run if system in LAZARUS_SETUPS else self.others.get(system)


SCENARIOS: dict[str, Scenario] = {}

SUITES: dict[str, tuple[str, ...]] = {
    "recovery": (
        "clean",
        "crash",
        "hang",
        "worker_kill",
        "pause",
        "straggler",
        "node_loss",
        "node_loss_replicas",
    ),
    "compare": (
        "clean",
        "crash",
        "hang",
        "controller_crash",
        "straggler",
        "node_loss",
        "pause_resume",
    ),
    "slurm": ("slurm_node_loss", "slurm_cpu"),
}
"""What each command runs by default, in this order (the tables' order)."""


def scenario(
    name: str,
    doc: str,
    *,
    not_possible: dict[System, str] | None = None,
    unavailable: Callable[[], str | None] | None = None,
    references: Callable[[JobShape], list[Reference]] | None = None,
) -> Scenario:
    """Register a scenario; ``doc``'s first line is its summary."""
    if name in SCENARIOS:
        raise ValueError(f"scenario {name!r} is registered twice")
    text = inspect.cleandoc(doc)
    SCENARIOS[name] = Scenario(
        name=name,
        summary=text.splitlines()[0] if text else name,
        references=references or default_references,
        unavailable=unavailable,
        not_possible=dict(not_possible or {}),
        doc=text,
    )
    return SCENARIOS[name]


def runs(sc: Scenario, system: System) -> Callable[[Runner], Runner]:
    """Register the decorated function as how ``system`` runs ``sc``."""

    if system in LAZARUS_SETUPS and system != "lazarus":
        raise ValueError(
            f"{sc.name}: register the Lazarus script as 'lazarus'; {system} runs it "
            "with its own setup"
        )

    def register(fn: Runner) -> Runner:
        if sc.runner(system) is not None:
            raise ValueError(f"{sc.name}/{system} is registered twice")
        if system == "lazarus":
            sc.run = fn
        else:
            sc.others[system] = fn
        return fn

    return register
