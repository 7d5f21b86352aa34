"""Plain values: type checks, inclusive depth, exact encoded size, hostile shapes."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from codemode_worker.values import (
    INT64_MAX,
    INT64_MIN,
    NonFiniteFloat,
    NonStringKeys,
    Overflow,
    Unsupported,
    ValueLimitError,
    ValueTypeError,
    check_value,
    kind_of,
)


def encoded_size(value: Any) -> int:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return len(text.encode("utf-8"))


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth - 1):
        value = [value]
    return value


SAMPLES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    INT64_MAX,
    INT64_MIN,
    0.0,
    -0.0,
    1.5,
    1e300,
    5e-324,
    1e16,
    "",
    "plain",
    'quote " backslash \\ newline \n tab \t ctrl \x01 del \x7f',
    "é ü 😀 \u2028",
    [],
    {},
    [1, [2, [3, []]], {"a": None}],
    {"k": {"nested": [1.25, "x", False]}, "é": [], "": ""},
]


@pytest.mark.parametrize("value", SAMPLES)
def test_size_matches_json_dumps(value: Any) -> None:
    assert check_value(value, 64, 1 << 20) == encoded_size(value)


def test_size_matches_json_dumps_randomized() -> None:
    rng = random.Random(7)
    scalars: list[Any] = [None, True, False, 0, -17, 10**18, 0.1, -2.5e-8, "", 'ab"c\\', "\x00é😀"]

    def make(depth: int) -> Any:
        roll = rng.random()
        if depth > 5 or roll < 0.4:
            return rng.choice(scalars)
        if roll < 0.7:
            return [make(depth + 1) for _ in range(rng.randint(0, 4))]
        keys = ["a", "b", "é", "", "x\ny"]
        return {rng.choice(keys) + str(i): make(depth + 1) for i in range(rng.randint(0, 4))}

    for _ in range(300):
        value = make(1)
        assert check_value(value, 64, 1 << 20) == encoded_size(value)


def test_depth_is_inclusive() -> None:
    assert check_value(1, 1, 100) == 1
    assert check_value([], 1, 100) == 2
    with pytest.raises(ValueLimitError):
        check_value([1], 1, 100)
    assert check_value([1], 2, 100) == 3
    assert check_value({"a": [1]}, 3, 100) > 0
    with pytest.raises(ValueLimitError):
        check_value({"a": [1]}, 2, 100)


def test_depth_exactly_at_limit_and_one_over() -> None:
    check_value(nested(32), 32, 1 << 20)
    with pytest.raises(ValueLimitError):
        check_value(nested(33), 32, 1 << 20)


def test_bytes_exactly_at_limit_and_one_over() -> None:
    value = {"text": "x" * 100}
    size = encoded_size(value)
    assert check_value(value, 32, size) == size
    with pytest.raises(ValueLimitError):
        check_value(value, 32, size - 1)


def test_hostile_deep_value_is_a_limit_error_not_recursion() -> None:
    with pytest.raises(ValueLimitError):
        check_value(nested(100_000), 32, 1 << 30)
    deep_dict: Any = {}
    for _ in range(100_000):
        deep_dict = {"a": deep_dict}
    with pytest.raises(ValueLimitError):
        check_value(deep_dict, 1000, 1 << 30)


def test_cycles_end_at_the_depth_limit() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueLimitError):
        check_value(loop, 32, 1 << 30)


def test_huge_value_stops_early() -> None:
    with pytest.raises(ValueLimitError):
        check_value(["x" * 1000] * 1_000_000, 32, 1 << 20)


@pytest.mark.parametrize(
    "value",
    [
        INT64_MAX + 1,
        INT64_MIN - 1,
        float("nan"),
        float("inf"),
        float("-inf"),
        (1, 2),
        {1: "a"},
        {("a",): 1},
        {1.5, 2},
        b"bytes",
        object(),
        "\ud800",
        {"\udfff": 1},
        [Unsupported("function")],
        {"a": NonFiniteFloat("+inf")},
        NonStringKeys(),
    ],
)
def test_type_errors(value: Any) -> None:
    with pytest.raises(ValueTypeError):
        check_value(value, 32, 1 << 20)


def test_overflow_marker_is_a_limit_error() -> None:
    with pytest.raises(ValueLimitError):
        check_value([Overflow("depth")], 32, 1 << 20)


def test_int64_bounds_exactly() -> None:
    check_value(INT64_MAX, 1, 100)
    check_value(INT64_MIN, 1, 100)


def test_kind_of() -> None:
    values: tuple[object, ...] = (None, True, 1, 1.0, "s", [], (), {})
    assert [kind_of(v) for v in values] == [
        "None",
        "bool",
        "int",
        "float",
        "str",
        "list",
        "list",
        "dict",
    ]
    assert kind_of(Unsupported("range")) == "range"
    assert kind_of(NonFiniteFloat("nan")) == "float"
    assert kind_of(NonStringKeys()) == "dict"
