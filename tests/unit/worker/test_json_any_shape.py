"""The JSON-any shape, ``{"t": "any"}`` (the state pack's values): valid on the wire,
shown as ``json``, binding exactly the plain values (worker and host alike), compiled from
``typing.Any`` and checked on output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from codemode.catalog.types import OutputError, compile_type, to_plain
from codemode_worker.shapes import BindError, ShapeError, bind, bind_arguments, render, validate_shape
from codemode_worker.values import INT64_MAX, NonFiniteFloat, NonStringKeys, Unsupported

ANY = {"t": "any"}


def test_it_is_a_shape_of_its_own_shown_as_json() -> None:
    validate_shape(ANY)
    validate_shape({"t": "opt", "of": ANY})
    validate_shape({"t": "record", "fields": [{"name": "value", "shape": ANY}]})
    with pytest.raises(ShapeError):
        validate_shape({"t": "any", "of": {"t": "str"}})
    assert render(ANY) == "json"
    assert render({"t": "list", "of": ANY}) == "list[json]"
    assert render({"t": "dict", "of": ANY}, output=True) == "dict[str, json]"


def test_it_binds_plain_values_to_a_fresh_copy() -> None:
    value = {"a": [1, 2.5, None, True, "ü", {"b": (3, 4)}], "c": {}}
    got = bind(ANY, value, "value")
    assert got == {"a": [1, 2.5, None, True, "ü", {"b": [3, 4]}], "c": {}}
    assert got is not value and got["a"] is not value["a"]
    assert bind(ANY, None, "value") is None


@pytest.mark.parametrize(
    ("value", "diagnostic"),
    [
        (INT64_MAX + 1, 'argument "value" overflows int64'),
        ([1, NonFiniteFloat("nan")], 'argument "value[1]" must be a finite float'),
        ({"k": float("inf")}, "argument \"value['k']\" must be a finite float"),
        ({"k": NonStringKeys()}, "argument \"value['k']\" keys must be str"),
        ({"k": {1: 2}}, "argument \"value['k']\" keys must be str"),
        ([Unsupported("function")], 'argument "value[0]" must be json, got function'),
    ],
)
def test_what_is_not_json_does_not_bind(value: Any, diagnostic: str) -> None:
    with pytest.raises(BindError) as info:
        bind(ANY, value, "value")
    assert info.value.diagnostic == diagnostic


def test_a_required_json_argument_may_be_none_but_not_missing() -> None:
    shape = {"t": "record", "fields": [{"name": "value", "shape": ANY}]}
    assert bind_arguments(shape, {"value": None}) == {"value": None}
    with pytest.raises(BindError, match='missing required argument "value"'):
        bind_arguments(shape, {})


def test_typing_any_compiles_to_it_and_outputs_are_checked() -> None:
    @dataclass
    class Out:
        value: Any

    shape = compile_type(Out)
    assert shape == {"t": "record", "fields": [{"name": "value", "shape": ANY}]}
    assert to_plain(shape, Out({"x": (1, None)})) == {"value": {"x": [1, None]}}
    for bad in (float("nan"), {1: 2}, object(), INT64_MAX + 1):
        with pytest.raises(OutputError):
            to_plain(shape, Out(bad))
