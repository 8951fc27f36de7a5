"""The node side of ``lazarus start --dry-run`` (the worker's start check,
:mod:`activities.start_checks`, returns it; the CLI shows it):
where each rank of the first generation runs and what each node runs, made from the
same functions the launch uses (issue 39, part 3):
- ``local``: the worker's rank wrapper on the worker's machine;
- ``ssh``: the login (``~/.ssh/config`` applied: alias, user, port, jump hosts), the
  node's interpreter, and the shim's ``start`` of the command there;
- ``slurm`` inside an allocation: each node's job step, the ``srun`` line the node's
  agent runs (:func:`activities.nodes.slurm.agent.step_argv`) with the task on the
  node's own interpreter;
- ``slurm`` submit mode: the ``sbatch`` line of the holder
  (:func:`activities.nodes.slurm.submit.holder_argv`) and the nodes it asks for, as
  placeholders until Slurm grants them.

Contacts nothing: no ssh login, no Slurm command (``MASTER_ADDR`` on Slurm is the
address Slurm knows the first node by, asked at launch: a placeholder here).
"""

from __future__ import annotations

from typing import Any

from activities.nodes.slurm.agent import step_argv
from activities.nodes.slurm.submit import first_holder_name, holder_argv
from activities.nodes.ssh.config import SSHConfigError, rendezvous_host, route
from lazarus.domain.spec import JobSpec, NodeSpec

GEN_DIR = "<run_dir>/<job>/run-<run id>/gen-<NNNNN>"
WRAPPER = ["<worker python>", "-m", "activities.nodes.rank_wrapper", "...", "--"]


def planned_nodes(spec: JobSpec) -> list[NodeSpec]:
    """The nodes the first generation runs on: the spec's, or in Slurm submit mode
    placeholders for the allocation's first ``slurm.nodes`` nodes."""
    slurm = spec.slurm
    if slurm is not None and slurm.submits and slurm.nodes is not None:
        return [
            NodeSpec.model_construct(name=name, launcher="slurm", host=name)
            for name in (f"<allocation node {i + 1}>" for i in range(slurm.nodes))
        ]
    return list(spec.nodes)


def submit_argv(spec: JobSpec) -> list[str] | None:
    """The holder's ``sbatch`` line in submit mode (the workflow's first step)."""
    if spec.slurm is None or not spec.slurm.submits:
        return None
    return holder_argv(spec.slurm, first_holder_name(spec.name), spec.run_dir)


def remote_placeholders(spec: JobSpec, nodes: list[NodeSpec]) -> dict[str, str]:
    """What the launch sets on ssh and Slurm nodes that the CLI's machine cannot know:
    the first Slurm node's address, and PATH where the spec sets none (an ssh node's
    own; the worker's, which ``srun`` exports)."""
    first = nodes[0]
    shown: dict[str, str] = {}
    if first.launcher == "slurm":
        shown["MASTER_ADDR"] = master_address(spec, nodes)
    if "PATH" not in spec.env and all("PATH" not in n.env for n in nodes):
        if first.launcher == "ssh":
            shown["PATH"] = "<the node's own PATH (its login's)>"
        elif first.launcher == "slurm":
            shown["PATH"] = "<the worker's PATH, as srun exports it>"
    return shown


def master_address(spec: JobSpec, nodes: list[NodeSpec]) -> str:
    first = nodes[0]
    if first.launcher == "slurm":
        return f"<the address Slurm knows {first.name} by (NodeAddr), asked at launch>"
    return rendezvous_host(first, spec.ssh)


def node_plans(spec: JobSpec) -> list[dict[str, Any]]:
    nodes = planned_nodes(spec)
    master = master_address(spec, nodes)
    plans = []
    for index in range(len(nodes)):
        ranks = list(range(index * spec.nproc_per_node, (index + 1) * spec.nproc_per_node))
        plans.append(_node_plan(spec, nodes, index, ranks, master if index == 0 else None))
    return plans


def _node_plan(
    spec: JobSpec, nodes: list[NodeSpec], index: int, ranks: list[int], master: str | None
) -> dict[str, Any]:
    node = nodes[index]
    address = master or rendezvous_host(node, spec.ssh)
    if node.launcher == "local":
        return dict(
            name=node.name,
            launcher="local",
            address=address,
            ranks=ranks,
            runs=[*WRAPPER, *spec.command],
            note="on the worker's machine, each rank under the worker's rank wrapper",
        )
    if node.launcher == "ssh":
        return _ssh_plan(spec, node, address, ranks)
    return _slurm_plan(spec, nodes, index, address, ranks)


def _ssh_plan(spec: JobSpec, node: NodeSpec, address: str, ranks: list[int]) -> dict[str, Any]:
    try:
        found = route(node, spec.ssh)
        logins = [f"{h.user or '<worker user>'}@{h.host}:{h.port}" for h in found.jumps]
        target = found.target
        login = f"{target.user or '<worker user>'}@{target.host}:{target.port}"
        if logins:
            login += " via " + " -> ".join(logins)
    except SSHConfigError as exc:
        login = f"<{exc}>"
    python = node.node_python(spec.ssh.python)
    return dict(
        name=node.name,
        launcher="ssh",
        address=address,
        login=login,
        python=python,
        ranks=ranks,
        runs=["sh", "-s", "<shim>", "start", GEN_DIR, "<rank>", spec.workdir, "--", *spec.command],
        note="each rank in its own session (setsid) on the node, with the node's own PATH "
        "unless env sets one; the node needs lazarus-rank in the ranks' environment",
    )


def _slurm_plan(
    spec: JobSpec, nodes: list[NodeSpec], index: int, address: str, ranks: list[int]
) -> dict[str, Any]:
    node = nodes[index]
    slurm = spec.slurm
    python = node.node_python(slurm.python if slurm is not None else "python3")
    job = str(slurm.job_id) if slurm is not None and slurm.job_id else "<allocation id>"
    argv = step_argv(
        node_name=node.name,
        job=job,
        name=f"lazarus-g1-<run>-{node.name}",
        gen_dir=GEN_DIR,
        nodes=[n.name for n in nodes],
        nproc=spec.nproc_per_node,
        ranks=ranks,
        workdir=spec.workdir,
        env_file=spec.env_from_file,
        command=spec.command,
        python=python,
        slurm=slurm,
        srun="srun",
        check_container=False,
    )
    return dict(
        name=node.name,
        launcher="slurm",
        address=address,
        python=python,
        ranks=ranks,
        runs=argv,
        note="one job step per node and generation; each task runs the node's own "
        "interpreter with lazarus-rank (nothing of the controller's)",
    )
