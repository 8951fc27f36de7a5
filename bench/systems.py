"""The systems a benchmark compares, and what one run of a scenario measures.

Below the harness and the scenario registry alike: the harness sets a job up per
system (:data:`LAZARUS_SETUPS`), the registry files runners per system, and the
reports label them, so none of them needs the others for these names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from bench.jobs import WORLD_SIZE, JobShape
from bench.metrics import Value

System = Literal[
    "lazarus",
    "lazarus_rejoin",
    "lazarus_cold",
    "torchrun",
    "torchrun_default",
    "nvrx",
    "nvrx_inprocess",
    "torchft",
    "slurm_requeue",
]
PEER_SYSTEMS: tuple[System, ...] = ("nvrx", "nvrx_inprocess", "torchft")
"""The strongest peers (:mod:`bench.peers`): NVIDIA's nvidia-resiliency-ext, its
``ft_launcher`` and its in-process restart, and Meta's torchft. Optional: installed
by ``make bench-peers``; settings in :mod:`bench.peers.settings`."""
SYSTEMS: tuple[System, ...] = (
    "lazarus",
    "lazarus_rejoin",
    "lazarus_cold",
    "torchrun",
    "torchrun_default",
    *PEER_SYSTEMS,
)
"""Every system ``compare`` can run, in table order (``slurm_requeue`` is the
``slurm`` command's: see :data:`SLURM_SYSTEMS`)."""
SOAK_SYSTEMS: tuple[System, ...] = tuple(s for s in SYSTEMS if s != "torchrun_default")
"""The systems the chaos soak can play its schedule against: every one but torchrun's
default setup (the soak's torchrun is its best)."""
SLURM_SYSTEMS: tuple[System, ...] = ("lazarus", "slurm_requeue")
"""What ``python -m bench slurm`` runs side by side: Lazarus on Slurm, and plain
Slurm (``sbatch --requeue``) with the same job and the same fault."""


DEFAULT_PRELOAD: tuple[str, ...] = ("torch",)
"""The fast setup's ``warm_start.preload``, as the spec recommends."""
REJOIN_TIMEOUT_S = 30.0
"""``rejoin.timeout_s`` of the ``lazarus_rejoin`` system."""


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
    "nvrx": "NVRx ft_launcher",
    "nvrx_inprocess": "NVRx in-process",
    "torchft": "torchft",
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


def default_references(shape: JobShape) -> list[Reference]:
    return [(WORLD_SIZE, shape.steps)]
