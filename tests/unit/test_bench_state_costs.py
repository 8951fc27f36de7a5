"""Smoke test of ``python -m bench state-costs``: it runs, writes its figures, and the
compact node form is the smaller one (bytes, not time: no speed is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.__main__ import main

pytestmark = pytest.mark.timeout(60)


def test_state_costs_quick_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "state-costs.json"
    assert main(["state-costs", "--quick", "--json-out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["nodes"] == 100
    assert row["node_list_compact_bytes"] * 4 < row["node_list_full_bytes"]
    for name in ("fleet_input_decode_s", "validator_scratch_copy_s", "name_check_linear_s"):
        assert row[name] >= 0.0, name
