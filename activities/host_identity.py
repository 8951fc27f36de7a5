"""Which machine this worker is, as the job routing names it.

A worker polls ``<task_queue>@<host>`` beside its task queue, and the launch
activity reports the same host, so that a local job's machine-bound activities
follow its ranks (``workflows.routing``). Both ask this one function, so they
cannot disagree. ``LAZARUS_HOST`` overrides the system host name: containers whose
host name changes with each restart, or a spec whose local nodes name the machine
differently (``host: gpu-box-3.example.com``).
"""

from __future__ import annotations

import os
import socket

HOST_ENV = "LAZARUS_HOST"


def this_host() -> str:
    """``LAZARUS_HOST`` if set, else the system host name."""
    return os.environ.get(HOST_ENV, "").strip() or socket.gethostname()
