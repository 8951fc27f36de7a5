"""``python -m tests.chaos``: the fault x phase chaos matrix, as a table and a JSON."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tests.chaos.matrix import add_options, run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos",
        description="the fault x phase chaos matrix: every cell's invariants, as a table",
    )
    add_options(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
