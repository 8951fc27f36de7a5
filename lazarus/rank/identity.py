"""Who this rank is and where its checkpoints live: the environment the launcher
sets (:mod:`lazarus.domain.environment`), or torchrun's, or a single-process default;
and the checkpoint directory a script names outside Lazarus (:func:`configure`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lazarus.domain import environment


@dataclass(frozen=True)
class RankInfo:
    """Who this process is. Outside Lazarus the torchrun variables (or a
    single-process default) fill it, with ``job_id`` None and ``generation`` 0."""

    rank: int
    local_rank: int
    world_size: int
    generation: int
    job_id: str | None
    checkpoint_dir: Path | None
    under_lazarus: bool


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def _under_lazarus() -> bool:
    # The job id is set only by the Lazarus launcher, never by torchrun or a user.
    return bool(os.environ.get(environment.JOB_ID))


def info() -> RankInfo:
    """Read this rank's identity from the environment (re-read on every call, so
    tests and wrappers that change the environment see the change)."""
    rank = _env_int(environment.RANK, 0)
    return RankInfo(
        rank=rank,
        local_rank=_env_int(environment.LOCAL_RANK, rank),
        world_size=_env_int(environment.WORLD_SIZE, 1),
        generation=_env_int(environment.GENERATION, 0),
        job_id=os.environ.get(environment.JOB_ID) or None,
        checkpoint_dir=checkpoint_dir(),
        under_lazarus=_under_lazarus(),
    )


_configured_checkpoint_dir: Path | None = None


def configure(*, checkpoint_dir: str | os.PathLike[str] | None = None) -> None:
    """Name a checkpoint directory for runs outside Lazarus (e.g. from a
    ``--checkpoint-dir`` flag). Lazarus's own variable still wins, because the
    controller must decide where a job's checkpoints live."""
    global _configured_checkpoint_dir
    _configured_checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None


def checkpoint_dir() -> Path | None:
    """The root holding ``step-NNNNNNNN/`` directories, or None if nobody said."""
    from_env = os.environ.get(environment.CHECKPOINT_DIR)
    if from_env:
        return Path(from_env)
    return _configured_checkpoint_dir


def _generation_now() -> int:
    """The generation this rank acts for (``LAZARUS_GENERATION``; it changes when the
    rank rejoins in place); 0 when unset or malformed: a heartbeat never raises."""
    try:
        return _env_int(environment.GENERATION, 0)
    except ValueError:
        return 0


def _rank_now() -> int:
    try:
        return _env_int(environment.RANK, 0)
    except ValueError:
        return 0
