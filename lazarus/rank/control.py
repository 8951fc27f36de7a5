"""The control file (``LAZARUS_CONTROL_FILE``) through which the controller talks to
a running rank: checkpoint requests, the disk and memory checkpoint intervals, and
(under run_resilient) a rejoin request naming this rank. Read only when it changed:
one ``stat`` per call."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from lazarus.domain import environment
from lazarus.rank import rejoin_requests
from lazarus.rank.identity import _env_int
from lazarus.rank.rejoin_requests import RejoinRequest, _parse_rejoin, _raise_if_rejoin_requested

_control_signature: tuple[int, int, int] | None = None
_last_checkpoint_request: int | None = None
_unanswered_request: int | None = None
"""The request the next commit answers: recorded in its manifest, so the controller
knows which checkpoint it asked for."""
_hold_after_commit = False
_pending_request = False
"""A new request was read from the control file and not yet returned by should_checkpoint."""
_control_intervals: dict[str, int] = {}
"""Interval overrides the control file holds now (key -> steps)."""
_control_warned: set[str] = set()


def should_checkpoint(step: int | None = None, *, every: int | None = None) -> bool:
    """True exactly once for each new checkpoint request the controller writes to
    ``LAZARUS_CONTROL_FILE`` (``{"checkpoint_request": <id>}``); False otherwise.
    Ids are positive; 0, which the launcher writes when it starts a generation,
    means "no request", so a fresh generation does not checkpoint at once.

    Given ``step`` (completed steps), it is also True when ``step`` is a multiple of
    the disk checkpoint interval: the controller's (:func:`checkpoint_every_steps`,
    from the control file or ``LAZARUS_CHECKPOINT_EVERY_STEPS``) when it set one,
    else the script's own ``every``. Without ``step`` it answers requests only, as
    it always did.

    Cheap enough for every step: one ``stat``, and the file is read only when
    it was replaced or its mtime or size changed. In a multi-rank job, ranks
    see the change at different steps, so ask on one rank and broadcast the
    answer (``lazarus.rank.torch.should_checkpoint`` does), or ranks will enter
    the checkpoint collective at different steps.

    Under :func:`lazarus.rank.torch.run_resilient` it raises :class:`RejoinRequested`
    when the control file asks this rank to rejoin a newer generation."""
    global _pending_request
    _poll_control()
    _raise_if_rejoin_requested()
    requested = _pending_request
    _pending_request = False
    if step is None:
        return requested
    interval = _interval(
        environment.CONTROL_CHECKPOINT_EVERY_STEPS, environment.CHECKPOINT_EVERY_STEPS
    )
    if interval is None:
        interval = every
    return requested or _on_interval(step, interval)


def checkpoint_every_steps() -> int | None:
    """The controller's disk checkpoint interval in steps: the control file's
    ``checkpoint_every_steps`` if present, else ``LAZARUS_CHECKPOINT_EVERY_STEPS``,
    else None (the script decides). 0 means "only when requested"."""
    _poll_control()
    return _interval(environment.CONTROL_CHECKPOINT_EVERY_STEPS, environment.CHECKPOINT_EVERY_STEPS)


def memory_every_steps() -> int:
    """The memory snapshot interval in steps; 0 when the memory tier is off. Set by
    the control file's ``memory_every_steps``, else ``LAZARUS_MEMORY_EVERY_STEPS``,
    else 1 once ``LAZARUS_MEMORY_CHECKPOINT_DIR`` names a directory."""
    if not os.environ.get(environment.MEMORY_CHECKPOINT_DIR):
        return 0
    _poll_control()
    interval = _interval(environment.CONTROL_MEMORY_EVERY_STEPS, environment.MEMORY_EVERY_STEPS)
    return 1 if interval is None else interval


def _on_interval(step: int, interval: int | None) -> bool:
    return interval is not None and interval > 0 and step > 0 and step % interval == 0


def _interval(control_key: str, variable: str) -> int | None:
    """The control file's value for ``control_key`` if it holds one, else the
    environment's ``variable``, else None. A malformed variable is the launcher's
    bug and raises; a malformed control value was warned about and is ignored."""
    if control_key in _control_intervals:
        return _control_intervals[control_key]
    if not os.environ.get(variable, "").strip():
        return None
    value = _env_int(variable, 0)
    if value < 0:
        raise ValueError(f"environment variable {variable}={value} must be >= 0")
    return value


def _poll_control() -> None:
    """Read the control file if it changed since the last read: record a new
    checkpoint request (for :func:`should_checkpoint`), the interval overrides and,
    under run_resilient, a rejoin request naming this rank."""
    global _control_signature, _last_checkpoint_request, _unanswered_request
    global _hold_after_commit, _pending_request, _control_intervals
    path = os.environ.get(environment.CONTROL_FILE)
    if not path:
        return
    signature = file_signature(path)
    if signature is None or signature == _control_signature:
        return
    try:
        with open(path, "rb") as handle:
            document = json.loads(handle.read())
        request = document.get("checkpoint_request")
    except (OSError, ValueError, AttributeError):
        # Half-written or foreign content: leave the signature unrecorded so the
        # next call reads it again.
        return
    _control_signature = signature
    _control_intervals = _intervals_in(document, path)
    if rejoin_requests._rejoin_armed:
        # Once seen, a request stays until it is acted on: a later rewrite of the
        # file that drops the key must not take it back.
        rejoin_requests._rejoin_request = (
            _rejoin_request_in(document, path) or rejoin_requests._rejoin_request
        )
    if not isinstance(request, int) or isinstance(request, bool) or request <= 0:
        return
    if request == _last_checkpoint_request:
        return
    _last_checkpoint_request = request
    _unanswered_request = request
    _hold_after_commit = document.get("then") == "hold"
    _pending_request = True


def _intervals_in(document: dict[str, Any], path: str) -> dict[str, int]:
    """The interval overrides in a control document: absent or null keys leave the
    environment's value in force; anything but an integer >= 0 is reported once on
    stderr and ignored, because training must not die of a bad control write."""
    found: dict[str, int] = {}
    for key in (environment.CONTROL_CHECKPOINT_EVERY_STEPS, environment.CONTROL_MEMORY_EVERY_STEPS):
        value = document.get(key)
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            found[key] = value
        elif key not in _control_warned:
            _control_warned.add(key)
            print(
                f"lazarus.rank: control file {path}: {key}={value!r} is not an integer >= 0; "
                "ignored",
                file=sys.stderr,
            )
    return found


def _rejoin_request_in(document: dict[str, Any], path: str) -> RejoinRequest | None:
    """The control document's rejoin request if it is valid, newer than this rank's
    generation and names this rank; None otherwise. A malformed one is reported once
    on stderr and ignored: training must not die of a bad control write (the
    controller then sees a rank that never rejoined, and replaces it)."""
    raw = document.get(environment.CONTROL_REJOIN)
    if raw is None:
        return None
    problem, request = _parse_rejoin(raw)
    if problem is not None and environment.CONTROL_REJOIN not in _control_warned:
        _control_warned.add(environment.CONTROL_REJOIN)
        print(
            f"lazarus.rank: control file {path}: rejoin request ignored: {problem}",
            file=sys.stderr,
        )
    return request


def file_signature(path: str) -> tuple[int, int, int] | None:
    """What tells whether the control file changed since it was read, in one ``stat``
    (None when it cannot be read). The inode catches a rename-into-place rewrite even
    within one coarse mtime tick; mtime and size catch writers that rewrite in place."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (status.st_ino, status.st_mtime_ns, status.st_size)


def rejoin_request_now() -> RejoinRequest | None:
    """The control file's rejoin request for this rank, read afresh and touching none
    of this module's state: for :mod:`lazarus.rank.torch`'s NCCL watch thread, which
    must not race the main thread's reads (that thread acts on the request itself,
    through :func:`_poll_control`). None when there is none, or the file is unreadable
    or malformed (the main thread reports that)."""
    path = os.environ.get(environment.CONTROL_FILE)
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            document = json.loads(handle.read())
    except (OSError, ValueError):
        return None
    raw = document.get(environment.CONTROL_REJOIN) if isinstance(document, dict) else None
    return None if raw is None else _parse_rejoin(raw)[1]
