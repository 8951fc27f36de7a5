"""Every benchmark scenario: the modules that register them, imported here.

A scenario module registers its scenarios with :mod:`bench.registry` when it is
imported. The registry cannot import them itself (they import it: a circle), so
this module, which nothing in ``bench`` imports back, is where the list of
scenario modules lives. Add a new scenario module here.
"""

from __future__ import annotations

# Imported to register their scenarios.
import bench.peers.scenarios
import bench.peers.scenarios_multinode
import bench.peers.soak  # files the peers' soak drivers (bench.soak.PEER_SOAKS)
import bench.scenarios
import bench.scenarios_ha
import bench.scenarios_multinode
import bench.scenarios_multinode_compare
import bench.scenarios_slurm
from bench.registry import SCENARIOS, Scenario

# After every scenario is registered: why each peer does not run the rest.
bench.peers.scenarios.mark_not_run()


def load() -> dict[str, Scenario]:
    """Every registered scenario, by name."""
    return SCENARIOS
