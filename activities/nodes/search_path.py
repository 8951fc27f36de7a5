"""The PATH a rank gets on a node, unless the spec sets one (each launcher's rule),
and where the command's program comes from on this machine."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from lazarus.domain.spec import JobSpec

__all__ = ["rank_search_path", "resolve_program"]


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
