"""Every example job spec parses: an example that drifts from the spec is a broken
first impression (``lazarus start examples/jobs/...`` from the README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lazarus.domain.spec import load_spec

EXAMPLES = sorted((Path(__file__).parents[2] / "examples" / "jobs").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_spec_parses(path: Path) -> None:
    spec = load_spec(path)
    assert spec.name == path.stem.replace("_", "-")


def test_the_rejoin_example_opts_in() -> None:
    spec = load_spec(Path(__file__).parents[2] / "examples" / "jobs" / "ddp_survivors.yaml")
    assert spec.rejoins is not None and "--resilient" in spec.command
    assert spec.checkpoints.memory_every_steps == 1 and spec.warm is not None
