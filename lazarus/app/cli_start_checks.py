"""The checks ``lazarus start`` makes on its own machine before anything starts: a
job's spec can be wrong in ways no server is needed to see (a program that does not
exist, a host that cannot be reached), and such a job is refused, naming the field.
"""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console

from lazarus.app.cli_output import say
from lazarus.domain.spec import JobSpec, checks_workdir_here


def missing_local_program(spec: JobSpec) -> str | None:
    """A job on this machine whose program does not exist: a typo in ``command``,
    refused before anything starts (the preflight would find it too, but then the job
    exists, and a wrong ``command`` is the spec's fault, not the node's). Resolved by
    the launcher's own rule (:func:`activities.program.resolve_program`: the worker's
    interpreter first, then PATH, or ``env.PATH``). Jobs on other machines are checked
    there: ``unusable_nodes`` for ssh, the workflow's preflight for every node."""
    from activities.program import resolve_program

    if not checks_workdir_here(spec) or resolve_program(spec) is not None:
        return None
    program = spec.command[0]
    where = (
        f"in workdir {spec.workdir} (or not executable: chmod +x)"
        if os.sep in program
        else "on PATH" + (" (env.PATH)" if "PATH" in spec.env else "")
    )
    return (
        f"command: program {program!r} not found {where}; fix `command` (a list: "
        "[program, arg, ...]) and start again; nothing was started"
    )


def unusable_nodes(spec_file: Path, spec: JobSpec, out: Console) -> list[str]:
    """Bad hosts are bad input: a wrong host key, an unreachable host or a bad identity
    file is reported here, naming the node, and nothing is started."""
    from activities.preflight import check_nodes
    from lazarus.domain.contracts import NodeAccess, PreflightActivityRequest

    everything = [*spec.nodes, *spec.spares]
    with out.status(f"checking {len(everything)} nodes ..."):
        report = check_nodes(
            PreflightActivityRequest(
                access=NodeAccess(nodes=everything, ssh=spec.ssh),  # ssh nodes: no Slurm
                checks=spec.preflight,
                interpreter=spec.command[0],
                workdir=spec.workdir,
                disk_path=spec.checkpoint_dir,
                search_path=spec.env.get("PATH"),
            )
        )
    where = {n.name: f"nodes[{i}]" for i, n in enumerate(spec.nodes)}
    where.update({n.name: f"spares[{i}]" for i, n in enumerate(spec.spares)})
    spares = {n.name for n in spec.spares}
    for health in report.failed:
        if health.node in spares:  # a bad spare is worth a warning, not a refusal
            for problem in health.problems:
                say(f"warning: {where[health.node]} ({health.node}): {problem}")
    return [
        f"{spec_file}: {where[health.node]} ({health.node}): {problem}"
        for health in report.failed
        if health.node not in spares
        for problem in health.problems
    ]
