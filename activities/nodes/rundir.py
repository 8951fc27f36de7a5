"""Layout of a job's run directory: the durable record that lets any worker re-attach.

Nothing about running ranks lives in worker memory. Every workflow run of a job owns
a run directory (``run_key`` is chosen by the workflow and kept across
continue-as-new), so starting a job again never adopts, or is fenced by, an earlier
run's files. Jobs started before run directories existed keep their generations
directly under ``<run_dir>/<job_id>`` (the legacy layout). Each generation owns a
folder::

    <run_dir>/<job_id>/<run_key>/gen-00003/
        plan.json              master port, chosen once so a retried launch reuses it
        launch.json            written when every rank has started: the launch is done
        rank-0.pid             wrapper pid, process group, rank pid, start ticks
        rank-0.log             the rank's stdout and stderr
        rank-0.heartbeat.json  written by ``lazarus.rank.heartbeat``
        rank-0.exit.json       written by the wrapper when the rank ends, controller or not
        control.json           checkpoint requests read by ``lazarus.rank.should_checkpoint``
        stopped.json           written by ``stop``: this generation was ended on purpose
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lazarus.domain import environment as env_names
from lazarus.domain.checkpoint_layout import TEMP_SUFFIX
from lazarus.domain.run_layout import GEN_DIR_PATTERN as _GEN_DIR
from lazarus.domain.run_layout import GenerationDir as GenerationDir  # the layout: pure
from lazarus.domain.run_layout import SrunFiles as SrunFiles
from lazarus.domain.run_layout import job_root as job_root


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Readers poll these files while they are written; a rename is never seen half-done."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    """None when the file is absent or (rarely, from a foreign writer) not yet valid."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def control_document(
    request_id: int,
    *,
    checkpoint_every_steps: int | None,
    memory_every_steps: int | None,
    then: str | None = None,
) -> dict[str, Any]:
    """A generation's ``control.json``: checkpoint request ``request_id`` (0: none, as
    the launcher writes it), ``then`` (``"hold"``: wait after committing it), and the
    checkpoint intervals. Every writer builds it here, because a rewrite without the
    interval keys would silently drop the ranks back to the environment's intervals
    (:mod:`lazarus.domain.environment`); None leaves a key out (the environment's, or
    the script's own, interval then applies)."""
    document: dict[str, Any] = {"checkpoint_request": request_id}
    if then is not None:
        document["then"] = then
    if checkpoint_every_steps is not None:
        document[env_names.CONTROL_CHECKPOINT_EVERY_STEPS] = checkpoint_every_steps
    if memory_every_steps is not None:
        document[env_names.CONTROL_MEMORY_EVERY_STEPS] = memory_every_steps
    return document


def generations(job_run_root: str | Path) -> list[GenerationDir]:
    """Every generation folder of a job, oldest first."""
    root = Path(job_run_root)
    if not root.is_dir():
        return []
    found = [GenerationDir(p) for p in root.iterdir() if p.is_dir() and _GEN_DIR.match(p.name)]
    return sorted(found, key=lambda g: g.generation)


def generations_below(root: str | Path, keep_generation: int | None = None) -> list[GenerationDir]:
    """The generations directly under ``root`` (but ``keep_generation``) and those of
    every run under it: given a job directory, everything the job ever launched on this
    machine, in any layout. What a stop of ``root`` must reach."""
    direct = [g for g in generations(root) if g.generation != keep_generation]
    return [*direct, *(g for run in runs(root) for g in generations(run))]


def runs(job_dir: str | Path) -> list[Path]:
    """The run directories of a job that hold at least one generation, least recently
    active first. The job directory itself (legacy generations) is not included."""
    root = Path(job_dir)
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.is_dir() and not p.name.startswith(".") and not _GEN_DIR.match(p.name)
        if generations(p)
    ]
    return sorted(found, key=_last_activity)


def latest_run(job_dir: str | Path) -> Path | None:
    """The run (or, for a legacy job, the job directory itself) whose generations were
    touched last: run keys are opaque ids, so recency is the only order they have. A
    generation directory's mtime moves with every heartbeat or pid file renamed into it.
    None when nothing under ``job_dir`` holds a generation."""
    root = Path(job_dir)
    candidates = [*runs(root), *([root] if generations(root) else [])]
    return max(candidates, key=_last_activity) if candidates else None


def _last_activity(root: Path) -> int:
    stamps = []
    for gen in generations(root):
        try:
            stamps.append(gen.path.stat().st_mtime_ns)
        except FileNotFoundError:
            continue
    return max(stamps, default=0)


@contextmanager
def generation_lock(gen: GenerationDir, timeout_s: float | None = None) -> Iterator[bool]:
    """Held by ``launch`` while it starts ranks and by ``stop`` before it signals, so a
    stop can never slip in between two rank starts and leave the later ones orphaned.

    Yields whether the lock is held: with ``timeout_s`` it gives up after that long
    (fencing another run must not wait forever on a lock a wedged launch holds)."""
    gen.path.mkdir(parents=True, exist_ok=True)
    with open(gen.lock_file, "a+") as handle:
        if timeout_s is None:
            fcntl.flock(handle, fcntl.LOCK_EX)
            held = True
        else:
            held = _try_lock(handle.fileno(), time.monotonic() + timeout_s)
        try:
            yield held
        finally:
            if held:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _try_lock(fd: int, deadline: float) -> bool:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
