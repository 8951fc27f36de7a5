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

MEMORY_ROOT = "/dev/shm/lazarus"
"""tmpfs on Linux: survives a process's death, not a node's. The same path on every
node, so one resume path serves every node."""
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
