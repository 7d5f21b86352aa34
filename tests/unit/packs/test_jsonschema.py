"""JSON Schema → shapes: every mapping rule, every refusal, and enum binding on both sides."""

from __future__ import annotations

from typing import Any

import pytest

from codemode.packs.jsonschema import Unsupported, compile_schema, record_of
from codemode_worker.shapes import BindError, bind_arguments, render, validate_shape

S = {"t": "str"}
I = {"t": "int"}  # noqa: E741


def opt(shape: dict[str, Any]) -> dict[str, Any]:
    return {"t": "opt", "of": shape}


def test_primitives_and_containers() -> None:
    assert compile_schema({"type": "string"}) == S
    assert compile_schema({"type": "integer"}) == I
    assert compile_schema({"type": "number"}) == {"t": "float"}
    assert compile_schema({"type": "boolean"}) == {"t": "bool"}
    assert compile_schema({"type": "array", "items": {"type": "string"}}) == {"t": "list", "of": S}
    assert compile_schema({"type": "object", "additionalProperties": {"type": "integer"}}) == {
        "t": "dict",
        "of": I,
    }


def test_object_required_and_optional_in_declaration_order() -> None:
    schema = {
        "type": "object",
        "properties": {"b": {"type": "string"}, "a": {"type": "integer"}},
        "required": ["a"],
    }
    assert record_of(schema) == {
        "t": "record",
        "fields": [{"name": "b", "shape": opt(S)}, {"name": "a", "shape": I}],
    }


@pytest.mark.parametrize(
    "schema",
    [
        {"type": ["string", "null"]},
        {"anyOf": [{"type": "string"}, {"type": "null"}]},
        {"oneOf": [{"type": "null"}, {"type": "string"}]},
    ],
)
def test_nullable_forms(schema: dict[str, Any]) -> None:
    assert compile_schema(schema) == opt(S)


def test_openapi_30_nullable_only_in_openapi_dialects() -> None:
    schema = {"type": "string", "nullable": True}
    assert compile_schema(schema, dialect="openapi-3.0") == opt(S)
    assert compile_schema(schema, dialect="2020-12") == S  # not a keyword there


def test_string_enum_and_const() -> None:
    assert compile_schema({"type": "string", "enum": ["open", "closed"]}) == {
        "t": "str",
        "enum": ["open", "closed"],
    }
    assert compile_schema({"enum": ["a", None]}) == opt({"t": "str", "enum": ["a"]})
    assert compile_schema({"const": "x"}) == {"t": "str", "enum": ["x"]}


def test_local_refs_and_defs() -> None:
    schema = {
        "type": "object",
        "properties": {"owner": {"$ref": "#/$defs/user"}},
        "required": ["owner"],
        "$defs": {"user": {"type": "object", "properties": {"login": {"type": "string"}}}},
    }
    assert record_of(schema)["fields"][0]["shape"] == {
        "t": "record",
        "fields": [{"name": "login", "shape": opt(S)}],
    }


def test_all_of_objects_merge() -> None:
    doc = {
        "components": {
            "schemas": {
                "Base": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
            }
        }
    }
    schema = {"allOf": [{"$ref": "#/components/schemas/Base"}, {"properties": {"n": {"type": "string"}}}]}
    shape = compile_schema(schema, document=doc, dialect="openapi-3.1")
    assert shape == {"t": "record", "fields": [{"name": "id", "shape": I}, {"name": "n", "shape": opt(S)}]}


def test_read_only_and_write_only_follow_direction() -> None:
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "readOnly": True},
            "pw": {"type": "string", "writeOnly": True},
        },
        "required": ["id", "pw"],
    }
    assert [f["name"] for f in record_of(schema, direction="input")["fields"]] == ["pw"]
    assert [f["name"] for f in record_of(schema, direction="output")["fields"]] == ["id"]


