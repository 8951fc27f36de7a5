"""``lazarus checkpoints`` and ``lazarus verify``, answered by a worker (issue 40, part 2).

The CLI sends a :class:`~lazarus.domain.worker_calls.ListCheckpointsRequest` or
:class:`~lazarus.domain.worker_calls.VerifyCheckpointsRequest` through the call workflow
(``workflows/worker_call.py``); these activities read the store as the worker sees it,
with its filesystem and its store credentials, the same ones the job's uploads and
restores use. Bad input and an unreachable store come back as fields of the answer,
which the CLI turns into exit code 2; a corrupt checkpoint is a finding, not an error.
"""

from __future__ import annotations

import asyncio

from temporalio import activity

from activities.checkpoints.listing import list_checkpoints
from activities.checkpoints.storage import CheckpointInputError, locate, store_errors
from activities.checkpoints.verify import verify_in_store
from lazarus.domain.activity_refs import LIST_CHECKPOINTS, VERIFY_CHECKPOINTS
from lazarus.domain.worker_calls import (
    ListCheckpointsRequest,
    ListCheckpointsResult,
    VerifyCheckpointsRequest,
    VerifyCheckpointsResult,
)


@activity.defn(name=LIST_CHECKPOINTS.name)
async def list_checkpoints_for_client(request: ListCheckpointsRequest) -> ListCheckpointsResult:
    return await asyncio.to_thread(listing, request)


@activity.defn(name=VERIFY_CHECKPOINTS.name)
async def verify_checkpoints_for_client(
    request: VerifyCheckpointsRequest,
) -> VerifyCheckpointsResult:
    return await asyncio.to_thread(verification, request)


def listing(request: ListCheckpointsRequest) -> ListCheckpointsResult:
    """Every checkpoint of the directory and the durable store, newest first."""
    try:
        rows = list_checkpoints(
            request.checkpoint_dir,
            request.durable_uri,
            endpoint_url=request.endpoint_url,
            hashes=request.hashes,
        )
    except CheckpointInputError as exc:
        return ListCheckpointsResult(input_error=str(exc))
    except store_errors() as exc:
        return ListCheckpointsResult(
            store_error=f"{request.durable_uri}: cannot read the durable store: {exc}"
        )
    return ListCheckpointsResult(rows=rows)


def verification(request: VerifyCheckpointsRequest) -> VerifyCheckpointsResult:
    """One checkpoint, or every checkpoint under a root, against its manifest."""
    target = request.target
    try:
        store, name = locate(target, endpoint_url=request.endpoint_url)
        if name is not None and not store.exists(name):
            raise CheckpointInputError(f"{target}: no such checkpoint")
        names = [name] if name is not None else [n for _, n in reversed(store.steps())]
        if not names:
            raise CheckpointInputError(f"{target}: no checkpoints (step-NNNNNNNN) under it")
        results = [
            verify_in_store(
                store,
                n,
                "sizes" if request.sizes_only else "hashes",
                expected_world_size=request.world_size,
            )
            for n in names
        ]
    except CheckpointInputError as exc:
        return VerifyCheckpointsResult(input_error=str(exc))
    except store_errors() as exc:
        return VerifyCheckpointsResult(store_error=f"{target}: cannot read the store: {exc}")
    return VerifyCheckpointsResult(results=results)
