"""Shapes: validation, model notation, binding diagnostics and normalization."""

from __future__ import annotations

from typing import Any

import pytest

from codemode_worker.shapes import (
    BindError,
    ShapeError,
    bind,
    bind_arguments,
    dict_item_path,
    positional_diagnostic,
    render,
    validate_shape,
)
from codemode_worker.values import INT64_MAX, INT64_MIN, NonFiniteFloat, NonStringKeys, Unsupported

STR = {"t": "str"}
INT = {"t": "int"}
BOOL = {"t": "bool"}
FLOAT = {"t": "float"}


def lst(of: dict[str, Any]) -> dict[str, Any]:
    return {"t": "list", "of": of}


def dct(of: dict[str, Any]) -> dict[str, Any]:
    return {"t": "dict", "of": of}


def opt(of: dict[str, Any]) -> dict[str, Any]:
    return {"t": "opt", "of": of}


def rec(**fields: dict[str, Any]) -> dict[str, Any]:
    return {"t": "record", "fields": [{"name": k, "shape": v} for k, v in fields.items()]}


WINDOW = rec(start=INT, end=INT)
SEARCH = rec(
    query=STR,
    limit=opt(INT),
    ratio=opt(FLOAT),
    exact=opt(BOOL),
    tags=opt(lst(STR)),
    labels=opt(dct(STR)),
    window=opt(WINDOW),
    filter=opt(rec(owner=STR, colour=opt(STR))),
    scores=opt(lst(opt(FLOAT))),
)


def diag(shape: dict[str, Any], kwargs: dict[str, Any]) -> str:
    with pytest.raises(BindError) as info:
        bind_arguments(shape, kwargs)
    assert str(info.value) == info.value.diagnostic
    return info.value.diagnostic


# ------------------------------------------------------------------------------------- render


def test_render_notation() -> None:
    assert render(STR) == "str"
    assert render(lst(INT)) == "list[int]"
    assert render(dct(FLOAT)) == "dict[str, float]"
    assert render(opt(BOOL)) == "bool | None"
    assert render(lst(opt(INT))) == "list[int | None]"
    assert render(opt(lst(INT))) == "list[int] | None"
    assert render(WINDOW) == "{start: int, end: int}"
    assert render(rec(a=rec(b=opt(INT)))) == "{a: {b: int | None}}"
    assert render(rec()) == "{}"


def test_render_quotes_non_identifier_keys() -> None:
    shape = {
        "t": "record",
        "fields": [
            {"name": "ok_1", "shape": STR},
            {"name": "has-dash", "shape": INT},
            {"name": '"q"', "shape": INT},
            {"name": "1st", "shape": INT},
        ],
    }
    assert render(shape) == '{ok_1: str, "has-dash": int, "\\"q\\"": int, "1st": int}'


# ------------------------------------------------------------------------------------ validate


@pytest.mark.parametrize(
    "shape",
    [STR, INT, BOOL, FLOAT, lst(STR), dct(lst(opt(INT))), SEARCH, rec(), opt(WINDOW)],
)
def test_valid_shapes(shape: dict[str, Any]) -> None:
    validate_shape(shape)


@pytest.mark.parametrize(
    "shape",
    [
        "str",
        None,
        {},
        {"t": "string"},
        {"t": 1},
        {"t": "str", "of": STR},
        {"t": "list"},
        {"t": "list", "of": "str"},
        {"t": "list", "of": STR, "x": 1},
        {"t": "opt", "of": opt(STR)},
        {"t": "record"},
        {"t": "record", "fields": {}},
        {"t": "record", "fields": [{"name": "a"}]},
        {"t": "record", "fields": [{"name": "", "shape": STR}]},
        {"t": "record", "fields": [{"name": 1, "shape": STR}]},
        {"t": "record", "fields": [{"name": "a", "shape": STR}, {"name": "a", "shape": INT}]},
        {"t": "record", "fields": [{"name": "a", "shape": STR, "doc": ""}]},
    ],
)
def test_invalid_shapes(shape: Any) -> None:
    with pytest.raises(ShapeError):
        validate_shape(shape)


def test_shape_depth_is_bounded() -> None:
    shape: dict[str, Any] = STR
    for _ in range(63):
        shape = lst(shape)
    validate_shape(shape)  # depth 64
    with pytest.raises(ShapeError):
        validate_shape(lst(shape))
    hostile: dict[str, Any] = STR
    for _ in range(100_000):
        hostile = lst(hostile)
    with pytest.raises(ShapeError):
        validate_shape(hostile)


# ----------------------------------------------------------------------------------- diagnostics


