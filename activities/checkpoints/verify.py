"""Is this checkpoint what its manifest says it is?

A checkpoint is trusted only when its ``COMMITTED`` marker exists, its
``manifest.json`` parses, and every file the manifest lists is there with the
recorded size and (unless ``hashes=False``) the recorded sha256. Each problem is
one line naming the file and what is wrong, so an incident can say exactly why
a checkpoint was passed over.

Pure I/O, no temporalio: the CLI uses it offline (``lazarus verify``).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from activities.checkpoints.storage import (
    CheckpointInputError,
    CheckpointStore,
    LocalStore,
    locate,
)
from lazarus.domain.checkpoint_layout import COMMIT_MARKER, MANIFEST, parse_step_dir, unsafe_relpath
from lazarus.domain.contracts import CheckpointVerification
from lazarus.domain.timeline import manifest_generation

Level = Literal["hashes", "metadata", "sizes"]
"""``hashes`` reads every byte; ``sizes`` checks sizes only; ``metadata`` (S3) also
compares the sha256 recorded on each object at upload with the manifest, which
costs one HEAD per file instead of a download."""

HASH_THREADS = 4
"""Files hashed in parallel (hashlib releases the GIL on large buffers)."""

__all__ = [
    "Level",
    "owner_problem",
    "read_manifest",
    "verify_checkpoint",
    "verify_in_store",
    "written_by_other_job",
]


def verify_checkpoint(
    target: str | Path,
    *,
    hashes: bool = True,
    expected_world_size: int | None = None,
    endpoint_url: str | None = None,
    region: str | None = None,
) -> CheckpointVerification:
    """Verify one checkpoint: a ``step-NNNNNNNN`` directory, or its ``s3://`` URI.

    Raises :class:`CheckpointInputError` when ``target`` names nothing (a path
    that does not exist, or a root rather than one checkpoint): that is bad
    input, not a corrupt checkpoint."""
    store, name = locate(str(target), endpoint_url=endpoint_url, region=region)
    if name is None:
        raise CheckpointInputError(
            f"{target}: not a checkpoint (expected a step-NNNNNNNN directory or URI)"
        )
    if not store.exists(name):
        raise CheckpointInputError(f"{store.location(name)}: no such checkpoint")
    return verify_in_store(
        store, name, "hashes" if hashes else "sizes", expected_world_size=expected_world_size
    )


def verify_directory(
    path: Path, *, step: int | None = None, hashes: bool = True
) -> CheckpointVerification:
    """Verify a directory whatever its name (a restore's temporary directory)."""
    return verify_in_store(
        LocalStore(path.parent), path.name, "hashes" if hashes else "sizes", step=step
    )


def read_manifest(store: CheckpointStore, name: str) -> tuple[dict[str, Any] | None, str | None]:
    """The parsed manifest, or None and the problem with it."""
    raw = store.read_small(name, MANIFEST)
    if raw is None:
        return None, f"{MANIFEST}: missing"
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"{MANIFEST}: not valid JSON ({exc})"
    if not isinstance(document, dict) or not isinstance(document.get("files"), dict):
        return None, f"{MANIFEST}: has no 'files' mapping"
    for relpath in document["files"]:
        reason = unsafe_relpath(relpath)
        if reason is not None:
            # Refused before anything is read or written through it: restore would
            # otherwise write wherever the entry points, as the worker's user.
            return None, f"{MANIFEST}: refused file path {relpath!r}: {reason}"
    return document, None


def owner_problem(store: CheckpointStore, name: str, job_id: str | None) -> str | None:
    """``"written by job X"`` when the manifest names a job other than ``job_id``.

    Two jobs sharing a directory (one spec started twice under ``--name``) must never
    resume from, nor delete, each other's checkpoints. A manifest without a job id
    (written outside Lazarus, or by an older helper) belongs to whoever reads it."""
    if job_id is None:
        return None
    manifest, _ = read_manifest(store, name)
    owner = manifest.get("job_id") if manifest is not None else None
    if isinstance(owner, str) and owner and owner != job_id:
        return f"written by job {owner}"
    return None


def written_by_other_job(path: Path, job_id: str | None) -> str | None:
    """:func:`owner_problem` for a local checkpoint directory."""
    return owner_problem(LocalStore(path.parent), path.name, job_id)


def verify_in_store(
    store: CheckpointStore,
    name: str,
    level: Level = "hashes",
    *,
    expected_world_size: int | None = None,
    step: int | None = None,
    require_marker: bool = True,
) -> CheckpointVerification:
    """Verify checkpoint ``name`` of ``store`` at ``level``; never raises for a bad
    checkpoint (store outages do raise). ``require_marker=False`` checks a copy
    before its marker is written (tiering and restore write it last)."""
    step = step if step is not None else parse_step_dir(name)
    location = store.location(name)
    problems: list[str] = []
    committed_at: float | None = None

    marker = store.read_small(name, COMMIT_MARKER)
    if marker is None and require_marker:
        problems.append(f"{COMMIT_MARKER}: missing (the save never finished, or was torn)")
    elif marker is not None:
        try:
            committed_at = float(json.loads(marker)["committed_at"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            committed_at = None  # an older or foreign marker: its presence is what counts

    manifest, manifest_problem = read_manifest(store, name)
    if manifest is None:
        problems.append(str(manifest_problem))
        return CheckpointVerification(
            step=step, path=location, ok=False, problems=problems, committed_at=committed_at
        )

    recorded_step = manifest.get("step")
    if step is None and isinstance(recorded_step, int):
        step = recorded_step
    elif isinstance(recorded_step, int) and recorded_step != step:
        problems.append(f"{MANIFEST}: records step {recorded_step}, but this is step {step}")
    world_size = manifest.get("world_size")
    world_size = world_size if isinstance(world_size, int) else None
    if expected_world_size is not None and world_size != expected_world_size:
        problems.append(
            f"{MANIFEST}: written by a world of {world_size} ranks, expected {expected_world_size}"
        )

    files: dict[str, Any] = manifest["files"]
    escaping = sorted(rel for rel in files if store.escapes(name, rel))
    if escaping:
        problems.extend(
            f"{rel}: refused: resolves outside the checkpoint (through a symlink)"
            for rel in escaping
        )
        return CheckpointVerification(
            step=step, path=location, ok=False, problems=problems, committed_at=committed_at
        )
    total = 0
    to_hash: list[tuple[str, str]] = []
    all_hashed = True
    for relpath, entry in sorted(files.items()):
        if not isinstance(entry, dict) or not isinstance(entry.get("size"), int):
            problems.append(f"{relpath}: manifest entry has no size")
            continue
        expected_size = int(entry["size"])
        expected_sha = entry.get("sha256")
        total += expected_size
        info = store.stat(name, relpath)
        if info is None:
            problems.append(f"{relpath}: missing")
            continue
        if info.size != expected_size:
            kind = "truncated" if info.size < expected_size else "too long"
            problems.append(
                f"{relpath}: {kind}: {info.size} bytes, the manifest says {expected_size}"
            )
            continue
        if not isinstance(expected_sha, str):
            all_hashed = False
            continue
        if level == "hashes":
            to_hash.append((relpath, expected_sha))
        elif level == "metadata" and info.sha256 is not None and info.sha256 != expected_sha:
            problems.append(
                f"{relpath}: stored sha256 {info.sha256[:12]}... differs from the "
                f"manifest's {expected_sha[:12]}..."
            )
    if level == "hashes" and to_hash:
        problems.extend(_hash_problems(store, name, to_hash))
    return CheckpointVerification(
        step=step,
        path=location,
        ok=not problems,
        problems=problems,
        hashed=level == "hashes" and all_hashed,
        files=len(files),
        size_bytes=total,
        world_size=world_size,
        committed_at=committed_at,
        generation=manifest_generation(manifest),
    )


def _hash_problems(store: CheckpointStore, name: str, files: list[tuple[str, str]]) -> list[str]:
    def check(item: tuple[str, str]) -> str | None:
        relpath, expected = item
        try:
            actual = store.sha256(name, relpath)
        except FileNotFoundError:
            return f"{relpath}: vanished while being verified"
        if actual != expected:
            return (
                f"{relpath}: sha256 mismatch (content changed): {actual[:12]}..., "
                f"the manifest says {expected[:12]}..."
            )
        return None

    if len(files) == 1:
        results = [check(files[0])]
    else:
        with ThreadPoolExecutor(min(HASH_THREADS, len(files))) as pool:
            results = list(pool.map(check, files))
    return [r for r in results if r is not None]
