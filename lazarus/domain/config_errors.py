"""Validation errors of a YAML file a person wrote, as sentences that person can act on.

A job spec and a fleet config are both strict pydantic models read from YAML. Pydantic's
own wording (``Input should be a valid list``, ``Input should be greater than or equal
to 2``) names Python's types and hides what the file said; here each error becomes one
line, ``file: field.path: what is wrong; got what (line N)``, where:

- the value is described as YAML read it (``the text 'ten'``, ``the number 60``), since
  a YAML surprise (an unquoted ``on``, a number where text is wanted) is the usual cause;
- a hint is given only when it is true of this value: "remove the quotes" only where the
  unquoted text would be the number wanted, "quote it" only for what YAML read as a
  number or a boolean;
- a suggested rewrite parses as it stands (:func:`flow_list` quotes what YAML would not
  read back as text);
- bounds say what was given (``must be at least 2 (seconds); got -5``);
- the line comes from the YAML's node marks, also for a model-wide check whose message
  names its field first (``nodes/spares: ...``).

Both :func:`lazarus.domain.spec.parse_spec` and the fleet config loader use it, so the
two files fail alike.
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
from collections.abc import Callable, Sequence
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

LineOf = Callable[[tuple[int | str, ...]], int | None]
"""The line (1-based) of the YAML that a field path came from, when known."""

_LEADING_FIELDS = re.compile(r"^([A-Za-z_][\w.\[\]]*(?:/[A-Za-z_][\w.\[\]]*)*):\s")
"""A model-wide check's message that names its field(s) first: ``nodes/spares: ...``."""


def no_lines(loc: tuple[int | str, ...]) -> int | None:
    """A :data:`LineOf` for data that did not come from a file."""
    return None


def yaml_lines(text: str) -> LineOf:
    """Line numbers for error lines, from the YAML's node marks (``yaml.compose``):
    the key's line for a mapping entry, the element's for a list element. A path the
    document does not hold (a missing field, a model-wide check) has none."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return no_lines

    def line_of(loc: tuple[int | str, ...]) -> int | None:
        node: yaml.Node | None = root
        mark: yaml.Mark | None = None
        for item in loc:
            if isinstance(node, yaml.MappingNode) and isinstance(item, str):
                entry = next((kv for kv in node.value if kv[0].value == item), None)
                if entry is None:
                    return None
                mark, node = entry[0].start_mark, entry[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(item, int):
                if item >= len(node.value):
                    return None
                node = node.value[item]
                mark = node.start_mark
            else:
                return None
        return None if mark is None else mark.line + 1

    return line_of


def flow_list(items: Sequence[str]) -> str:
    """``items`` as a YAML flow list that reads back as exactly these strings: an item
    YAML would read as something else (``60``, ``on``, ``a, b``, ``#x``) is written
    double-quoted (a JSON string is a YAML double-quoted scalar)."""

    def one(item: str) -> str:
        try:
            if item and yaml.safe_load(f"[{item}]") == [item]:
                return item
        except yaml.YAMLError:
            pass
        return json.dumps(item, ensure_ascii=False)

    return "[" + ", ".join(one(item) for item in items) + "]"


def field_path(loc: Sequence[int | str]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts) or "(top level)"


def described(value: object) -> str:
    """What YAML made of a value, in the user's words (not Python's type names)."""
    if isinstance(value, bool):
        return f"true/false ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the text {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if value is None:
        return "an empty value"
    return type(value).__name__


def error_lines(
    exc: ValidationError,
    source: str,
    root: type[BaseModel],
    line_of: LineOf = no_lines,
    noun: str = "job",
) -> list[str]:
    """One ``source: field: why (line N)`` line per error of ``root``'s validation, in
    the order of the file's lines (those without a line last); ``noun`` is what the
    file's ``name`` names (job, fleet)."""
    numbered: list[tuple[int | None, str]] = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        message = _message(dict(error), root, noun)
        field = field_path(loc)
        line = line_of(loc) if loc else None
        named = _LEADING_FIELDS.match(message) if not loc else None
        if named is not None:  # a model-wide check: its message names the field
            field, message = named.group(1), message[named.end() :]
            line = field_line(field, line_of)
        numbered.append((line, f"{source}: {field}: {message}{with_line(line)}"))
    return [text for _, text in sorted(numbered, key=lambda n: (n[0] is None, n[0] or 0))]


def with_line(line: int | None) -> str:
    return f" (line {line})" if line is not None else ""


def field_line(fields: str, line_of: LineOf) -> int | None:
    """The line of the first of ``a.b/c`` that the file holds."""
    for field in fields.split("/"):
        loc = tuple(
            int(part) if part.isdigit() else part for part in re.findall(r"[^.\[\]]+", field)
        )
        line = line_of(loc)
        if line is not None:
            return line
    return None


