"""Capabilities whose types are declared as shapes (JSON Schema packs) and ``Literal`` enums."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

import pytest

import codemode
from codemode import authz
from codemode.catalog.capability import Capability, validate_catalog
from codemode.catalog.types import OutputError, PlainRecord, TypeProblem, compile_type, to_plain

IN = {
    "t": "record",
    "fields": [
        {"name": "state", "shape": {"t": "str", "enum": ["open", "closed"]}},
        {"name": "n", "shape": {"t": "opt", "of": {"t": "int"}}},
    ],
}
ITEM = {
    "t": "record",
    "fields": [
        {"name": "id", "shape": {"t": "int"}},
        {"name": "note", "shape": {"t": "opt", "of": {"t": "str"}}},
    ],
}
OUT = {"t": "record", "fields": [{"name": "items", "shape": {"t": "list", "of": ITEM}}]}


async def list_items(
    ctx: codemode.CallContext, subject: authz.Subject, args: dict[str, Any]
) -> dict[str, Any]:
    n = args.get("n", 2)
    return {"items": [{"id": i, "extra": "dropped"} for i in range(n)], "also": "dropped"}


def test_declared_shapes_compile_and_describe() -> None:
    cap = Capability(name="t.list", summary="List.", handler=list_items, input_shape=IN, output_shape=OUT)
    (compiled,), problems = validate_catalog([cap], [])
    assert problems == []
    assert compiled.signature == 't.list(*, state: "open" | "closed", n: int | None)'
    server = codemode.Builder(authorizer=authz.allow_all()).register(cap).build()
    described = server.describe("t.list").to_dict()
    assert described["input"][0] == {"name": "state", "type": '"open" | "closed"', "required": True}
    assert described["output"] == [{"name": "items", "type": "list[{id: int, note?: str}]", "required": True}]


def test_declared_shapes_problems() -> None:
    bad = [
        Capability(name="t.a", summary="A.", handler=list_items, input_shape=IN),
        Capability(name="t.b", summary="B.", handler=list_items, input_shape={"t": "str"}, output_shape=OUT),
        Capability(name="t.c", summary="C.", handler=list_items, input_shape=IN, output_shape={"t": "nope"}),
    ]
    _, problems = validate_catalog(bad, [])
    assert problems == [
        "capability 't.a': output_shape: required when the other shape is given",
        "capability 't.b': input_shape: must be a record shape",
        "capability 't.c': output_shape: unknown shape kind 'nope'",
    ]


def test_plain_results_are_checked_against_the_output_shape() -> None:
    assert to_plain(OUT, PlainRecord({"items": [{"id": 1, "x": 2}]})) == {"items": [{"id": 1}]}
    with pytest.raises(OutputError):
        to_plain(OUT, PlainRecord({"items": [{"note": "no id"}]}))
    with pytest.raises(OutputError):
        to_plain(OUT, {"items": []})  # a plain dict from a dataclass-typed handler stays refused
    enum_out = {"t": "record", "fields": [{"name": "s", "shape": {"t": "str", "enum": ["a"]}}]}
    with pytest.raises(OutputError, match="enum"):
        to_plain(enum_out, PlainRecord({"s": "b"}))


def test_declared_capability_runs_end_to_end() -> None:
    cap = Capability(name="t.list", summary="List.", handler=list_items, input_shape=IN, output_shape=OUT)
    server = codemode.Builder(authorizer=authz.allow_all()).register(cap).build()
    subject = authz.Subject(id="u1")

    async def run(source: str) -> Any:
        try:
            return await server.execute(source, subject=subject)
        finally:
            await server.aclose()

    value = asyncio.run(run('def main():\n    return t.list(state="open", n=3)\n'))
    assert value == {"items": [{"id": 0}, {"id": 1}, {"id": 2}]}
    with pytest.raises(codemode.InvalidArguments) as info:
        asyncio.run(run('def main():\n    return t.list(state="merged")\n'))
    assert info.value.detail is not None and 'must be one of "open", "closed"' in info.value.detail


def test_literal_annotations_compile_to_enums() -> None:
    assert compile_type(Literal["a", "b"]) == {"t": "str", "enum": ["a", "b"]}
    assert compile_type(Literal["a"] | None) == {"t": "opt", "of": {"t": "str", "enum": ["a"]}}
    with pytest.raises(TypeProblem):
        compile_type(Literal[1, 2])

    @dataclass
    class In:
        mode: Literal["fast", "slow"]

    assert compile_type(In)["fields"][0]["shape"] == {"t": "str", "enum": ["fast", "slow"]}
