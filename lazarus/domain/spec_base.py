"""What every job spec model shares: the strict base (unknown fields refused, no
coercion, frozen), the job name pattern, and the check for repeated names."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

JOB_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"

RESERVED_JOB_NAME_PREFIX = "fleet-"
"""Job names may not start with it: a job's workflow id is ``lazarus-<name>`` and fleet
``<x>``'s is ``lazarus-fleet-<x>``, so job ``fleet-<x>`` would be fleet ``<x>``'s id,
and a job command on it would act on the fleet (issue 37, N6). Refused where a new job
starts (a spec file, :func:`~lazarus.app.client.plan_start`), not by the model, so the
input of a job started before the rule still decodes and replays."""


def job_name_problem(name: str) -> str | None:
    """Why ``name`` may not name a new job, or None."""
    if name.startswith(RESERVED_JOB_NAME_PREFIX):
        fleet = name.removeprefix(RESERVED_JOB_NAME_PREFIX)
        return (
            f"a job name may not start with '{RESERVED_JOB_NAME_PREFIX}': job {name!r} would "
            f"share its workflow id (lazarus-{name}) with fleet {fleet!r}; choose another name"
        )
    return None


def repeated(names: Iterable[str]) -> list[str]:
    """The names that occur more than once, sorted. Linear: node lists run to
    thousands, and these checks run every time a spec or fleet is read back."""
    return sorted(name for name, times in Counter(names).items() if times > 1)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
