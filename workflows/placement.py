"""Where the job runs: its run directory and the nodes of its current generation.

Pure lookups over the spec and the state, so the workflow class holds only the state
machine and these are checked without a server (``tests/unit/test_placement.py``).
"""

from __future__ import annotations

from lazarus.domain.spec import JobSpec, NodeSpec
from workflows.state import JobState, NodePool


def run_root(spec: JobSpec, state: JobState) -> str:
    """This start's run directory: ``<run_dir>/<job_id>/<run_key>``, or the legacy
    ``<run_dir>/<job_id>`` for jobs started before each start had its own."""
    job_dir = f"{spec.run_dir}/{spec.job_id}"
    return f"{job_dir}/{state.run_key}" if state.run_key else job_dir


def generation_dir(spec: JobSpec, state: JobState) -> str:
    """The current generation's directory (launch.json, exit files, heartbeats)."""
    return f"{run_root(spec, state)}/gen-{state.generation:05d}"


def find_node(spec: JobSpec, name: str) -> NodeSpec | None:
    """The spec of a node the job knows (a node or a spare), or None."""
    return next((n for n in (*spec.nodes, *spec.spares) if n.name == name), None)


def node_spec(spec: JobSpec, name: str) -> NodeSpec:
    """The spec of a node the pool names: every pool name comes from the spec, so a
    missing one is a bug, raised as ``KeyError(name)``."""
    node = find_node(spec, name)
    if node is None:
        raise KeyError(name)
    return node


def active_nodes(spec: JobSpec, pool: NodePool) -> list[NodeSpec]:
    """The current generation's nodes, in rank order."""
    return [node_spec(spec, name) for name in pool.active]


def prewarm_nodes(spec: JobSpec, pool: NodePool) -> list[NodeSpec]:
    """The spares a launch prewarms (``LaunchRequest.prewarm``): with ``warm_start``,
    every spare of the pool that runs no rank, so the launch that swaps one in after a
    node loss forks its ranks from a zygote that has already imported ``preload``
    instead of waiting for it (issue 28). None without ``warm_start``: there are no
    zygotes. A spare that leaves the pool keeps its zygote until the run's end, whose
    stop reaches every node the run knew (:func:`workflows.stops.end_of_run_targets`)."""
    if spec.warm is None:
        return []
    spares = [find_node(spec, name) for name in pool.spares if name not in pool.active]
    return [node for node in spares if node is not None]


def world_size(spec: JobSpec, pool: NodePool) -> int:
    return len(pool.active) * spec.nproc_per_node
