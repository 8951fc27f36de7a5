"""Which program a rank runs, and the PATH it is found on.

Both the launcher (before it starts a generation) and preflight (on every node)
must agree on where ``python`` in a job's command comes from, so the rule lives
here, not in either of them.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from activities.nodes.ssh_config import rendezvous_host
from lazarus.domain.spec import JobSpec, NodeSpec

__all__ = ["rank_paths", "rank_search_path", "rendezvous_host", "resolve_program"]


def resolve_program(spec: JobSpec) -> str | None:
    """Where the command's program would come from, or None if it cannot start."""
    program = spec.command[0]
    search_path = spec.env.get("PATH") or os.pathsep.join(
        [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    )
    if os.sep in program:
        candidate = Path(spec.workdir) / program
        return str(candidate) if os.access(candidate, os.X_OK) else None
    return shutil.which(program, path=search_path)


def rank_search_path(spec_path: str | None, launcher: str = "local") -> str:
    """The PATH a rank gets, unless the spec sets one (``env.PATH``, a node's
    ``env.PATH``):

    - ``local``: like torchrun, which runs scripts with its own interpreter, ``python``
      in a command means the worker's environment (its interpreter's folder first);
    - ``ssh``: the node's own PATH (its login environment): empty here, the shim fills
      it in on the node, so nothing of the controller's machine reaches the node;
    - ``slurm``: the worker's ``PATH`` as it is, which ``srun`` exports to the task as
      it would from a shell, without the worker's interpreter put first.
    """
    if spec_path is not None:
        return spec_path
    if launcher == "ssh":
        return ""
    if launcher == "slurm":
        return os.environ.get("PATH", "/usr/bin:/bin")
    return os.pathsep.join(
        [str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]
    )


def rank_paths(
    spec: JobSpec, node: NodeSpec, source: Mapping[str, str], import_root: Path | None
) -> dict[str, str]:
    """PATH and PYTHONPATH of a rank on ``node`` ("": not set, the node's own): the
    spec's (the node's ``env`` over the job's), else :func:`rank_search_path`'s rule,
    and PYTHONPATH with Lazarus's checkout (``import_root``) first on local nodes only.
    Never the controller's site-packages; ssh and Slurm nodes bring ``lazarus-rank``
    in their own environment, so no path of the controller's machine reaches them."""
    own = {**spec.env, **node.env}
    local = node.launcher == "local"
    extra = own.get("PYTHONPATH") or (source.get("PYTHONPATH") if local else None)
    root = str(import_root) if import_root is not None and local else None
    return {
        "PATH": rank_search_path(own.get("PATH"), node.launcher),
        "PYTHONPATH": os.pathsep.join(filter(None, [root, extra])),
    }
