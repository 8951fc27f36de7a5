"""Secrets for ranks that never enter workflow history: ``pass_env`` and ``env_from_file``.

The spec is the workflow's input, so it is stored in Temporal history and shown in
the Web UI; it names secrets but never holds them. ``pass_env`` names variables whose
values come from the worker's own environment when a generation is launched.
``env_from_file`` names a ``KEY=VALUE`` file read where the ranks run: here for local
nodes, by the shim on ssh nodes (``shim.sh`` parses the same format). A file that
anyone but its owner can read is refused, as ssh refuses such a private key: a secret
in a world-readable file is not a secret.

The other way round, the worker's own credentials are not for what it starts:
:func:`without_worker_secrets` removes them from the environment of ranks, of the
preflight health command, and of the Slurm commands (``srun`` exports its
environment to the node).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from lazarus.domain.environment import TEMPORAL_API_KEY
from lazarus.rank.env_file import EnvFileError, parse_env_lines, read_env_file

__all__ = [
    "WORKER_SECRETS",
    "SecretEnvError",
    "parse_env_lines",
    "passed_env",
    "read_env_file",
    "without_worker_secrets",
]

WORKER_SECRETS = frozenset({TEMPORAL_API_KEY})
"""The worker's own credentials (its Temporal API key): a job's programs never get
them. With the key, a rank or a health command could start, signal or terminate any
workflow of the namespace."""


SecretEnvError = EnvFileError
"""A secret the launch cannot supply; the message names the variable or file. The
class :mod:`lazarus.rank.env_file` raises too (it reads ``env_from_file`` on Slurm
nodes, under the node's own interpreter)."""


def without_worker_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without :data:`WORKER_SECRETS`, for a program the worker starts."""
    return {k: v for k, v in env.items() if k not in WORKER_SECRETS}


def passed_env(names: Sequence[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values of ``pass_env`` from this worker's environment, or raise naming the
    missing ones (a rank started without its API key fails far less clearly)."""
    source = os.environ if environ is None else environ
    missing = [name for name in names if name not in source]
    if missing:
        raise SecretEnvError(
            f"pass_env: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set "
            "in the worker's environment; set it where 'lazarus worker' runs and restart the "
            "worker (the value is read there at each launch, never stored in the job)"
        )
    return {name: source[name] for name in names}
