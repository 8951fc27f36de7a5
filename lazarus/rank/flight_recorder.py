"""Dump the collective flight recorder when the controller asks (issue 38).

:mod:`lazarus.domain.flight_recorder` says why. Here: a daemon thread, started by
:func:`lazarus.rank.torch.init_process_group`, that looks at the generation's
:data:`~lazarus.domain.flight_recorder.REQUEST_FILE` every :data:`POLL_INTERVAL_S`
(one ``stat``) and, when its content is new, writes torch's flight-recorder dump as
JSON to ``<generation>/flight-recorder/rank-<r>.json``. It runs while the training
thread waits in a collective (the wait releases the GIL), which is exactly when the
dump matters. The generation directory is read from the heartbeat file's variable at
every look, so a rank that rejoined a newer generation answers there.

torch is imported by the caller, never here at import time: :mod:`lazarus.rank`
stays importable without it.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from lazarus.domain import environment
from lazarus.domain.flight_recorder import (
    BUFFER_ENTRIES,
    DUMP_DIR,
    NCCL_DUMP_PREFIX,
    REQUEST_FILE,
    dump_name,
    ready_name,
)
from lazarus.rank.atomic_files import _atomic_write
from lazarus.rank.identity import info

POLL_INTERVAL_S = 0.25
"""How often the watcher looks for a request: a hang's evidence waits about this long."""

_watcher: threading.Thread | None = None
_answered: tuple[str, bytes] | None = None
"""(generation directory, request) last answered: each request is answered once."""
_ready_in: str | None = None
"""The generation directory this watcher announced itself in."""


def configure() -> None:
    """Before the process group exists (torch reads these when it creates one): the
    recorder's buffer, and on NCCL its dump at a watchdog timeout into the generation
    directory. A value the environment already has wins."""
    heartbeat = os.environ.get(environment.HEARTBEAT_FILE)
    if not heartbeat:
        return
    buffer = str(BUFFER_ENTRIES)
    if "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ:  # the older name, deprecated
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", buffer)
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    prefix = str(Path(heartbeat).parent / NCCL_DUMP_PREFIX)
    os.environ.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", prefix)


def start_watch() -> None:
    """Start the watcher once per process (idempotent); a no-op outside Lazarus."""
    global _watcher
    if _watcher is not None or not os.environ.get(environment.HEARTBEAT_FILE):
        return
    _watcher = threading.Thread(target=_watch, name="lazarus-flight-recorder", daemon=True)
    _watcher.start()


def _watch() -> None:
    stop = threading.Event()
    while not stop.wait(POLL_INTERVAL_S):
        try:
            answer_request()
        except Exception as exc:  # a dump must never disturb training
            print(f"lazarus.rank: flight recorder dump failed: {exc}", file=sys.stderr)


def answer_request() -> Path | None:
    """Dump once for a new request in this generation's directory; the dump's path.
    Announces the watcher in each generation it serves first (:func:`ready_name`)."""
    global _answered, _ready_in
    heartbeat = os.environ.get(environment.HEARTBEAT_FILE)
    if not heartbeat:
        return None
    generation_dir = Path(heartbeat).parent
    if _ready_in != str(generation_dir):
        (generation_dir / DUMP_DIR).mkdir(mode=0o700, exist_ok=True)
        (generation_dir / DUMP_DIR / ready_name(info().rank)).touch()
        _ready_in = str(generation_dir)
    try:
        request = (generation_dir / REQUEST_FILE).read_bytes()
    except OSError:
        return None
    if _answered == (str(generation_dir), request):
        return None
    _answered = (str(generation_dir), request)
    from torch._C import _distributed_c10d  # the caller imported torch already

    dump = getattr(_distributed_c10d, "_dump_fr_trace_json", None)  # not in every build
    if dump is None:
        return None
    raw = dump(True, False)
    target = generation_dir / DUMP_DIR / dump_name(info().rank)
    target.parent.mkdir(mode=0o700, exist_ok=True)
    _atomic_write(target, raw, durable=False)
    return target
