"""Which of the suite's long matrices run: ``LAZARUS_TEST_ALL=1`` (``make test-all``).

``make test`` aims at 20 minutes on 2 cores by running one case of each long matrix
whose other cases add no new product path (each benchmark scenario beyond a smoke,
each kind of checkpoint damage end to end), and by leaving to ``make test-all`` the
smoke tests of the benchmark harnesses whose product paths have tests of their own
(:func:`only_in_test_all`), and the costly twins of a product path that a cheaper test
in ``make test`` walks too (:func:`twin_of`: the same decision reached over ssh
rather than local nodes, or a second victim of the same kill). ``make test-all`` runs
everything; ``make bench`` runs the matrices in full.
"""

from __future__ import annotations

import os

import pytest

ALL = os.environ.get("LAZARUS_TEST_ALL", "") not in ("", "0")


def only_in_test_all(what: str) -> pytest.MarkDecorator:
    """Skip, saying where it runs, unless ``make test-all``: for a smoke test of a
    benchmark harness (``what``) that takes minutes and tests no product path that a
    test of ``make test`` does not."""
    return pytest.mark.skipif(not ALL, reason=f"{what}: runs in make test-all")


def twin_of(test: str, differs: str) -> pytest.MarkDecorator:
    """Skip, saying where it runs, unless ``make test-all``: a test that walks the same
    product path as ``test`` (which runs in ``make test``) and ``differs`` only in a
    setting that path does not branch on, at minutes of cost."""
    return pytest.mark.skipif(
        not ALL, reason=f"the path of {test}, {differs}: runs in make test-all"
    )
