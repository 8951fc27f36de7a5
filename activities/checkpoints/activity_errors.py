"""How checkpoint failures reach Temporal: final, or retried.

A corrupt checkpoint or a bad request will fail the same way on every attempt,
so it fails the activity for good and the workflow picks another checkpoint; a
store that cannot be reached may come back, so that failure is retried.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from temporalio.exceptions import ApplicationError

from activities.checkpoints.storage import (
    CheckpointCorrupt,
    CheckpointInputError,
    store_errors,
)


@contextlib.contextmanager
def as_activity_errors(unavailable: str) -> Iterator[None]:
    """Map checkpoint failures onto what Temporal should do with them: a corrupt
    checkpoint or a bad request fails for good; a store that cannot be reached
    (``unavailable`` says which) is retried."""
    try:
        yield
    except CheckpointCorrupt as exc:
        raise ApplicationError(
            str(exc), exc.problems, type="CheckpointCorrupt", non_retryable=True
        ) from exc
    except CheckpointInputError as exc:
        raise ApplicationError(str(exc), type="CheckpointInputError", non_retryable=True) from exc
    except store_errors() as exc:
        raise ApplicationError(f"{unavailable}: {exc}", type="DurableStoreUnavailable") from exc
