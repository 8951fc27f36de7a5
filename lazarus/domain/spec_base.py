"""What every job spec model shares: the strict base (unknown fields refused, no
coercion, frozen), the job name pattern, and the check for repeated names."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

JOB_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"


def repeated(names: Iterable[str]) -> list[str]:
    """The names that occur more than once, sorted. Linear: node lists run to
    thousands, and these checks run every time a spec or fleet is read back."""
    return sorted(name for name, times in Counter(names).items() if times > 1)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
