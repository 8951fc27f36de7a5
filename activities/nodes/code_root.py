"""Where ranks import Lazarus's own code from: a checkout, never a site-packages.

The launcher puts :func:`lazarus_code_root` first on every rank's PYTHONPATH; the
messages that meet a rank interpreter without the rank helper say
:data:`RANK_HELPER_INSTALL`. See ``docs/guides/your-script.md`` ("Installing the
rank helper").
"""

from __future__ import annotations

import site
from pathlib import Path

RANK_HELPER_INSTALL = (
    "install the rank helper into the job's environment: pip install lazarus-rank "
    "(from a checkout: pip install <checkout>/rank; standard library only)"
)
"""What to do when a rank's interpreter cannot import ``lazarus.rank``."""

ROOT = Path(__file__).resolve().parents[2]
"""The directory ``activities`` was imported from: a checkout, or a site-packages."""


def lazarus_code_root() -> Path | None:
    """The directory to put on every rank's PYTHONPATH: a source checkout of Lazarus,
    which holds Lazarus's own packages and nothing else, or None.

    Ranks run with the job's interpreter and environment only (issue 29): never the
    controller's site-packages, whose torch, numpy or pydantic would shadow the
    training image's own. So where Lazarus is installed (its packages sit in a
    ``site-packages`` beside every other distribution) nothing is added: the job's
    environment brings ``lazarus.rank`` itself (``pip install lazarus-rank``, standard
    library only), and the worker's own interpreter, which the local nodes' rank
    wrapper and zygote and a Slurm step's task run under, imports ``activities`` from
    its own installation.

    In a checkout (development, the tests, a worker run from the tree) the checkout
    is added, as before: a job's own venv then imports ``lazarus.rank`` without
    installing it, and what runs under the ranks' interpreter on an ssh node (the
    shim's ``warm`` and the zygote it starts, its ``rejoin``) imports Lazarus's code
    from it. ``warm`` and ``rejoin`` also import pydantic, from the job's environment
    only: without it a warm start is cold and says why
    (:func:`activities.nodes.shim_agent.no_warm_answer_reason`). A checkout holds no
    third-party package: the venv inside it (``.venv``) cannot be imported from it."""
    root = ROOT
    if not (root / "rank" / "pyproject.toml").is_file() or _is_site_directory(root):
        return None
    return root


def _is_site_directory(path: Path) -> bool:
    """A directory other distributions install into (never a rank's PYTHONPATH)."""
    if path.name in ("site-packages", "dist-packages"):
        return True
    sites = [*site.getsitepackages(), site.getusersitepackages()]
    return any(Path(p).resolve() == path for p in sites if p)
