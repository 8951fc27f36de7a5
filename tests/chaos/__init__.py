"""The fault x phase chaos matrix: a test suite of its own, run as a program.

``python -m tests.chaos`` (``make test-chaos``) runs every cell, or ``--cells``
(``smoke``, ``local``, or fault@phase keys), on the benchmark harness and prints the
table; ``make test`` runs two smoke cells and ``make test-all`` every local cell
(``tests/e2e/test_chaos_smoke.py``), the netns tier one cross-node cell. Docs:
``docs/chaos.md``.

- :mod:`~tests.chaos.matrix`: the faults, the phases, the cells (generated from one
  table where a fault differs only by its signal) and the run;
- :mod:`~tests.chaos.cell`: a cell's types and shared injections;
- :mod:`~tests.chaos.invariants`: the judge;
- :mod:`~tests.chaos.points`: the chaos points, from the outside;
- :mod:`~tests.chaos.multinode`, :mod:`~tests.chaos.fleet`, :mod:`~tests.chaos.s3`:
  the cross-node cells, the fleet row's checks, the S3 stand-in.
"""
