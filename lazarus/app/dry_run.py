"""What ``lazarus start --dry-run`` says about the nodes (issue 39, part 3): each node
of the first generation, its address, login, interpreter, ranks and the command line
it runs, for every launcher; the holder's ``sbatch`` line in Slurm submit mode. Made
by :mod:`activities.nodes.node_plan` from the functions the launch itself uses, and
contacting nothing."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from lazarus.domain.spec import JobSpec, NodeSpec

GEN_DIR = "<run_dir>/<job>/run-<run id>/gen-<NNNNN>"
"""The first generation's folder, as the dry run shows it (the run id comes at start)."""


class NodePlan(BaseModel):
    """One node of the first generation, as the launch will use it."""

    model_config = ConfigDict(frozen=True)

    name: str
    launcher: str
    address: str
    """What the other nodes reach it by (``MASTER_ADDR`` when it is the first)."""
    login: str | None = None
    """ssh: ``user@host:port``, with ``via`` the jump hosts (``ProxyJump``)."""
    python: str | None = None
    """The node's own interpreter for Lazarus's node-side work (ssh, Slurm)."""
    ranks: list[int] = Field(default_factory=list)
    runs: list[str] = Field(default_factory=list)
    """The command line the node runs for its ranks (Slurm: the step's ``srun``)."""
    note: str = ""


def node_plans(spec: JobSpec) -> list[NodePlan]:
    from activities.nodes import node_plan  # activities: only a dry run

    return [NodePlan(**fields) for fields in node_plan.node_plans(spec)]


def planned_nodes(spec: JobSpec) -> list[NodeSpec]:
    """The spec's nodes, or in Slurm submit mode placeholders for the allocation's."""
    from activities.nodes import node_plan

    return node_plan.planned_nodes(spec)


def remote_placeholders(spec: JobSpec, nodes: list[NodeSpec]) -> dict[str, str]:
    from activities.nodes import node_plan

    return node_plan.remote_placeholders(spec, nodes)


def submit_argv(spec: JobSpec) -> list[str] | None:
    from activities.nodes import node_plan

    return node_plan.submit_argv(spec)
