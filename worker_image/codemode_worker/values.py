"""Plain values and their bounds.

A *plain value* is ``None``, ``bool``, an ``int`` in signed 64-bit range, a finite ``float``, a
``str`` (encodable as UTF-8), a ``list`` of plain values or a ``dict`` with ``str`` keys and plain
values. Every value that crosses the sandbox boundary is one, bounded in depth and encoded size.

Depth is inclusive: a scalar has depth 1, ``[1]`` depth 2, ``[]`` depth 1. The encoded size is
the byte length of ``json.dumps(v, separators=(",", ":"), ensure_ascii=False, allow_nan=False)``
encoded as UTF-8; it is computed without serialising, iteratively, and stops early once a bound
is exceeded, so hostile values (100,000 levels deep, cyclic, huge) are rejected cheaply and never
recurse on the Python stack.

The marker classes stand for Starlark values that have no plain equivalent; the worker puts them
where such a value was found so that binding can name the exact path (``shapes.bind``) and
``check_value`` rejects them. This module is pure Python: the host imports it too.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from json.encoder import encode_basestring
from typing import Any, Final

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "NonFiniteFloat",
    "NonStringKeys",
    "Overflow",
    "Unsupported",
    "ValueLimitError",
    "ValueTypeError",
    "check_value",
    "kind_of",
]

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1


class ValueLimitError(Exception):
    """The value is nested deeper or encodes larger than allowed."""


class ValueTypeError(Exception):
    """The value is not a plain value (wrong type, int64 overflow, non-finite float, bad key)."""


class Unsupported:
    """Marker: a Starlark value of a type with no plain equivalent (function, range, struct...)."""

    __slots__ = ("starlark_type",)

    def __init__(self, starlark_type: str) -> None:
        self.starlark_type = starlark_type

    def __repr__(self) -> str:
        return f"Unsupported({self.starlark_type!r})"


class NonFiniteFloat:
    """Marker: a Starlark float that is NaN or infinite (``text`` is its Starlark repr)."""

    __slots__ = ("text",)
    starlark_type = "float"

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"NonFiniteFloat({self.text!r})"


class NonStringKeys:
    """Marker: a Starlark dict with at least one key that is not a string."""

    __slots__ = ()
    starlark_type = "dict"

    def __repr__(self) -> str:
        return "NonStringKeys()"


class Overflow:
    """Marker: the value was too deep (``"depth"``) or too large (``"size"``) to cross at all."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Overflow({self.reason!r})"


def kind_of(value: object) -> str:
    """Starlark-ish kind of a value for diagnostics: ``str int float bool None list dict`` or
    the Starlark type a marker stands for."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "dict"
    if isinstance(value, Unsupported):
        return value.starlark_type
    if isinstance(value, (NonFiniteFloat, NonStringKeys)):
        return value.starlark_type
    return type(value).__name__


def _str_bytes(text: str) -> int:
    try:
        return len(encode_basestring(text).encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueTypeError("string is not valid Unicode") from None


def _scalar_bytes(item: object) -> int:
    if item is None or item is True:
        return 4
    if item is False:
        return 5
    kind = type(item)
    if kind is int:
        assert isinstance(item, int)
        if item < INT64_MIN or item > INT64_MAX:
            raise ValueTypeError("int overflows int64")
        return len(str(item))
    if kind is float:
        assert isinstance(item, float)
        if not math.isfinite(item):
            raise ValueTypeError("float is not finite")
        return len(float.__repr__(item))
    if kind is str:
        assert isinstance(item, str)
        return _str_bytes(item)
    if isinstance(item, Overflow):
        raise ValueLimitError(f"value too {'deep' if item.reason == 'depth' else 'large'} to cross")
    if isinstance(item, NonFiniteFloat):
        raise ValueTypeError(f"float {item.text} is not finite")
    if isinstance(item, NonStringKeys):
        raise ValueTypeError("dict key is not a str")
    raise ValueTypeError(f"unsupported value of type {kind_of(item)}")


_END: Final = object()


def check_value(value: object, max_depth: int, max_bytes: int) -> int:
    """Check that ``value`` is a plain value within bounds; return its encoded size in bytes.

    Raises ``ValueLimitError`` when its depth exceeds ``max_depth`` or its encoded size exceeds
    ``max_bytes``; ``ValueTypeError`` when it is not a plain value. Containers are walked one
    child at a time (a stack of iterators), so the walk stops as soon as a bound is crossed.
    """
    total = 0
    stack: list[tuple[Iterator[Any], int, bool]] = []
    item: object = value
    depth = 1
    while True:
        if depth > max_depth:
            raise ValueLimitError(f"value nested deeper than {max_depth}")
        kind = type(item)
        if kind is list:
            assert isinstance(item, list)
            total += 2 + max(len(item) - 1, 0)
            if item:
                stack.append((iter(item), depth + 1, False))
        elif kind is dict:
            assert isinstance(item, dict)
            total += 2 + max(len(item) - 1, 0) + len(item)  # braces, commas, colons
            if item:
                stack.append((iter(item.items()), depth + 1, True))
        else:
            total += _scalar_bytes(item)
        if total > max_bytes:
            raise ValueLimitError(f"value larger than {max_bytes} bytes")
        while stack:
            children, child_depth, is_dict = stack[-1]
            child: Any = next(children, _END)
            if child is _END:
                stack.pop()
                continue
            if is_dict:
                key, item = child
                if type(key) is not str:
                    raise ValueTypeError("dict key is not a str")
                total += _str_bytes(key)
            else:
                item = child
            depth = child_depth
            break
        else:
            return total