def test_missing_required() -> None:
    assert diag(SEARCH, {}) == 'missing required argument "query"'
    assert diag(SEARCH, {"query": "q", "window": {"start": 1}}) == 'missing required argument "window.end"'


def test_unknown_argument() -> None:
    assert diag(SEARCH, {"query": "q", "qeury": 1}) == 'unknown argument "qeury"'
    bad = {"query": "q", "filter": {"owner": "me", "color": "red"}}
    assert diag(SEARCH, bad) == 'unknown argument "filter.color"'


def test_unknown_is_reported_before_missing() -> None:
    assert diag(rec(key=STR), {"kye": "a"}) == 'unknown argument "kye"'


def test_wrong_types_name_expected_and_got() -> None:
    assert diag(SEARCH, {"query": 1}) == 'argument "query" must be str, got int'
    assert diag(SEARCH, {"query": "q", "tags": ["a", 2]}) == 'argument "tags[1]" must be str, got int'
    labels = diag(SEARCH, {"query": "q", "labels": {"env": 3}})
    assert labels == "argument \"labels['env']\" must be str, got int"
    window = diag(SEARCH, {"query": "q", "window": [1, 2]})
    assert window == 'argument "window" must be {start: int, end: int} | None, got list'
    assert diag(SEARCH, {"query": "q", "tags": "a"}) == 'argument "tags" must be list[str] | None, got str'
    assert diag(SEARCH, {"query": None}) == 'argument "query" must be str, got None'
    assert diag(SEARCH, {"query": "q", "exact": 1}) == 'argument "exact" must be bool | None, got int'
    got = diag(SEARCH, {"query": "q", "labels": ["x"]})
    assert got == 'argument "labels" must be dict[str, str] | None, got list'
    assert diag(SEARCH, {"query": "q", "limit": 1.0}) == 'argument "limit" must be int | None, got float'
    assert diag(SEARCH, {"query": {}}) == 'argument "query" must be str, got dict'


def test_markers_report_their_starlark_type() -> None:
    assert diag(SEARCH, {"query": Unsupported("function")}) == 'argument "query" must be str, got function'
    assert diag(SEARCH, {"query": NonFiniteFloat("nan")}) == 'argument "query" must be str, got float'


def test_bool_is_not_int() -> None:
    assert diag(rec(n=INT), {"n": True}) == 'argument "n" must be int, got bool'
    assert diag(rec(x=FLOAT), {"x": False}) == 'argument "x" must be float, got bool'


def test_int64_bounds() -> None:
    shape = rec(n=INT)
    assert bind_arguments(shape, {"n": INT64_MAX}) == {"n": INT64_MAX}
    assert bind_arguments(shape, {"n": INT64_MIN}) == {"n": INT64_MIN}
    assert diag(shape, {"n": INT64_MAX + 1}) == 'argument "n" overflows int64'
    assert diag(shape, {"n": INT64_MIN - 1}) == 'argument "n" overflows int64'
    assert diag(rec(ns=lst(INT)), {"ns": [1, 2**64]}) == 'argument "ns[1]" overflows int64'


def test_floats_accept_ints_and_reject_non_finite() -> None:
    shape = rec(ratio=FLOAT)
    out = bind_arguments(shape, {"ratio": 3})
    assert out == {"ratio": 3.0} and type(out["ratio"]) is float
    assert bind_arguments(shape, {"ratio": 2**70}) == {"ratio": float(2**70)}
    for bad in (float("nan"), float("inf"), float("-inf"), NonFiniteFloat("+inf"), 10**400):
        assert diag(shape, {"ratio": bad}) == 'argument "ratio" must be a finite float'
    nested_bad = {"query": "q", "scores": [1.0, float("inf")]}
    assert diag(SEARCH, nested_bad) == 'argument "scores[1]" must be a finite float'


def test_non_str_keys() -> None:
    assert diag(SEARCH, {"query": "q", "labels": {1: "x"}}) == 'argument "labels" keys must be str'
    assert diag(SEARCH, {"query": "q", "labels": NonStringKeys()}) == 'argument "labels" keys must be str'
    assert diag(SEARCH, {"query": "q", "window": {1: 2}}) == 'argument "window" keys must be str'


def test_dict_key_paths_are_quoted_and_escaped() -> None:
    assert dict_item_path("labels", "env") == "labels['env']"
    assert dict_item_path("l", "it's") == "l['it\\'s']"
    assert dict_item_path("l", "back\\slash") == "l['back\\\\slash']"
    assert dict_item_path("l", "a\nb\x00") == "l['a\\x0ab\\x00']"
    assert dict_item_path("l", "\u200b") == "l['\\u200b']"
    assert dict_item_path("l", "é😀") == "l['é😀']"
    shape = rec(m=dct(lst(rec(x=INT))))
    got = diag(shape, {"m": {"k'1": [{"x": 1}, {"x": "no"}]}})
    assert got == "argument \"m['k\\'1'][1].x\" must be int, got str"


