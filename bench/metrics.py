"""Every metric a benchmark scenario reports: one name, one unit, one meaning.

Two benchmarks once gave ``detection_s`` two meanings; so a scenario may only report
names in ``bench/metrics.tsv`` (a unit test runs every scenario's names through
:func:`lookup`).

Times named ``..._from_injection_s`` or ``..._outside_s`` start at the moment the
bench injected the fault (its own clock); plain ``detection_s`` and
``recovery_s`` are the controller's incident figures, which start at the fault
as the controller dates it (a crash: when the rank's wrapper saw it die; a hang:
the rank's last progress, before the bench's SIGSTOP).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lazarus.domain.recovery_timeline import PHASES

Value = float | int | bool | None
"""What one run reports for one metric (None: not measured in this run)."""


@dataclass(frozen=True)
class MetricDef:
    name: str
    """The metric's name; ``<node>`` / ``<job>`` stand for a host or job label."""
    unit: str
    """``s``, ``ms``, ``steps``, ``count``, ``bool``, ``ratio``, ``steps/s``, ..."""
    meaning: str


TABLE = Path(__file__).with_name("metrics.tsv")
"""The table itself: ``name<TAB>unit<TAB>meaning`` a line, ``#`` lines for its sections."""


def _read(table: Path) -> tuple[MetricDef, ...]:
    defs = []
    for number, line in enumerate(table.read_text().splitlines(), 1):
        if line and not line.startswith("#"):
            if len(fields := line.split("\t")) != 3:
                raise ValueError(f"{table}:{number}: not name<TAB>unit<TAB>meaning: {line!r}")
            defs.append(MetricDef(*fields))
    return tuple(defs)


_DEFS = _read(TABLE)

PHASE_METRICS: tuple[tuple[str, str], ...] = tuple(
    (f"phase_{field.removesuffix('_at')}_s", label) for field, label in PHASES[1:]
)
"""``(metric, phase label)`` for each recovery phase after the fault, in the order a
recovery reaches them (:data:`lazarus.domain.recovery_timeline.PHASES`)."""

_DEFS += tuple(
    MetricDef(
        name,
        "s",
        f"crash, hang, node_loss: the recovery's phase '{label}': seconds from the previous "
        "phase reached "
        "(Lazarus: the incident's timeline, fault as the controller dates it, rank phases "
        "from the rank helper's marks; torchrun: the bench's injection, the agent's first "
        "line saying a worker failed, the restarted ranks' process start, their first step)",
    )
    for name, label in PHASE_METRICS
)

METRICS: dict[str, MetricDef] = {m.name: m for m in _DEFS}
_PLACEHOLDER = re.compile(r"<(node|job)>")
_PATTERNS: list[tuple[re.Pattern[str], MetricDef]] = [
    (re.compile("^" + _PLACEHOLDER.sub("[a-z]+[0-9]+", m.name) + "$"), m)
    for m in _DEFS
    if _PLACEHOLDER.search(m.name)
]


def lookup(name: str) -> MetricDef:
    """The definition of ``name``; ``KeyError`` naming it when it has none."""
    if name in METRICS:
        return METRICS[name]
    for pattern, definition in _PATTERNS:
        if pattern.match(name):
            return definition
    raise KeyError(f"metric {name!r} is not in bench.metrics.METRICS: define it there first")
