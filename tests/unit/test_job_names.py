"""Issue 37, N6: a job's workflow id is ``lazarus-<name>`` and fleet ``<x>``'s is
``lazarus-fleet-<x>``, so a job named ``fleet-<x>`` would share fleet ``<x>``'s id
and its commands would act on the fleet. A new job may not take such a name; a job
started before the rule still decodes (its history replays)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lazarus.app.client import plan_start
from lazarus.domain.api import fleet_workflow_id, workflow_id_for
from lazarus.domain.spec import JobSpec, SpecError, load_spec, parse_spec
from workflows.state import JobInput

pytestmark = pytest.mark.timeout(30)


def _data(name: str, tmp_path: Path) -> dict[str, object]:
    return {"name": name, "command": ["python", "train.py"], "workdir": str(tmp_path)}


def test_the_collision_the_rule_rules_out() -> None:
    assert workflow_id_for("fleet-gpu") == fleet_workflow_id("gpu")


def test_a_spec_file_naming_a_job_fleet_something_is_refused_with_the_reason(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: fleet-gpu\ncommand: [python, train.py]\n")
    with pytest.raises(SpecError) as refused:
        load_spec(spec)
    (line,) = [ln for ln in refused.value.lines if ": name:" in ln]
    assert "may not start with 'fleet-'" in line and "fleet 'gpu'" in line, line
    spec.write_text("name: ok\ncommand: [python, train.py]\n")
    with pytest.raises(SpecError, match="fleet 'gpu'"):  # lazarus start --name fleet-gpu
        load_spec(spec, name_override="fleet-gpu")


def test_a_name_that_only_contains_fleet_is_fine(tmp_path: Path) -> None:
    for name in ("myfleet-gpu", "gpu-fleet-1", "fleet"):
        assert parse_spec(_data(name, tmp_path), "<test>").name == name


def test_the_python_api_refuses_it_too_and_an_old_input_still_decodes(tmp_path: Path) -> None:
    # What a history holds: the model accepts it, so a job started before the rule replays.
    old = JobSpec.model_validate(_data("fleet-gpu", tmp_path))
    assert (
        JobInput.model_validate_json(JobInput(spec=old).model_dump_json()).spec.name == "fleet-gpu"
    )
    with pytest.raises(SpecError, match="share its workflow id"):
        plan_start(old)
    with pytest.raises(SpecError, match="share its workflow id"):
        plan_start(JobInput(spec=old))
