"""What the tests of the rigs (``infra/testhosts.py``, ``infra/slurm``) ask of /proc:
which processes are in a mount namespace, and where a filesystem is still mounted."""

from __future__ import annotations

import os
from pathlib import Path


def _alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def in_mount_namespace(namespace: str) -> list[int]:
    """PIDs (not zombies) on this machine whose mount namespace is ``namespace``
    (``mnt:[inode]``, as ``/proc/PID/ns/mnt`` reads)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "mnt") == namespace and _alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def mounted_anywhere(source: str) -> list[int]:
    """A PID for each mount namespace on this machine in which a filesystem whose
    source is ``source`` is mounted (empty: mounted nowhere)."""
    found: list[int] = []
    seen: set[str] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            namespace = os.readlink(entry / "ns" / "mnt")
            if namespace in seen:
                continue
            seen.add(namespace)
            fields = (entry / "mountinfo").read_text().split()
        except OSError:
            continue
        if source in fields:
            found.append(int(entry.name))
    return found
