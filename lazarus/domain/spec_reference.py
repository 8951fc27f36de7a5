"""The job spec reference page, written from :class:`~lazarus.domain.spec.JobSpec`.

It only reads the models: each field's type, default and constraints from pydantic,
and its description from the attribute docstring under it (in ``spec.py``,
``spec_nodes.py`` or ``spec_sections.py``, wherever the model is defined). So the page
cannot drift from the code; ``tests/unit/test_docs.py`` fails when the committed page
differs from what this writes. Regenerate with::

    python -m lazarus.domain.spec_reference > docs/reference/job-spec.md
"""

from __future__ import annotations

import ast
import enum
import functools
import inspect
import itertools
import re
import sys
import types
import typing
from collections.abc import Iterator

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from lazarus.domain.spec import JobSpec

COMMAND = "python -m lazarus.domain.spec_reference > docs/reference/job-spec.md"


@functools.cache
def module_classes(module: str) -> dict[str, ast.ClassDef]:
    """The top-level classes of ``module``, parsed once."""
    tree = ast.parse(inspect.getsource(sys.modules[module]))
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def attribute_docs(model: type[BaseModel]) -> dict[str, str]:
    """The docstring under each field of ``model`` and its model bases, by field name."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        node = module_classes(cls.__module__).get(cls.__name__)
        if node is None:
            continue
        statements = node.body
        for here, after in itertools.pairwise(statements):
            if (
                isinstance(here, ast.AnnAssign)
                and isinstance(here.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[here.target.id] = after.value.value
    return docs


def prose(text: str) -> str:
    """Docstring text as one markdown line: RST roles and double backticks made plain."""
    text = re.sub(r":[a-z]+:`~?(?:[\w.]+\.)?([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    return " ".join(text.split())


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def models_in(annotation: object) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from models_in(arg)


def type_name(annotation: object) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(arg) for arg in args)
    if origin is typing.Literal:
        return " or ".join(f"`{arg!r}`".replace("'", '"') for arg in args)
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"map of {type_name(args[0])} to {type_name(args[1])}"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " or ".join(f"`{member.value}`" for member in annotation)
    if isinstance(annotation, type):
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation)


def constraints(field: FieldInfo) -> str:
    found: list[object] = list(field.metadata)

    def nested(annotation: object) -> None:
        if typing.get_origin(annotation) is typing.Annotated:
            for meta in typing.get_args(annotation)[1:]:
                found.extend(meta.metadata if isinstance(meta, FieldInfo) else [meta])
        for arg in typing.get_args(annotation):
            nested(arg)

    nested(field.annotation)
    words: list[str] = []
    for meta in found:
        for kind, attribute, symbol in (
            (annotated_types.Ge, "ge", "≥"),
            (annotated_types.Gt, "gt", ">"),
            (annotated_types.Le, "le", "≤"),
            (annotated_types.Lt, "lt", "<"),
        ):
            if isinstance(meta, kind):
                words.append(f"{symbol} {getattr(meta, attribute)}")
        if isinstance(meta, annotated_types.MinLen):
            words.append(f"at least {meta.min_length} item(s)")
        if isinstance(meta, annotated_types.MaxLen):
            words.append(f"at most {meta.max_length} items")
        pattern = getattr(meta, "pattern", None)
        if isinstance(pattern, str):
            words.append(f"matches `{pattern}`")
    return ", ".join(words)


def default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "**required**"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "its defaults"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return f"`{value.value}`"
    if isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
        return f"{len(value)} with defaults"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def section(model: type[BaseModel], used_by: list[str]) -> list[str]:
    docs = attribute_docs(model)
    lines = [f"## {model.__name__}", ""]
    if model.__doc__ and model is not JobSpec:
        lines += [prose(model.__doc__), ""]
    if used_by:
        lines += ["Used by: " + ", ".join(f"`{path}`" for path in used_by) + ".", ""]
    lines += [
        "| field | type | default | constraints | what it is |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, field in model.model_fields.items():
        lines.append(
            "| "
            + " | ".join(
                cell(text)
                for text in (
                    f"`{name}`",
                    type_name(field.annotation),
                    default(field),
                    constraints(field),
                    prose(docs.get(name, "")),
                )
            )
            + " |"
        )
    lines.append("")
    return lines


EDITOR_SECTION = [
    "## Checking a spec in your editor (JSON Schema)",
    "",
    "[`job-spec.schema.json`](job-spec.schema.json) is the JSON Schema of this page,",
    "generated from the same model (`lazarus spec schema` prints it; a unit test keeps",
    "the committed file current). With VS Code's YAML extension (`redhat.vscode-yaml`),",
    "or any editor that runs `yaml-language-server`, put a line at the top of a spec:",
    "",
    "```yaml",
    "# yaml-language-server: $schema=job-spec.schema.json",
    "name: my-job",
    "command: [python, train.py]",
    "```",
    "",
    "The path is relative to the spec (a URL works too); write the file there with",
    "`lazarus spec schema > job-spec.schema.json`, or point at this repository's copy.",
    "For every spec of a folder at once, map a glob in `.vscode/settings.json`:",
    "",
    "```json",
    '{"yaml.schemas": {"./job-spec.schema.json": ["jobs/*.yaml"]}}',
    "```",
    "",
    "The editor then flags unknown fields (`hang_timout_s`), wrong types and",
    "out-of-range values as you type, completes field names, and shows each field's",
    "description. It cannot check what needs your machine or several fields together (a",
    "`workdir` that does not exist, `slurm:` with local nodes): `lazarus start --dry-run`",
    "still does.",
    "",
]
"""The section on the JSON Schema (:mod:`lazarus.domain.spec_schema`), under the intro."""


def render() -> str:
    """The whole page, as committed in ``docs/reference/job-spec.md``."""
    order: list[type[BaseModel]] = [JobSpec]
    used_by: dict[type[BaseModel], list[str]] = {JobSpec: []}
    prefix: dict[type[BaseModel], str] = {JobSpec: ""}
    for model in order:
        for name, field in model.model_fields.items():
            for child in models_in(field.annotation):
                path = f"{prefix[model]}{name}"
                if child not in used_by:
                    order.append(child)
                    used_by[child] = []
                    prefix[child] = f"{path}."
                if path not in used_by[child]:
                    used_by[child].append(path)
    lines = [
        "# Job spec reference",
        "",
        "<!-- Generated from lazarus.domain.spec.JobSpec; do not edit by hand. -->",
        "",
        f"Generated from `lazarus.domain.spec.JobSpec` by `{COMMAND}`; do not edit it",
        "by hand. A spec is YAML; unknown fields are refused, and `lazarus start --dry-run`",
        "prints the resolved spec. An annotated example is in",
        "[guides/your-script.md](../guides/your-script.md#the-job-spec).",
        "",
        *EDITOR_SECTION,
    ]
    for model in order:
        lines += section(model, used_by[model])
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
