"""The workflow calls activities by name (``lazarus.domain.activity_refs``); the worker
registers implementations. Each reference must have exactly one implementation with
the same request and result types, or a rename on one side would only show up as a
stuck workflow."""

from __future__ import annotations

import asyncio
import typing

import pytest
from temporalio import activity

from activities.stand_ins import stand_ins
from lazarus.domain import activity_refs
from workers.controller import ACTIVITIES, CLIENT_CALLS


def registered() -> dict[str, list[object]]:
    by_name: dict[str, list[object]] = {}
    for fn in (*ACTIVITIES, *CLIENT_CALLS):
        definition = activity._Definition.from_callable(fn)
        assert definition is not None and definition.name is not None
        by_name.setdefault(definition.name, []).append(fn)
    return by_name


def test_every_reference_has_exactly_one_implementation_with_its_types() -> None:
    found = registered()
    for ref in (*activity_refs.ALL, *activity_refs.WORKER_CALLS):
        implementations = found.get(ref.name, [])
        assert len(implementations) == 1, f"{ref.name}: {len(implementations)} implementations"
        hints = typing.get_type_hints(implementations[0])
        parameters = [name for name in hints if name != "return"]
        assert hints[parameters[0]] is ref.request_type, ref.name
        assert hints["return"] == ref.result_type, ref.name


def test_the_worker_registers_nothing_the_workflow_cannot_call() -> None:
    refs = (*activity_refs.ALL, *activity_refs.WORKER_CALLS)
    assert set(registered()) == {ref.name for ref in refs}


def test_stand_ins_carry_the_references_names_and_types() -> None:
    """A fake cluster (the workflow tests', the simulator's) is one object with a method
    per activity: the stand-ins register it under the references' names and decode
    with their types, whatever the fake's own annotations say."""

    class Everything:
        def __getattr__(self, name: str) -> object:
            async def answer(request: object) -> str:
                return f"{name}: {request}"

            return answer

    built = stand_ins(Everything())
    assert [activity._Definition.must_from_callable(fn).name for fn in built] == [
        ref.name for ref in activity_refs.ALL
    ]
    for fn, ref in zip(built, activity_refs.ALL, strict=True):
        hints = typing.get_type_hints(fn)
        assert (hints["request"], hints["return"]) == (ref.request_type, ref.result_type)
    assert asyncio.run(built[0]("x")) == f"{activity_refs.ALL[0].name}: x"


def test_a_fake_missing_an_activity_is_refused_at_once() -> None:
    with pytest.raises(AttributeError, match="'launch'"):
        stand_ins(object(), [activity_refs.LAUNCH])
