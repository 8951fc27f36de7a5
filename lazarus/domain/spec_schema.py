"""The JSON Schema of a job spec, for editors: ``lazarus spec schema`` prints it and
``docs/reference/job-spec.schema.json`` is it, committed.

It is pydantic's validation schema of :class:`~lazarus.domain.spec.JobSpec`, with each
field's description taken from the docstring under it (as the reference page takes it,
:mod:`lazarus.domain.spec_reference`), and the one shorthand a before-validator accepts
added (``fleet: NAME`` for ``fleet: {name: NAME}``), so an editor never flags a spec
``lazarus start`` takes. It checks types, ranges and unknown fields as you type;
what needs the file system or other fields (a missing ``workdir``, ``slurm`` with local
nodes) is still ``lazarus start --dry-run``'s to say.
``tests/unit/test_spec_schema.py`` fails when the committed file is stale. Regenerate::

    python -m lazarus.domain.spec_schema > docs/reference/job-spec.schema.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

from pydantic import BaseModel

from lazarus.domain.spec import JobSpec
from lazarus.domain.spec_reference import attribute_docs, models_in, prose

COMMAND = "python -m lazarus.domain.spec_schema > docs/reference/job-spec.schema.json"
SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _models() -> list[type[BaseModel]]:
    """JobSpec and every model under it, each once."""
    order: list[type[BaseModel]] = [JobSpec]
    for model in order:
        for field in model.model_fields.values():
            order += [child for child in models_in(field.annotation) if child not in order]
    return order


def _describe(node: dict[str, Any], model: type[BaseModel]) -> None:
    docs = attribute_docs(model)
    if model.__doc__ and "description" in node:
        node["description"] = prose(model.__doc__)
    for name, prop in node.get("properties", {}).items():
        if name in docs:
            prop["description"] = prose(docs[name])
        prop.pop("title", None)  # "Hang Timeout S": noise next to the key itself


def job_spec_schema() -> dict[str, Any]:
    """The schema, as a JSON-ready dict."""
    schema = JobSpec.model_json_schema(mode="validation")
    definitions = schema.get("$defs", {})
    for model in _models():
        node = schema if model is JobSpec else definitions.get(model.__name__)
        if node is not None:
            _describe(node, model)
    fleet = schema["properties"]["fleet"]
    fleet["anyOf"].insert(0, {"type": "string", "description": "Short for {name: NAME}."})
    return {
        "$schema": SCHEMA_DIALECT,
        "title": "Lazarus job spec",
        **{key: value for key, value in schema.items() if key != "title"},
    }


def render() -> str:
    """The schema as committed: two-space JSON with a final newline."""
    return json.dumps(job_spec_schema(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