def _model_in(annotation: object) -> type[BaseModel] | None:
    """The model a field holds (itself, or inside ``X | None``, ``list[X]``, ``dict[str, X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _known_fields(loc: tuple[int | str, ...], root: type[BaseModel]) -> list[str]:
    """The field names a spelling at ``loc`` may have meant: the fields of the model
    that holds it (empty where the path leaves the models, e.g. a playbook class)."""
    model: type[BaseModel] | None = root
    for item in loc[:-1]:
        if isinstance(item, int):
            continue  # a list element: the list's model holds the next name
        field = model.model_fields.get(item) if model is not None else None
        if field is None:
            return []
        model = _model_in(field.annotation)
    return list(model.model_fields) if model is not None else []


def did_you_mean(word: object, choices: list[str]) -> str:
    close = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _quote_hint(value: object) -> str:
    if isinstance(value, bool):
        return (
            '; YAML reads an unquoted yes/no/on/off/true/false as true/false: quote it, e.g. "on"'
        )
    if isinstance(value, (int, float)):
        return f'; YAML read {value!r} as a number: quote it, e.g. "{value}"'
    if value is None:
        return '; YAML read an empty value (or ~/null): give one, quoted if needed, e.g. ""'
    return ""


def _unquote_hint(value: object, wanted: tuple[type, ...]) -> str:
    """ "remove the quotes", only for text that unquoted would be what is wanted (the
    file quoted ``"10"``); an unquoted word (``ten``) gets no such advice."""
    if not isinstance(value, str):
        return ""
    try:
        bare = yaml.safe_load(value)
    except yaml.YAMLError:
        return ""
    if isinstance(bare, wanted) and (bool in wanted or not isinstance(bare, bool)):
        return f"; remove the quotes: {value} (YAML reads quoted text as text)"
    return ""


_BOUNDS = {
    "greater_than_equal": ("ge", "at least {}"),
    "greater_than": ("gt", "more than {}"),
    "less_than_equal": ("le", "at most {}"),
    "less_than": ("lt", "less than {}"),
    "too_short": ("min_length", "at least {} long"),
    "too_long": ("max_length", "at most {} long"),
}


def _bound(kind: str, err: dict[str, Any], loc: tuple[int | str, ...]) -> str | None:
    """``must be at least 2 (seconds); got -5`` for a value out of its range."""
    if kind not in _BOUNDS:
        return None
    key, words = _BOUNDS[kind]
    ctx = err.get("ctx")
    limit = ctx.get(key) if isinstance(ctx, dict) else None
    if limit is None:
        return None
    value = err.get("input")
    if kind in ("too_short", "too_long"):
        unit = " item(s)" if isinstance(value, (list, dict)) else " character(s)"
        got = f"{len(value)}" if isinstance(value, (list, dict, str)) else described(value)
        return f"must be {words.format(f'{limit}{unit}')}; got {got}"
    last = loc[-1] if loc else ""
    unit = " (seconds)" if isinstance(last, str) and last.endswith("_s") else ""
    shown = f"{limit:g}" if isinstance(limit, float) else str(limit)
    return f"must be {words.format(shown)}{unit}; got {value!r}"


def _message(err: dict[str, Any], root: type[BaseModel], noun: str) -> str:
    """One plain sentence per pydantic error: what was expected, what YAML gave, how
    to write it, instead of pydantic's own text (``Input should be a valid list``)."""
    kind = str(err.get("type"))
    msg = str(err.get("msg", "invalid"))
    raw_loc = err.get("loc")
    loc: tuple[int | str, ...] = tuple(raw_loc) if isinstance(raw_loc, tuple) else ()
    value = err.get("input")
    last = loc[-1] if loc else ""
    if kind == "extra_forbidden":
        hint = did_you_mean(last, _known_fields(loc, root)) if loc else ""
        return "unknown field" + (hint or "; check the spelling against the documented spec")
    if kind == "missing":
        return "required field is missing"
    if kind == "list_type" and str(last).endswith("command") and isinstance(value, str):
        words = shlex.split(value) if _splits(value) else value.split()
        return (
            "must be a list of arguments, e.g. [python, train.py]; YAML read the single "
            f"string {value!r}: write it as {flow_list(words)}"
        )
    if kind == "list_type":
        return f"must be a list, e.g. [a, b]; got {described(value)}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"must be a mapping (key: value); got {described(value)}"
    if kind == "string_type":
        return f"must be text; got {described(value)}{_quote_hint(value)}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be a whole number; got {described(value)}{_unquote_hint(value, (int,))}"
    if kind in ("float_type", "float_parsing"):
        hint = _unquote_hint(value, (int, float))
        return f"must be a number; got {described(value)}{hint}"
    if kind in ("bool_type", "bool_parsing"):
        return f"must be true or false; got {described(value)}{_unquote_hint(value, (bool,))}"
    if kind == "literal_error":
        ctx = err.get("ctx")
        expected = ctx.get("expected", "") if isinstance(ctx, dict) else ""
        choices = re.findall(r"'([^']*)'", str(expected))
        return f"{value!r} is not one of {', '.join(choices)}{did_you_mean(value, choices)}"
    if kind == "string_pattern_mismatch" and last == "name":
        return (
            f"{value!r} is not a {noun} name: use lowercase letters, digits, '.', '_' and '-', "
            "starting with a letter or digit, at most 63 characters"
        )
    bound = _bound(kind, err, loc)
    if bound is not None:
        return bound
    return msg.removeprefix("Value error, ")


def _splits(value: str) -> bool:
    try:
        shlex.split(value)
    except ValueError:  # an unclosed quote
        return False
    return True
