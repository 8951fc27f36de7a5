"""One measurement an activity made as it worked (a poll round, a checkpoint verified
or uploaded): what :func:`activities.observe.observe` hands to the worker's metrics
sink (:meth:`lazarus.app.metrics.LazarusMetrics.observe`). Plain data on the domain
floor, so the metrics module reads it without importing the activities (issue 40).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ObservationKind = Literal[
    "supervision_poll",
    "checkpoint_save",
    "checkpoint_verify",
    "checkpoint_upload",
]
"""``supervision_poll``: one supervision round (every node polled) in seconds;
``checkpoint_save``: the blocking part of a save, as the ranks' helper reports it
(a median of recent saves, so a level rather than an event); ``checkpoint_verify``
and ``checkpoint_upload``: one checkpoint verified in full or copied to the durable
tier, with its bytes."""


@dataclass(frozen=True)
class Observation:
    kind: ObservationKind
    job: str
    seconds: float
    size_bytes: int | None = None
    """Bytes the operation handled (hashed, sent); None where it has none."""
