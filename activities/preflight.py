"""Preflight: every node is checked, in parallel, before each launch.

A node that fails is replaced before launch and never launched on: finding a bad
disk or a missing interpreter here costs seconds, finding it after rendezvous
costs a whole failed generation.
"""

from __future__ import annotations

import asyncio
import os

from temporalio import activity

from activities.command_policy import CommandNotAllowed, enforce
from activities.nodes.agent import NodeAgent, NodeRefused, NodeUnreachable, PreflightRequest
from activities.nodes.factory import agents, on_each
from activities.program import rank_search_path
from lazarus.domain.contracts import NodeHealth, PreflightActivityRequest, PreflightReport


def check_nodes(request: PreflightActivityRequest) -> PreflightReport:
    checks = PreflightRequest(
        interpreter=request.interpreter,
        workdir=request.workdir,
        disk_path=request.disk_path,
        min_free_disk_gb=request.checks.min_free_disk_gb,
        health_command=request.checks.health_command,
        timeout_s=request.checks.timeout_s,
        search_path=rank_search_path(request.search_path),
    )

    def check(agent: NodeAgent) -> NodeHealth:
        name = agent.node.name
        own_path = agent.node.env.get("PATH") or request.search_path
        try:
            result = agent.preflight(
                checks.model_copy(
                    update={"search_path": rank_search_path(own_path, agent.node.launcher)}
                )
            )
        except (NodeUnreachable, NodeRefused) as exc:
            problems = [f"reachable: {exc}"]
            if request.job_id:
                # Its scheduler (Slurm) says the node is gone: drain it, as a lost node
                # found by the supervisor is; the outcome goes into the quarantine's
                # reason. Nodes without a scheduler answer None.
                drained = agent.drain_if_lost("node_lost", request.job_id)
                problems += [drained.evidence()] if drained is not None else []
            return NodeHealth(node=name, ok=False, problems=problems)
        return NodeHealth(
            node=name,
            ok=result.ok,
            problems=result.problems,
            free_disk_gb=result.free_disk_gb,
            gpus=result.gpus.count if result.gpus else None,
            program_missing=result.program_missing,
        )

    with agents(request.access) as opened:
        return PreflightReport(nodes=on_each(opened, check))


def enforce_health_command(request: PreflightActivityRequest) -> None:
    """The worker's allow-list decides whether the health command may run at all.

    Only the activity applies it: ``lazarus start`` also calls :func:`check_nodes`,
    as the client's own user, and the client is not the trust boundary."""
    health = request.checks.health_command
    if not health:
        return
    # Local checks run it with the worker's PATH; on ssh nodes only a path is checkable.
    enforce(
        "preflight.health_command",
        health,
        workdir=request.workdir,
        search_path=os.environ.get("PATH"),
        remote=not all(node.transport.runs_here for node in request.access.nodes),
    )


def _checked_nodes(request: PreflightActivityRequest) -> PreflightReport:
    enforce_health_command(request)
    return check_nodes(request)


@activity.defn(name="preflight")
async def preflight(request: PreflightActivityRequest) -> PreflightReport:
    try:
        return await asyncio.to_thread(_checked_nodes, request)
    except CommandNotAllowed as exc:
        raise exc.application_error() from None
