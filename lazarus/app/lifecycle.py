"""The one shape every resource Lazarus starts for tests, benches and demos shares:
``start()``, ``stop()``, and a ``with`` block that always stops what it started."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class StartStop:
    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """Must be idempotent and safe after a partial start: ``__exit__`` always calls it."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
