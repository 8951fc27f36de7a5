"""Which program a rank runs, and the PATH it is found on.

Both the launcher (before it starts a generation) and preflight (on every node)
must agree on where ``python`` in a job's command comes from, so the rule lives
here, not in either of them.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from lazarus.domain.spec import JobSpec


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


def rank_search_path(spec_path: str | None) -> str:
    """Like torchrun, which runs scripts with its own interpreter: `python` in a command
    means the worker's environment, unless the spec sets PATH itself."""
    if spec_path is not None:
        return spec_path
    return os.pathsep.join(
        [str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]
    )
