"""The shape notation is written once, in the worker's pure ``codemode_worker.shapes``:
inputs and outputs differ only in how an optional record field is written (docs/reference/describe.md,
"Notation"), so an output's nested field whose name is not an identifier is a JSON string there too."""

from __future__ import annotations

from typing import Any

from codemode.catalog.types import describe_fields
from codemode_worker.shapes import render

STR: dict[str, Any] = {"t": "str"}
NESTED: dict[str, Any] = {
    "t": "record",
    "fields": [
        {"name": "user-id", "shape": STR},
        {"name": "note", "shape": {"t": "opt", "of": STR}},
        {"name": "tags", "shape": {"t": "list", "of": {"t": "opt", "of": STR}}},
    ],
}
ROOT: dict[str, Any] = {"t": "record", "fields": [{"name": "item", "shape": NESTED}]}


def test_an_output_field_that_is_no_identifier_is_a_json_string() -> None:
    (field,) = describe_fields(ROOT, output=True)
    assert field.type == '{"user-id": str, note?: str, tags: list[str | None]}'


def test_inputs_and_outputs_differ_only_in_optional_record_fields() -> None:
    (given,) = describe_fields(ROOT, output=False)
    assert given.type == '{"user-id": str, note: str | None, tags: list[str | None]}'
    assert render(NESTED) == given.type
    assert render(NESTED, output=True) == describe_fields(ROOT, output=True)[0].type


def test_an_output_shows_no_default() -> None:
    with_default = {
        "t": "record",
        "fields": [{"name": "size", "shape": {"t": "opt", "of": {"t": "int"}}, "default": 10}],
    }
    assert render(with_default) == "{size: int = 10}"
    assert render(with_default, output=True) == "{size?: int}"
