"""The job spec's JSON Schema: the committed ``docs/reference/job-spec.schema.json`` is
what :mod:`lazarus.domain.spec_schema` writes now, ``lazarus spec schema`` prints it, and
it agrees with ``JobSpec`` on the example specs and on the mistakes an editor should
flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from lazarus.app import cli
from lazarus.domain import spec_schema
from lazarus.domain.spec import JobSpec

pytestmark = pytest.mark.timeout(30)

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "docs" / "reference" / "job-spec.schema.json"
EXAMPLES = sorted((REPO / "examples" / "jobs").glob("*.yaml"))


def _validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    schema = spec_schema.job_spec_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_committed_schema_is_current() -> None:
    assert COMMITTED.exists() and COMMITTED.read_text() == spec_schema.render(), (
        f"docs/reference/job-spec.schema.json is stale; regenerate it: {spec_schema.COMMAND}"
    )


def test_the_cli_prints_the_schema() -> None:
    result = CliRunner().invoke(cli.app, ["spec", "schema"])
    assert result.exit_code == 0, result.output
    assert result.output == spec_schema.render()
    compact = CliRunner().invoke(cli.app, ["spec", "schema", "--compact"])
    assert json.loads(compact.output) == json.loads(result.output)
    assert len(compact.output.splitlines()) == 1


def test_fields_carry_their_descriptions() -> None:
    schema = spec_schema.job_spec_schema()
    assert schema["$schema"].endswith("2020-12/schema")
    assert "list of arguments" in schema["properties"]["command"]["description"] or (
        "YAML list" in schema["properties"]["command"]["description"]
    )
    health = schema["$defs"]["HealthSpec"]["properties"]
    assert health["hang_timeout_s"]["description"]
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_spec_is_valid_under_the_schema(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    JobSpec.model_validate(data)  # the model takes it ...
    assert [e.message for e in _validator().iter_errors(data)] == []  # ... and so does the schema


@pytest.mark.parametrize(
    ("patch", "flagged"),
    [
        ({"health": {"hang_timout_s": 10}}, "hang_timout_s"),
        ({"health": {"hang_timeout_s": "ten"}}, "ten"),
        ({"health": {"hang_timeout_s": -5}}, "-5"),
        ({"command": "python train.py"}, "python train.py"),
        ({"nodes": [{"launcher": "sssh"}]}, "sssh"),
    ],
)
def test_the_schema_flags_what_the_model_refuses(patch: dict[str, Any], flagged: str) -> None:
    data = {"name": "demo", "command": ["python", "train.py"], **patch}
    with pytest.raises(ValueError):
        JobSpec.model_validate(data)
    errors = [e.message for e in _validator().iter_errors(data)]
    assert errors and any(flagged in message for message in errors), errors


def test_the_fleet_shorthand_is_accepted() -> None:
    data = {"name": "demo", "command": ["python", "train.py"], "fleet": "gpu-pool"}
    JobSpec.model_validate(data)
    assert list(_validator().iter_errors(data)) == []
