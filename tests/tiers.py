"""Which of the suite's long matrices run: ``LAZARUS_TEST_ALL=1`` (``make test-all``).

``make test`` stays under 20 minutes on 2 cores by running one case of each long
matrix whose other cases add no new product path (each benchmark scenario beyond a
smoke, each kind of checkpoint damage end to end): the others are covered by faster
tests or by ``make bench``, and ``make test-all`` runs them all here as well.
"""

from __future__ import annotations

import os

ALL = os.environ.get("LAZARUS_TEST_ALL", "") not in ("", "0")
