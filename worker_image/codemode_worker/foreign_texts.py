"""Texts of the machinery beneath the language that a program's error can carry, and what the
worker reports instead.

Starlark values cross to the Python builtins (``math.*``, ``json.*``, the capability wrappers'
error paths) through starlark-pyo3, which converts them as JSON that CPython parses. When that fails
the error names the machinery: CPython's integer digit limit ("Exceeds the limit (4300 digits) for
integer string conversion ... use sys.set_int_max_str_digits()"), starlark-pyo3's depth limit
("... while converting Starlark value of type `list` to Python object") or serde ("Operation
`serde::serialize` not supported on type `function`"). starlark-rust's own builtins reject an integer
they cannot hold in 32 bits with "Error unpacking value for parameter `a1` of type `int" (its cause,
"too big to fit in i32", is dropped on the way). None of these texts is the program's or the
language's, so none reaches a client:

- a number too long or a value too deep to cross is ``resource_limit`` ``value size``, as when
  it is a result or an argument (docs/reference/errors.md);
- a value of a type that cannot cross is ``unsupported argument of type `T```;
- the unpacking failure is ``integer out of range for parameter `P``` (``invalid value for
  parameter `P``` when the parameter takes no int);
- any other Python exception text is ``internal``: the worker's own bug, never shown.

No ``starlark`` import here.
"""

from __future__ import annotations

import re
import sys
from typing import Final

__all__ = ["digit_limit_text", "translate"]

#: The error kinds a translation gives (those of the ``final_error`` frame).
INVALID_PROGRAM: Final = "invalid_program"
RESOURCE_LIMIT: Final = "resource_limit"
INTERNAL: Final = "internal"
VALUE_SIZE: Final = "value size"

_DEPTH = re.compile(
    r"Maximum depth of \d+ exceeded while converting Starlark value of type `[^`]*` to Python object"
)
_SERDE = re.compile(r"Operation `serde::serialize` not supported on type `(?P<type>[A-Za-z0-9_.]{1,40})`\Z")
_UNPACK = re.compile(
    r"Error unpacking value for parameter `(?P<name>[A-Za-z0-9_]{1,40})` of type `(?P<type>[^`]*)`?\Z"
)
#: How starlark-pyo3 renders a Python exception raised on the bridge: ``ValueError: ...``.
_PYTHON_EXCEPTION = re.compile(r"[A-Z][A-Za-z0-9_]*(?:Error|Exception|Warning): ")


def _measure_digit_limit() -> str:
    limit = sys.get_int_max_str_digits()
    if limit == 0:
        return ""  # no limit: CPython never says it
    try:
        int("1" * (limit + 1))
    except ValueError as exc:
        return str(exc).split(":", 1)[0]
    return ""  # pragma: no cover - CPython parsed more digits than its own limit


_DIGIT_LIMIT: Final = _measure_digit_limit()


def digit_limit_text(text: str) -> bool:
    """``text`` is CPython's refusal to parse an integer of too many digits (measured from this
    interpreter: "Exceeds the limit (4300 digits) for integer string conversion")."""
    return bool(_DIGIT_LIMIT) and text.startswith(_DIGIT_LIMIT)


def translate(message: str) -> tuple[str, str] | None:
    """``(error kind, message or limit kind)`` to report for an error whose first line is
    ``message``, or None when the message is the language's own and is reported as it is."""
    python = _PYTHON_EXCEPTION.match(message)
    if python is not None:
        inner = message[python.end() :]
        return (RESOURCE_LIMIT, VALUE_SIZE) if digit_limit_text(inner) else (INTERNAL, "")
    if _DEPTH.match(message):
        return RESOURCE_LIMIT, VALUE_SIZE
    serde = _SERDE.match(message)
    if serde is not None:
        return INVALID_PROGRAM, f"unsupported argument of type `{serde['type']}`"
    unpack = _UNPACK.match(message)
    if unpack is not None:
        what = "integer out of range" if re.search(r"\bint\b", unpack["type"]) else "invalid value"
        return INVALID_PROGRAM, f"{what} for parameter `{unpack['name']}`"
    return None
