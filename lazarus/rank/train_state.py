"""What :func:`lazarus.rank.torch.run_resilient` restores each generation: the
script's named stateful objects, and the state ``setup()`` built, kept for a later
generation that starts afresh."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from lazarus.rank.host_copy import copy_to_cpu

__all__ = ["InitialState", "Stateful", "TrainState", "load_into"]


class Stateful(Protocol):
    """What run_resilient restores: a model, an optimizer, a scheduler..."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


TrainState = Mapping[str, Stateful]
"""``setup()``'s result: named stateful objects, named as in the checkpoint."""


class InitialState:
    """The state ``setup`` built, copied to CPU memory only when it may be needed again.

    Why not always: a rank that starts from a resume point (every replacement after
    the job's first checkpoint or snapshot) would copy its whole state for nothing, on
    the recovery's critical path: at 1 GiB a rank, a second GiB of RAM and a few
    tenths of a second before its process group forms. The copy is taken when the
    process's first generation starts afresh, before any step changes the state.

    A process that began from a resume point has no copy. Should a later generation of
    it be told to start afresh (the controller fell back past every checkpoint it can
    trust), it cannot rejoin with what it has trained: it raises, the controller sees a
    crash during the rejoin and restarts the whole generation, whose fresh processes
    build the state again."""

    def __init__(self) -> None:
        self.saved: dict[str, Any] | None = None
        self.generations = 0

    def after_load(self, state: TrainState, resumed: bool) -> None:
        """Called once per generation, after the resume point (if any) was loaded."""
        self.generations += 1
        if self.generations == 1 and not resumed:
            self.saved = {name: copy_to_cpu(s.state_dict()) for name, s in state.items()}

    def restore_into(self, state: TrainState) -> None:
        """A later generation starts afresh: back to setup's state, or raise."""
        if self.saved is None:
            raise RuntimeError(
                "this rank is asked to start afresh, but its process began from a "
                "checkpoint and kept no copy of the state setup() built; it exits so "
                "that a fresh process builds it"
            )
        load_into(state, self.saved, "the state setup() built")


def load_into(state: TrainState, saved: Mapping[str, Any], what: str) -> None:
    for name, stateful in state.items():
        if name not in saved:
            raise KeyError(
                f"{what} has no {name!r} (it has {sorted(saved)}): setup() must name its "
                "objects as the checkpoints do"
            )
        stateful.load_state_dict(saved[name])
