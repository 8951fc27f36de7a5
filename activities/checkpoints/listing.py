"""Every checkpoint of a job, local and durable, for ``lazarus checkpoints``."""

from __future__ import annotations

from activities.checkpoints.storage import CheckpointStore, LocalStore, open_store
from activities.checkpoints.verify import Level, verify_in_store
from lazarus.domain.checkpoint_layout import COMMIT_MARKER
from lazarus.domain.checkpoint_views import CheckpointListing, TierState


def list_checkpoints(
    checkpoint_dir: str | None,
    durable_uri: str | None = None,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    hashes: bool = False,
) -> list[CheckpointListing]:
    """Newest first. ``hashes`` reads every local byte (and downloads durable ones);
    by default sizes are checked locally, sizes and recorded sha256 durably."""
    rows: dict[int, dict[str, object]] = {}
    tiers: list[tuple[str, CheckpointStore, Level]] = []
    if checkpoint_dir is not None:
        tiers.append(("local", LocalStore(checkpoint_dir), "hashes" if hashes else "sizes"))
    if durable_uri is not None:
        store = open_store(durable_uri, endpoint_url=endpoint_url, region=region)
        tiers.append(("durable", store, "hashes" if hashes else "metadata"))
    for tier, store, level in tiers:
        for step, name in store.steps():
            result = verify_in_store(store, name, level)
            marker_missing = store.stat(name, COMMIT_MARKER) is None
            state: TierState = (
                "verified" if result.ok else "uncommitted" if marker_missing else "corrupt"
            )
            row = rows.setdefault(step, {"step": step})
            row[tier] = state
            row[f"{tier}_path"] = result.path
            row[f"{tier}_problems"] = result.problems
            row["size_bytes"] = max(int(str(row.get("size_bytes", 0))), result.size_bytes)
            if row.get("time") is None:
                row["time"] = result.committed_at or _newest_mtime(store, name)
    verification = "sha256" if hashes else "sizes"
    return [
        CheckpointListing.model_validate({**rows[s], "verification": verification})
        for s in sorted(rows, reverse=True)
    ]


def _newest_mtime(store: CheckpointStore, name: str) -> float | None:
    if isinstance(store, LocalStore):
        try:
            return (store.path / name).stat().st_mtime
        except OSError:
            return None
    return None
