"""Which program a rank runs, and the PATH it is found on.

Both the launcher (before it starts a generation) and preflight (on every node)
must agree on where ``python`` in a job's command comes from, so the rule lives
here, not in either of them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from activities.nodes.search_path import rank_search_path, resolve_program
from activities.nodes.ssh.config import rendezvous_host
from lazarus.domain.spec import JobSpec, NodeSpec

__all__ = ["rank_paths", "rank_search_path", "rendezvous_host", "resolve_program"]


def rank_paths(
    spec: JobSpec, node: NodeSpec, source: Mapping[str, str], import_root: Path | None
) -> dict[str, str]:
    """PATH and PYTHONPATH of a rank on ``node`` ("": not set, the node's own): the
    spec's (the node's ``env`` over the job's), else :func:`rank_search_path`'s rule,
    and PYTHONPATH with Lazarus's checkout (``import_root``) first on local nodes only.
    Never the controller's site-packages; ssh and Slurm nodes bring ``lazarus-rank``
    in their own environment, so no path of the controller's machine reaches them."""
    own = {**spec.env, **node.env}
    local = node.transport.runs_here
    extra = own.get("PYTHONPATH") or (source.get("PYTHONPATH") if local else None)
    root = str(import_root) if import_root is not None and local else None
    return {
        "PATH": rank_search_path(own.get("PATH"), node.launcher),
        "PYTHONPATH": os.pathsep.join(filter(None, [root, extra])),
    }
