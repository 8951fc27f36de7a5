"""Just-in-time checkpoints: save now, before a planned disruption.

A pause, a drain or a straggler swap is planned, so it need not cost the steps since
the last periodic checkpoint. The workflow writes a new request id into the
generation's control file (on every node: ranks read their own node's copy through
``lazarus.rank.should_checkpoint``), the ranks save at their next step boundary,
and this activity waits until that checkpoint is committed. The wait is bounded:
ranks that cannot save (hung, or a script that never calls ``should_checkpoint``)
must not block the pause, so after ``timeout_s`` the caller goes ahead and counts
the steps lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

from temporalio import activity

from activities.nodes.agent import NodeAgent
from activities.nodes.factory import agents, on_each
from activities.nodes.rundir import GenerationDir, control_document, read_json
from lazarus.domain.checkpoint_layout import MANIFEST, committed_steps
from lazarus.domain.contracts import CheckpointNowRequest, CheckpointNowResult, CheckpointRef

POLL_S = 0.1


def request_checkpoint(request: CheckpointNowRequest) -> None:
    control = GenerationDir(Path(request.run_dir)).control_file
    # "hold": rank 0 waits right after committing, so no rank gets past the checkpoint
    # before the stop that follows it (see lazarus.rank.commit_checkpoint).
    content = json.dumps(
        control_document(
            request.request_id,
            checkpoint_every_steps=request.checkpoint_every_steps,
            memory_every_steps=request.memory_every_steps,
            then="hold",
        )
    )

    def write(agent: NodeAgent) -> None:
        agent.write_file(str(control), content)

    with agents(request.access.or_this_machine()) as opened:
        on_each(opened, write)


def newest_step(checkpoint_dir: str) -> int | None:
    found = committed_steps(Path(checkpoint_dir))
    return found[-1][0] if found else None


def answering(
    checkpoint_dir: str, request_id: int, newer_than: int | None, *, any_newer: bool
) -> CheckpointRef | None:
    """The committed checkpoint whose manifest says it answers ``request_id``; with
    ``any_newer`` (the wait is over: take what there is, for scripts that commit
    their own way), the newest one newer than ``newer_than``."""
    for step, path in reversed(committed_steps(Path(checkpoint_dir))):
        if newer_than is not None and step <= newer_than:
            break
        manifest = read_json(path / MANIFEST) or {}
        if any_newer or manifest.get("checkpoint_request") == request_id:
            return CheckpointRef(step=step, path=str(path))
    return None


@activity.defn(name="checkpoint_now")
async def checkpoint_now(request: CheckpointNowRequest) -> CheckpointNowResult:
    """Idempotent: a retry rewrites the same request id, which ranks that already
    saved for it ignore, and then waits for the same condition."""
    started = time.monotonic()
    baseline = request.newer_than_step
    if baseline is None:
        baseline = await asyncio.to_thread(newest_step, request.checkpoint_dir)
    await asyncio.to_thread(request_checkpoint, request)
    deadline = started + request.timeout_s
    while True:
        over = time.monotonic() >= deadline
        found = await asyncio.to_thread(
            answering, request.checkpoint_dir, request.request_id, baseline, any_newer=over
        )
        if found is not None or over:
            return CheckpointNowResult(checkpoint=found, waited_s=time.monotonic() - started)
        with contextlib.suppress(RuntimeError):  # outside an activity (tests)
            activity.heartbeat(f"waiting for the checkpoint answering request {request.request_id}")
        await asyncio.sleep(POLL_S)