def test_empty_root_objects_are_empty_records() -> None:
    empty = {"t": "record", "fields": []}
    assert record_of(None) == empty
    assert record_of({}) == empty
    assert record_of({"type": "object"}) == empty
    assert record_of({"type": "object", "properties": {}, "additionalProperties": False}) == empty


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "object", "properties": {"x": {}}}, "untyped value"),
        ({"type": "object", "properties": {"x": True}}, "untyped value"),
        ({"type": ["string", "integer"]}, "union of types"),
        ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, "anyOf of 2 non-null alternatives"),
        ({"enum": [1, 2]}, "non-string enum"),
        ({"type": "string", "format": "binary"}, "binary string"),
        ({"type": "array"}, "array without 'items'"),
        ({"prefixItems": [{"type": "string"}], "type": "array"}, "'prefixItems'"),
        ({"not": {"type": "string"}}, "'not'"),
        ({"type": "object", "properties": {"m": {"type": "object"}}}, "untyped object"),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "additionalProperties": {"type": "string"},
            },
            "extra keys are also typed",
        ),
        ({"$ref": "https://example.com/s.json"}, "non-local $ref"),
        ({"$ref": "#/$defs/missing"}, "does not resolve"),
    ],
)
def test_refusals_name_a_reason(schema: dict[str, Any], reason: str) -> None:
    with pytest.raises(Unsupported) as info:
        compile_schema(schema)
    assert reason in str(info.value)


def test_recursive_ref_is_refused_with_pointer() -> None:
    schema = {
        "type": "object",
        "properties": {"node": {"$ref": "#/$defs/node"}},
        "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
    }
    with pytest.raises(Unsupported) as info:
        record_of(schema)
    assert "recursive $ref '#/$defs/node'" in str(info.value)
    assert info.value.pointer.startswith("/properties/node")


def test_recursion_through_all_of_is_refused() -> None:
    doc = {
        "$defs": {
            "A": {"allOf": [{"$ref": "#/$defs/B"}, {"properties": {"z": {"type": "string"}}}]},
            "B": {"type": "object", "properties": {"child": {"$ref": "#/$defs/A"}}},
        }
    }
    with pytest.raises(Unsupported, match="recursive"):
        compile_schema({"$ref": "#/$defs/A"}, document=doc)


def test_compiled_shapes_are_valid_and_bind() -> None:
    schema = {
        "type": "object",
        "properties": {
            "state": {"type": "string", "enum": ["open", "closed"]},
            "labels": {"type": "array", "items": {"type": "string"}},
            "meta": {"type": "object", "additionalProperties": {"type": ["number", "null"]}},
        },
        "required": ["state"],
    }
    shape = record_of(schema)
    validate_shape(shape)
    assert render(shape) == (
        '{state: "open" | "closed", labels: list[str] | None, meta: dict[str, float | None] | None}'
    )
    assert bind_arguments(shape, {"state": "open", "meta": {"x": 1, "y": None}}) == {
        "state": "open",
        "meta": {"x": 1.0, "y": None},
    }
    with pytest.raises(BindError) as info:
        bind_arguments(shape, {"state": "merged"})
    assert info.value.diagnostic == 'argument "state" must be one of "open", "closed"'


def test_shared_refs_cannot_expand_exponentially() -> None:
    """Found by review: a chain of $defs each referring twice to the next expands 2^N times (N=18
    took 10 s, N=30 never finished). The expansion is bounded and refused with a reason."""
    import time

    n = 30
    defs = {
        f"d{i}": {
            "type": "object",
            "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}, "b": {"$ref": f"#/$defs/d{i + 1}"}},
        }
        for i in range(n)
    }
    defs[f"d{n}"] = {"type": "string"}
    schema = {"$defs": defs, "$ref": "#/$defs/d0"}
    t0 = time.monotonic()
    with pytest.raises(Unsupported, match="schema nodes"):
        compile_schema(schema)
    assert time.monotonic() - t0 < 10


# ---------------------------------------------------------------- unions and intersections


def test_unions_that_are_one_type_join() -> None:
    """Alternatives that differ only in value constraints are that type (the upstream checks the
    constraints); string enums join to the enum of all their values, or to str with a plain str."""
    ids = {"anyOf": [{"type": "string", "pattern": "[a-f0-9]{24}"}, {"type": "string", "pattern": "[a-z-]+"}]}
    assert compile_schema(ids) == S
    assert compile_schema({"oneOf": [{"enum": ["a", "b"]}, {"const": "c"}, {"type": "null"}]}) == opt(
        {"t": "str", "enum": ["a", "b", "c"]}
    )
    assert compile_schema({"anyOf": [{"enum": ["a"]}, {"type": "string"}]}) == S
    assert compile_schema({"anyOf": [{"type": "integer"}, {"type": "integer", "minimum": 1}]}) == I


