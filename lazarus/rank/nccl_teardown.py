"""How a rank that rejoins in place leaves its process groups, by backend.

Kept apart from :mod:`lazarus.rank.torch` (which runs the rejoin) because the choice
is per backend and torch version, and tested with a fake ``distributed_c10d``: on
NCCL the communicators are aborted, never destructed; on gloo the groups are
destroyed. Imports no torch: the caller passes torch's API in.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from lazarus.domain import environment
from lazarus.rank import rejoin_requests


def prefer_nccl_cleanup_only(backend: str) -> None:
    """Under rejoin on NCCL, ask the watchdog to abort and raise on a communicator
    error (``TORCH_NCCL_ASYNC_ERROR_HANDLING=2``) rather than end the process (1, what
    the launcher sets like torchrun when the job did not choose; or 3): the rank must
    outlive its peer's failure to rejoin. A job's explicit 0 or 2 is kept."""
    if backend != "nccl" or not rejoin_requests._rejoin_armed:
        return
    if os.environ.get(environment.NCCL_ASYNC_ERROR_HANDLING, "3") in ("1", "3"):
        os.environ[environment.NCCL_ASYNC_ERROR_HANDLING] = "2"


def teardown_call(backend: str, api: Any) -> Callable[[], None]:
    """How a rank that rejoins leaves its process groups (``api``: torch's
    ``distributed_c10d``). On NCCL it aborts: ``_abort_process_group()`` on the world
    aborts every communicator of every group (the snapshot thread's too) inside one
    NCCL group call, and returns without waiting on collectives the dead peer will
    never join; a plain destroy would wait on them. On gloo, which has no abort, it
    destroys: gloo's pending operations already failed when the peer's sockets closed.
    A torch without the abort (before 2.3) destroys on NCCL too, bounded by
    :data:`lazarus.rank.torch.TEARDOWN_TIMEOUT_S` like every teardown: a rank stuck
    there exits, and the controller restarts the whole generation.

    The aborted NCCL groups are kept referenced (:data:`aborted_groups`), never
    destructed: ``ProcessGroupNCCL``'s destructor joins its watchdog thread, which
    after a peer's failure may sit in its debug dump for many seconds (seen on an
    H200, torch 2.11: the abort itself took 0.5 s, then the destructor blocked past the
    30 s teardown bound, and the whole generation restarted). A few kilobytes per
    rejoin, and the watchdog thread finishes on its own."""
    abort = getattr(api, "_abort_process_group", None)
    if backend == "nccl" and callable(abort):

        def abort_keeping_the_groups() -> None:
            world = getattr(api, "_world", None)
            aborted_groups.extend(getattr(world, "pg_map", None) or ())
            abort()

        return abort_keeping_the_groups
    destroy: Callable[[], None] = api.destroy_process_group
    return destroy


aborted_groups: list[Any] = []
"""Every NCCL process group a rejoin aborted, kept alive (see :func:`teardown_call`)."""
