"""Every benchmark scenario: the modules that register them, imported here.

A scenario module registers its scenarios with :mod:`bench.registry` when it is
imported. The registry cannot import them itself (they import it: a circle), so
this module, which nothing in ``bench`` imports back, is where the list of
scenario modules lives. Add a new scenario module here.
"""

from __future__ import annotations

import bench.scenarios
import bench.scenarios_ha
import bench.scenarios_multinode
import bench.scenarios_multinode_compare
import bench.scenarios_slurm  # noqa: F401 - imported to register their scenarios
from bench.registry import SCENARIOS, Scenario


def load() -> dict[str, Scenario]:
    """Every registered scenario, by name."""
    return SCENARIOS
