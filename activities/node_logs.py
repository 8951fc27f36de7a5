"""``lazarus logs`` of a rank on an ssh or Slurm node, read on a worker (issue 40, part 2).

The CLI is a client: a rank log on another machine is read by the node's agent
(:meth:`~activities.nodes.agent.NodeAgent.log_read`, one round trip per chunk, by
offset), and that agent lives on the worker, with the worker's ssh keys and Slurm
client. The CLI sends :class:`~lazarus.domain.worker_calls.ReadLogRequest` (and, to
know when a followed generation has ended, :class:`RanksEndedRequest`) through the call
workflow; :class:`AgentLogs` answers. Agents are kept open a while between calls (a
follower asks twice a second), and closed after :data:`IDLE_CLOSE_S` unused.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from temporalio import activity

from activities.nodes.factory import agent_for
from lazarus.domain.activity_refs import RANKS_ENDED, READ_LOG
from lazarus.domain.spec_nodes import NodeSpec, SlurmSpec, SSHSpec
from lazarus.domain.worker_calls import (
    RanksEndedRequest,
    RanksEndedResult,
    ReadLogRequest,
    ReadLogResult,
)

IDLE_CLOSE_S = 60.0
"""An agent no call used for this long is closed (its ssh connection with it)."""


class AgentLogs:
    """Rank logs on remote nodes through their agents, one agent per node, reused."""

    def __init__(self) -> None:
        self._agents: dict[str, tuple[Any, float]] = {}
        self._lock = threading.Lock()

    def _agent(self, node: NodeSpec, ssh: SSHSpec, slurm: SlurmSpec | None) -> Any:
        key = "\n".join(m.model_dump_json() if m is not None else "" for m in (node, ssh, slurm))
        now = time.monotonic()
        with self._lock:
            for old, (agent, used) in list(self._agents.items()):
                if now - used > IDLE_CLOSE_S and old != key:
                    del self._agents[old]
                    agent.close()
            agent = self._agents[key][0] if key in self._agents else agent_for(node, ssh, slurm)
            self._agents[key] = (agent, now)
            return agent

    def read(self, request: ReadLogRequest) -> ReadLogResult:
        try:
            agent = self._agent(request.node, request.ssh, request.slurm)
            got = agent.log_read(request.gen_dir, request.rank, request.offset, request.max_bytes)
        except Exception as exc:  # unreachable, refused: one line for the user
            return ReadLogResult(error=str(exc) or type(exc).__name__)
        return ReadLogResult(data=got.data, size=got.size, mtime=got.mtime)

    def ended(self, request: RanksEndedRequest) -> RanksEndedResult:
        """Whether every rank of the request has ended: an exit record, or no process."""
        try:
            agent = self._agent(request.node, request.ssh, request.slurm)
            status = agent.poll(request.gen_dir, request.ranks)
        except Exception as exc:
            return RanksEndedResult(error=str(exc) or type(exc).__name__)
        if not status.reachable:
            return RanksEndedResult(error=status.error or "unreachable")
        ended = all(
            record.exit is not None or (record.pid is not None and not record.alive)
            for record in status.ranks
        )
        return RanksEndedResult(ended=ended)

    def close(self) -> None:
        with self._lock:
            for agent, _ in self._agents.values():
                agent.close()
            self._agents.clear()


_WORKER_LOGS = AgentLogs()
"""The worker's own: shared by every call it answers."""


@activity.defn(name=READ_LOG.name)
async def read_log_for_client(request: ReadLogRequest) -> ReadLogResult:
    return await asyncio.to_thread(_WORKER_LOGS.read, request)


@activity.defn(name=RANKS_ENDED.name)
async def ranks_ended_for_client(request: RanksEndedRequest) -> RanksEndedResult:
    return await asyncio.to_thread(_WORKER_LOGS.ended, request)
