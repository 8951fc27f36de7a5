"""When the next heartbeat is written: the throttle's deadline.

It lives apart from :mod:`lazarus.rank.heartbeats` because what a heartbeat carries
sets it to zero ("the next heartbeat carries it, throttle or not") from modules the
heartbeat itself imports: a phase mark (:mod:`lazarus.rank.marks`) and a save time
(:mod:`lazarus.rank.save_timing`). Its one home is here; everyone assigns
``heartbeat_throttle._next_heartbeat_at``.
"""

from __future__ import annotations

_next_heartbeat_at = 0.0
"""Monotonic time before which :func:`lazarus.rank.heartbeat` does not write (0: the
next call writes)."""
