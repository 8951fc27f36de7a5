"""Where a run's memory checkpoint tier lives on every node: one function, both floors.

The launcher sets it as ``LAZARUS_MEMORY_CHECKPOINT_DIR`` for every rank, the
checkpoint search lists it on every relaunch node, and the end of a run removes it.
The workflow computes it too (to pass it to the search), so it lives on the domain
floor, free of I/O: a path derived from the job and the run, never looked up.

Per run, not per job: a job started again (a new run) must never resume from an
earlier run's snapshots, which a crashed controller may have left in tmpfs; the disk
tier is where checkpoints survive from one run to the next.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from lazarus.domain import environment

MEMORY_ROOT = "/dev/shm/lazarus"
"""The tier's *logical* root: the same on every node, so one resume path serves
every node, and computable by the workflow, which knows no user ids. Nothing is ever
written there: each node maps it to the private root of the user its ranks run as
(:func:`on_node`), at the last moment, where the files are touched."""
PRIVATE_ROOT_PREFIX = "/dev/shm/lazarus-"
"""``/dev/shm/lazarus-<uid>``: tmpfs, which survives a process's death, not a node's.
One root per user, created 0700 and refused unless its owner is that user: on a
shared node (a Slurm partition, a fleet host) no other user can read a job's model
and optimizer state there, plant a forged snapshot, or swap a directory for a
symlink. ``/dev/shm`` is sticky, so nobody else can rename or remove the root
once it is ours; a user who squats the name only turns the tier off for us (the
rank says why, and disk serves)."""
LEGACY_RUN_KEY = "_"
"""The run key of a job without run directories (``run_root`` is the job directory)."""


def memory_checkpoint_dir(job_id: str, run_root: str | None, root: str = MEMORY_ROOT) -> str:
    """``<root>/<job_id>/<run key>``, the run key being the last part of ``run_root``
    (``<run_dir>/<job_id>/<run_key>``, as in ``LaunchRequest.run_root``); None (the
    legacy layout, generations straight under the job directory) gives ``_``.

    ``job_id`` is a job name (letters, digits, ``._-``), so it is one path component;
    a run key is the workflow's own id, checked here all the same, because the result
    is deleted recursively at the end of a run."""
    run_key = PurePosixPath(run_root).name if run_root is not None else LEGACY_RUN_KEY
    for what, part in (("job id", job_id), ("run key", run_key)):
        if part in ("", ".", "..") or "/" in part or "\x00" in part:
            raise ValueError(f"memory checkpoint dir: {what} {part!r} is not one path component")
    return str(PurePosixPath(root) / job_id / run_key)


def private_root(uid: int) -> str:
    """The memory tier's root for the user ``uid`` on any node."""
    return f"{PRIVATE_ROOT_PREFIX}{uid}"


def on_node(path: str, uid: int) -> str:
    """``path`` under the logical root, as it lies on a node whose ranks run as
    ``uid``; any other path (already mapped, or not the tier's) unchanged."""
    logical = PurePosixPath(path)
    if not logical.is_relative_to(MEMORY_ROOT):
        return path
    return str(PurePosixPath(private_root(uid)) / logical.relative_to(MEMORY_ROOT))


def environment_on_node(env: dict[str, str], uid: int) -> dict[str, str]:
    """A rank's environment with the tier's paths (its directory, and a resume point
    in the tier) mapped by :func:`on_node`: a script that reads them itself, not
    through :mod:`lazarus.rank`, finds the files where they are."""
    mapped = dict(env)
    for name in (environment.MEMORY_CHECKPOINT_DIR, environment.RESUME_FROM):
        if mapped.get(name):
            mapped[name] = on_node(mapped[name], uid)
    return mapped
