"""``python -m bench scale`` end to end, small: a real dev server, a real worker and
the real supervise activity on 50 simulated nodes; a crash and a silent node are
each detected, and every figure comes out. No timing is asserted: speed is the
bench's to report."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.scale import ScaleConfig, markdown, measure


@pytest.mark.timeout(300)
def test_fifty_simulated_nodes_one_crash_and_one_silent_node_are_detected(
    tmp_path: Path,
) -> None:
    config = ScaleConfig(nodes=(50,), trials=1, steady_s=2.0, report_interval_s=1.0)
    [result] = asyncio.run(measure(config, tmp_path))
    assert result.missed == []
    assert len(result.crash_e2e_s) == 1 and len(result.silent_e2e_s) == 1
    figures = result.figures()
    assert all(figures[name] is not None for name in figures)
    assert figures["ranks"] == 50 * config.ranks_per_node
    assert result.history_events_per_report > 0 and result.cpu_cores > 0
    assert "| 50 |" in markdown([figures])