def test_positional_diagnostic() -> None:
    lookup = rec(key=STR, limit=opt(INT))
    assert (
        positional_diagnostic("records.lookup", lookup)
        == "positional arguments are not accepted; call records.lookup(key=...) with keywords"
    )
    both = rec(a=STR, b=INT)
    assert positional_diagnostic("x.y", both).endswith("call x.y(a=..., b=...) with keywords")
    assert positional_diagnostic("x.y", rec(limit=opt(INT))).endswith("call x.y(limit=...) with keywords")
    assert positional_diagnostic("x.y", rec()).endswith("call x.y() without arguments")


# --------------------------------------------------------------------------------- normalization


def test_normalization() -> None:
    kwargs = {
        "query": "q",
        "limit": None,
        "ratio": 2,
        "tags": ("a", "b"),
        "labels": {"env": "prod"},
        "window": {"start": 1, "end": 2},
        "scores": [None, 1, 2.5],
    }
    out = bind_arguments(SEARCH, kwargs)
    assert out == {
        "query": "q",
        "ratio": 2.0,
        "tags": ["a", "b"],
        "labels": {"env": "prod"},
        "window": {"start": 1, "end": 2},
        "scores": [None, 1.0, 2.5],
    }
    assert "limit" not in out
    assert type(out["tags"]) is list
    assert out["window"] is not kwargs["window"]
    assert out["labels"] is not kwargs["labels"]


def test_none_inside_containers_needs_optional_elements() -> None:
    assert diag(rec(ns=lst(INT)), {"ns": [1, None]}) == 'argument "ns[1]" must be int, got None'
    assert bind_arguments(rec(ns=lst(opt(INT))), {"ns": [None]}) == {"ns": [None]}
    assert bind_arguments(rec(m=dct(opt(STR))), {"m": {"a": None}}) == {"m": {"a": None}}


def test_optional_nested_record_fields_are_dropped() -> None:
    shape = rec(f=rec(owner=STR, colour=opt(STR)))
    assert bind_arguments(shape, {"f": {"owner": "me", "colour": None}}) == {"f": {"owner": "me"}}


def test_bind_single_value_and_root_path() -> None:
    assert bind(lst(INT), (1, 2), "xs") == [1, 2]
    with pytest.raises(BindError, match=r'^argument "xs\[0\]" must be int, got str$'):
        bind(lst(INT), ["a"], "xs")
    with pytest.raises(BindError, match=r"^arguments must be"):
        bind(rec(a=INT), [1], "")


def test_bind_arguments_needs_a_record() -> None:
    with pytest.raises(ShapeError):
        bind_arguments(STR, {})


# --- string enums ---------------------------------------------------------------------------------


def test_enum_shape_validation() -> None:
    validate_shape({"t": "str", "enum": ["a", "b"]})
    for bad in (
        {"t": "str", "enum": []},
        {"t": "str", "enum": "a"},
        {"t": "str", "enum": ["a", "a"]},
        {"t": "str", "enum": [1]},
        {"t": "str", "enum": ["x" * 257]},
        {"t": "str", "enum": [str(i) for i in range(257)]},
        {"t": "int", "enum": ["a"]},
        {"t": "str", "enum": ["a"], "x": 1},
    ):
        with pytest.raises(ShapeError):
            validate_shape(bad)


def test_enum_binding_render_and_bounded_diagnostic() -> None:
    shape = {
        "t": "record",
        "fields": [{"name": "s", "shape": {"t": "opt", "of": {"t": "str", "enum": ["a", "b"]}}}],
    }
    assert render(shape) == '{s: "a" | "b" | None}'
    assert bind_arguments(shape, {"s": "b"}) == {"s": "b"}
    assert bind_arguments(shape, {"s": None}) == {}
    with pytest.raises(BindError) as info:
        bind_arguments(shape, {"s": "c"})
    assert info.value.diagnostic == 'argument "s" must be one of "a", "b"'
    many = {"t": "str", "enum": [f"v{i}" for i in range(20)]}
    with pytest.raises(BindError) as info:
        bind(many, "zz", "x")
    assert info.value.diagnostic.endswith('"v6", "v7", ...')
    with pytest.raises(BindError):
        bind(many, 3, "x")
