"""The one scenario registry: every benchmark scenario, by name, with a runner per system.

A scenario is registered once, with a docstring that walks through its fault
sequence (the first line is its summary in ``--help`` and the JSON), and gets
one runner per system that can run it: ``lazarus`` always (a scenario may be
Lazarus-only; ``lazarus_cold`` runs the same script under the spec's defaults,
see :class:`LazarusSetup`), ``torchrun`` / ``torchrun_default`` where the
comparison says something. A system that cannot do it at all is ``not_possible`` with the
reason (reported in every table); a scenario this machine cannot run
(``unavailable``: no root for network namespaces) is skipped with its reason.

``SUITES`` lists what each command runs by default, in table order:
``python -m bench recovery`` runs Lazarus alone, ``python -m bench compare``
both systems. To add a scenario::

    MINE = scenario("mine", '''One line saying what happens.

    1. start the example job; 2. once it reports the fault step, ...; 3. ...
    ''')

    @runs(MINE, "lazarus")
    async def mine_lazarus(ctx: BenchContext, repeat: int) -> Measured: ...

then add its name to a suite, and every metric it reports to
:mod:`bench.metrics`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from bench.jobs import WORLD_SIZE, JobShape
from bench.metrics import Value

if TYPE_CHECKING:
    from bench.harness import BenchContext

System = Literal[
    "lazarus", "lazarus_rejoin", "lazarus_cold", "torchrun", "torchrun_default", "slurm_requeue"
]
SYSTEMS: tuple[System, ...] = (
    "lazarus",
    "lazarus_rejoin",
    "lazarus_cold",
    "torchrun",
    "torchrun_default",
)
"""Every system ``compare`` can run, in table order (``slurm_requeue`` is the
``slurm`` command's: see :data:`SLURM_SYSTEMS`)."""
SLURM_SYSTEMS: tuple[System, ...] = ("lazarus", "slurm_requeue")
"""What ``python -m bench slurm`` runs side by side: Lazarus on Slurm, and plain
Slurm (``sbatch --requeue``) with the same job and the same fault."""


DEFAULT_PRELOAD: tuple[str, ...] = ("torch",)
REJOIN_TIMEOUT_S = 30.0
"""``rejoin.timeout_s`` of the ``lazarus_rejoin`` system."""
"""The fast setup's ``warm_start.preload``, as the spec recommends."""


@dataclass(frozen=True)
class LazarusSetup:
    """How a Lazarus system sets up the example job, beyond the scenario's own spec.

    Three Lazarus systems run the same scenario scripts: ``lazarus``, the recommended
    fast setup (warm starts from a per-node zygote, the memory checkpoint tier);
    ``lazarus_rejoin``, the same plus rejoin in place (healthy ranks keep their
    process, only the failed one restarts); and ``lazarus_cold``, the spec's defaults
    (all off), so that one run shows what each setup buys next to torchrun. The
    fields are the spec's own, so the JSON says exactly what each system ran."""

    label: str
    """The system's column heading in the tables."""
    warm_start: bool
    memory_tier: bool
    rejoin: bool = False
    """Survivors rejoin in place (``rejoin`` in the spec, the example's ``--resilient``)."""

    @property
    def example_args(self) -> tuple[str, ...]:
        """What the example's command line needs for this setup."""
        return ("--resilient",) if self.rejoin else ()

    def spec_fields(
        self, shape: JobShape, preload: tuple[str, ...] = DEFAULT_PRELOAD
    ) -> dict[str, object]:
        """Top-level spec fields for a job of ``shape`` (none for the defaults);
        ``preload``: what the zygote imports (``--preload``)."""
        fields: dict[str, object] = {}
        if self.warm_start:
            fields["warm_start"] = {"preload": list(preload), "standby": 1}
        if self.memory_tier:
            # A snapshot every step in tmpfs; the disk interval stays the job's own,
            # now set by the controller (the example asks should_checkpoint).
            fields["checkpoints"] = {"memory_every_steps": 1, "every_steps": shape.ckpt_every}
        if self.rejoin:
            fields["rejoin"] = {"timeout_s": REJOIN_TIMEOUT_S}
        return fields


LAZARUS_SETUPS: dict[System, LazarusSetup] = {
    "lazarus": LazarusSetup("Lazarus", warm_start=True, memory_tier=True),
    "lazarus_rejoin": LazarusSetup(
        "Lazarus (rejoin)", warm_start=True, memory_tier=True, rejoin=True
    ),
    "lazarus_cold": LazarusSetup("Lazarus (cold)", warm_start=False, memory_tier=False),
}
"""The Lazarus systems: each runs a scenario's Lazarus script with its setup."""
LABELS: dict[System, str] = {
    **{system: setup.label for system, setup in LAZARUS_SETUPS.items()},
    "torchrun": "torchrun",
    "torchrun_default": "torchrun (default setup)",
    "slurm_requeue": "plain Slurm (--requeue)",
}
Reference = tuple[int, int]
"""(world size, steps) of a fault-free reference run."""


@dataclass
class Measured:
    """What a runner returns: ``metrics`` (summarised over repeats, every name in
    :mod:`bench.metrics`), raw ``details`` for the JSON, and a ``note`` saying what
    a number means (``not detected within 60 s``)."""

    metrics: dict[str, Value] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    note: str | None = None


Outcome = Measured
"""The chaos matrix's name for :class:`Measured`."""
Runner = Callable[["BenchContext", int], Awaitable[Measured]]


def default_references(shape: JobShape) -> list[Reference]:
    return [(WORLD_SIZE, shape.steps)]


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
        "schedule",
        "node_loss",
        "ssh_poll",
        "controller_cpu",
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


def load() -> dict[str, Scenario]:
    """Every registered scenario (importing the modules registers them)."""
    import bench.scenarios
    import bench.scenarios_ha
    import bench.scenarios_multinode
    import bench.scenarios_slurm  # noqa: F401

    return SCENARIOS
