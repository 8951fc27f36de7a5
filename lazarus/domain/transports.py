"""What each node launcher is, as a few capabilities: one table keyed by
``NodeSpec.launcher`` (:attr:`lazarus.domain.spec_nodes.NodeSpec.transport`).

Code that must know something about how a node is reached (the spec's checks, the
workflow's routing, the launcher's environment) asks one of these questions instead
of comparing launcher names: only the node layer (``activities/nodes/``) picks a
transport by name (``tests/unit/test_transport_branches.py`` checks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Launcher = Literal["local", "ssh", "slurm"]


@dataclass(frozen=True)
class Transport:
    """How the controller reaches a node of one launcher, as the rest of the code
    needs to know it."""

    runs_here: bool
    """The node is the controller's own machine (``local``): its ranks' pids, files,
    kernel and clock are the worker's, and they inherit the worker's environment.
    False: the node is another machine, whose run directory and environment are its
    own."""
    own_host: bool
    """Every node is a host of its own, reached over the network (``ssh``): ranks that
    all vanish without an exit record are a lost host, even on a job of one node."""
    scheduled: bool
    """A batch scheduler hands the nodes out (``slurm``): they live in the allocation
    the spec's ``slurm:`` names, and ranks run in its job steps. An older generation
    is fenced by cancelling its step (its pid files mean nothing on this machine),
    so a rank started cold cannot outlive its generation."""


TRANSPORTS: dict[str, Transport] = {
    "local": Transport(runs_here=True, own_host=False, scheduled=False),
    "ssh": Transport(runs_here=False, own_host=True, scheduled=False),
    "slurm": Transport(runs_here=False, own_host=False, scheduled=True),
}


def transport(launcher: str) -> Transport:
    """The capabilities of ``launcher``'s nodes (one of :data:`Launcher`)."""
    return TRANSPORTS[launcher]