def test_unions_of_records_join_in_results_only() -> None:
    card = {
        "type": "object",
        "properties": {"kind": {"const": "card"}, "number": {"type": "string"}, "id": {"type": "integer"}},
        "required": ["kind", "number", "id"],
    }
    bank = {
        "type": "object",
        "properties": {"kind": {"const": "bank"}, "iban": {"type": "string"}, "id": {"type": "integer"}},
        "required": ["kind", "iban", "id"],
    }
    union = {"oneOf": [card, bank]}
    assert compile_schema(union, direction="output") == {
        "t": "record",
        "fields": [
            {"name": "kind", "shape": {"t": "str", "enum": ["card", "bank"]}},
            {"name": "number", "shape": opt(S)},
            {"name": "id", "shape": I},
            {"name": "iban", "shape": opt(S)},
        ],
    }
    assert compile_schema({"type": "array", "items": union}, direction="output")["t"] == "list"
    with pytest.raises(Unsupported, match="oneOf of 2 non-null alternatives"):
        compile_schema(union, direction="input")  # a call could mix both: refused, not loosened


def test_a_result_union_field_of_two_types_is_left_out() -> None:
    union = {
        "anyOf": [
            {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}},
            {"type": "object", "properties": {"a": {"type": "integer"}}},
        ]
    }
    omissions: list[Unsupported] = []
    shape = compile_schema(union, direction="output", omissions=omissions)
    assert shape == {"t": "record", "fields": [{"name": "b", "shape": opt(S)}]}
    assert "property 'a' has different types" in str(omissions[0])
    with pytest.raises(Unsupported, match="anyOf of 2"):
        compile_schema(union, direction="output")  # without omissions the union is refused whole


def test_unions_of_different_types_stay_refused() -> None:
    for direction in ("input", "output"):
        with pytest.raises(Unsupported, match="anyOf of 2 non-null alternatives"):
            compile_schema({"anyOf": [{"type": "string"}, {"type": "integer"}]}, direction=direction)


def test_all_of_scalars_arrays_and_shared_properties() -> None:
    assert compile_schema({"allOf": [{"type": "string"}, {"type": "string", "minLength": 1}]}) == S
    assert compile_schema({"allOf": [{"enum": ["a", "b", "c"]}, {"enum": ["b", "c", "d"]}]}) == {
        "t": "str",
        "enum": ["b", "c"],
    }
    with pytest.raises(Unsupported, match="without a common value"):
        compile_schema({"allOf": [{"enum": ["a"]}, {"enum": ["b"]}]})
    with pytest.raises(Unsupported, match="different types"):
        compile_schema(
            {"allOf": [{"type": "string"}, {"type": "object", "properties": {"a": {"type": "string"}}}]}
        )
    doc = {
        "$defs": {
            "Station": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
            "Wrapper": {
                "type": "object",
                "properties": {
                    "data": {"type": "array", "items": {"type": "object"}},
                    "links": {"readOnly": True},
                },
            },
        }
    }
    schema = {
        "allOf": [
            {"$ref": "#/$defs/Wrapper"},
            {"properties": {"data": {"type": "array", "items": {"$ref": "#/$defs/Station"}}}},
            {"allOf": [{"properties": {"page": {"type": "integer"}}}, {"description": "annotations only"}]},
        ]
    }
    # 'data' must satisfy both members: a list of stations (the untyped object adds nothing)
    assert compile_schema(schema, document=doc, direction="input") == {
        "t": "record",
        "fields": [
            {
                "name": "data",
                "shape": opt({"t": "list", "of": {"t": "record", "fields": [{"name": "name", "shape": S}]}}),
            },
            {"name": "page", "shape": opt(I)},
        ],
    }


def test_an_enum_too_long_to_list_is_a_string() -> None:
    """Twilio's usage categories list more values than the catalog shows: the upstream checks them."""
    assert compile_schema({"type": "string", "enum": [f"v{i}" for i in range(300)]}) == S
    assert compile_schema({"enum": ["x" * 300, "y"]}) == S
