"""Which agent reaches a node: chosen by the node's ``launcher``, unless a
substitution (:func:`substituted_agents`: simulated nodes, for the scale bench and
its tests) claims the node first."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from activities.nodes.agent import NodeAgent
from activities.nodes.local.agent import LocalAgent
from lazarus.domain.contracts import NodeAccess
from lazarus.domain.spec import NodeSpec, SlurmSpec, SSHSpec

T = TypeVar("T")

AgentSource = Callable[[NodeSpec], NodeAgent | None]
"""An agent for the nodes it claims, None for the others."""

_substitutes: list[AgentSource] = []


@contextmanager
def substituted_agents(source: AgentSource) -> Iterator[None]:
    """Nodes ``source`` claims get its agent instead of their launcher's, in this whole
    process (an in-process worker too) until the block ends. Not reachable from a job
    spec: only code that runs the worker itself (the scale bench, tests) can simulate
    nodes, so no spec can make a real controller pretend."""
    _substitutes.append(source)
    try:
        yield
    finally:
        _substitutes.remove(source)


def this_machine_agent() -> NodeAgent:
    """Every rank of this machine's run directories, whichever logical node launched
    it: a stop that names no nodes."""
    return LocalAgent(NodeSpec(), whole_machine=True)


def agent_for(node: NodeSpec, ssh: SSHSpec, slurm: SlurmSpec | None = None) -> NodeAgent:
    """``slurm`` is the job's allocation: Slurm nodes need it to start a step, run a
    preflight or reach node-local state (polling, stopping and logs work without)."""
    for source in reversed(_substitutes):
        substitute = source(node)
        if substitute is not None:
            return substitute
    if node.launcher == "ssh":
        from activities.nodes.ssh.agent import SSHAgent

        return SSHAgent(node, ssh)
    if node.launcher == "slurm":
        from activities.nodes.slurm.agent import SlurmAgent

        return SlurmAgent(node, slurm)
    return LocalAgent(node)


@contextmanager
def agents(access: NodeAccess) -> Iterator[list[NodeAgent]]:
    """Agents for one activity, one per node of ``access`` in its order: connections
    are reused inside it, closed after."""
    opened = [agent_for(node, access.ssh, access.slurm) for node in access.nodes]
    try:
        yield opened
    finally:
        for agent in opened:
            agent.close()


def on_each(items: Sequence[NodeAgent], fn: Callable[[NodeAgent], T]) -> list[T]:
    """Run a blocking per-node call on every node at once: N nodes cost one round trip."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(32, len(items))) as pool:
        return list(pool.map(fn, items))


def on_each_settled(
    items: Sequence[NodeAgent], fn: Callable[[NodeAgent], T]
) -> list[T | Exception]:
    """Like :func:`on_each`, but every node's outcome, result or exception, in order:
    a caller that must clean up after one node's failure needs to know what the
    others did."""

    def settled(item: NodeAgent) -> T | Exception:
        try:
            return fn(item)
        except Exception as exc:  # returned to the caller, not swallowed
            return exc

    return on_each(items, settled)
