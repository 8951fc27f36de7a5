"""A rank process group that outlived its SIGKILL: reported by every stop and fencing,
on the node and up to the workflow. Its own light module: the node-side entry points
(``python -m activities.nodes.carry`` on an ssh node) import it on a recovery's
critical path, where the whole of :mod:`lazarus.domain.contracts` costs a second of
interpreter start on a loaded node."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class UnkillableGroup(BaseModel):
    """A rank process group still alive ``kill_wait_s`` after SIGKILL: a process in
    uninterruptible sleep (state D, e.g. a GPU after an Xid, a hung NFS mount)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str
    pgid: int
    pids: list[int] = Field(default_factory=list)
    """Members still alive when the stop gave up (empty if the node did not say)."""
    reason: str
