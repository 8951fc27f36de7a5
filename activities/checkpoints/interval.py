"""Send a tuned disk checkpoint interval to the ranks of a live generation.

``checkpoints.interval: auto`` (Young and Daly; the decision is the workflow's,
``workflows.checkpoint_tuning``) changes the interval while the ranks run: the
new value goes into each node's copy of the generation's control file, which
``lazarus.rank.should_checkpoint`` re-reads when it changes, so no rank restarts.

The control file is rewritten whole and atomically (each agent's ``write_file``
renames into place), with every key a reader needs kept: the memory interval and the
checkpoint request id the file holds (see :class:`SetCheckpointIntervalRequest`). A
request id equal to one the ranks have already answered is ignored by them, so the
rewrite never triggers a checkpoint.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from temporalio import activity

from activities.nodes.agent import NodeAgent
from activities.nodes.factory import agents, on_each
from activities.nodes.rundir import GenerationDir, control_document, read_json
from lazarus.domain.contracts import SetCheckpointIntervalRequest, SetCheckpointIntervalResult


def interval_document(
    request: SetCheckpointIntervalRequest, current: dict[str, Any] | None
) -> dict[str, Any]:
    """The control document with the new interval. ``current`` (the file as it is, where
    it can be read) contributes a newer checkpoint request, with its ``then``, so a
    request the ranks have not answered yet is never lost."""
    request_id = request.checkpoint_request
    then: str | None = None
    if current is not None:
        found = current.get("checkpoint_request")
        if isinstance(found, int) and not isinstance(found, bool) and found > request_id:
            request_id = found
            raw_then = current.get("then")
            then = raw_then if isinstance(raw_then, str) else None
    return control_document(
        request_id,
        checkpoint_every_steps=request.checkpoint_every_steps,
        memory_every_steps=request.memory_every_steps,
        then=then,
    )


def write_interval(request: SetCheckpointIntervalRequest) -> list[str]:
    """Write the interval on every node at once; the names of the nodes written."""
    control = GenerationDir(Path(request.run_dir)).control_file

    def write(agent: NodeAgent) -> str:
        # Local nodes share this machine's files: the file can be read and its request
        # kept. Elsewhere the workflow's knowledge (the request field) stands.
        current = read_json(control) if agent.runs_here else None
        agent.write_file(str(control), json.dumps(interval_document(request, current)))
        return agent.node.name

    with agents(request.access.or_this_machine()) as opened:
        return on_each(opened, write)


@activity.defn(name="set_checkpoint_interval")
async def set_checkpoint_interval(
    request: SetCheckpointIntervalRequest,
) -> SetCheckpointIntervalResult:
    """Idempotent: a retry writes the same document again."""
    written = await asyncio.to_thread(write_interval, request)
    return SetCheckpointIntervalResult(nodes=written)
