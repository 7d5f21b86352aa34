"""The builtins written in Python: ``math.*``, and the parts of ``json.*`` that must not be left
to starlark-rust (its ``json.decode`` panics on numbers such as ``1e400``; its ``json.encode``
writes NaN/infinities as ``null`` and accepts non-string keys).

Every function takes ``(*args, **kwargs)`` as starlark-pyo3 passes them and raises
``CallError`` with a clean ``name: reason`` message. No ``starlark`` import here.

A starlark-pyo3 limitation shapes ``math``: a non-finite float cannot cross from Starlark to
Python intact (it arrives as ``None``), so ``math`` functions accept only finite numbers and
reject non-finite results instead of returning them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, Final

from .values import INT64_MAX, NonFiniteFloat, NonStringKeys, Overflow, Unsupported, kind_of

__all__ = ["MATH_CONSTANTS", "MATH_FUNCTIONS", "CallError", "json_check", "json_encode_marked", "json_indent"]


class CallError(Exception):
    """A builtin rejected its call; the message is shown to the program's author."""


_MISSING: Final = object()

UINT64_MAX: Final = 2**64 - 1


def unpack(
    fname: str, args: Sequence[Any], kwargs: dict[str, Any], names: Sequence[str], required: int
) -> list[Any]:
    """Match positional and keyword arguments to ``names``; missing optional ones are ``_MISSING``."""
    if len(args) > len(names):
        raise CallError(f"{fname}: got {len(args)} arguments, want at most {len(names)}")
    values: list[Any] = list(args) + [_MISSING] * (len(names) - len(args))
    for key, value in kwargs.items():
        if key not in names:
            raise CallError(f"{fname}: unexpected keyword argument {key!r}")
        index = list(names).index(key)
        if values[index] is not _MISSING:
            raise CallError(f"{fname}: got multiple values for {key!r}")
        values[index] = value
    for i in range(required):
        if values[i] is _MISSING:
            raise CallError(f"{fname}: missing argument {names[i]!r}")
    return values


# ------------------------------------------------------------------------------------------ math


def _number(fname: str, value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CallError(f"{fname}: want a finite float or int, got {kind_of(value)}")
    return value


def _finite(fname: str, result: float) -> float:
    if not math.isfinite(result):
        raise CallError(f"{fname}: result out of range")
    return result


def _round_half_away(x: float) -> float:
    whole = math.trunc(x)
    if abs(x - whole) >= 0.5:
        whole += 1 if x > 0 else -1
    return float(whole)


def _float_function(name: str, impl: Callable[..., float], names: Sequence[str]) -> Callable[..., Any]:
    fname = f"math.{name}"

    def call(*args: Any, **kwargs: Any) -> Any:
        numbers = [_number(fname, v) for v in unpack(fname, args, kwargs, names, len(names))]
        try:
            return _finite(fname, float(impl(*numbers)))
        except (ValueError, ZeroDivisionError):
            raise CallError(f"{fname}: math domain error") from None
        except OverflowError:
            raise CallError(f"{fname}: result out of range") from None

    return call


def _rounding_function(name: str) -> Callable[..., Any]:
    fname = f"math.{name}"

    def call(*args: Any, **kwargs: Any) -> Any:
        (x,) = unpack(fname, args, kwargs, ("x",), 1)
        x = _number(fname, x)
        try:
            if name == "floor":
                return math.floor(x)
            if name == "ceil":
                return math.ceil(x)
            return _finite(fname, _round_half_away(float(x)))
        except OverflowError:
            raise CallError(f"{fname}: argument out of range") from None

    return call


def _log(*args: Any, **kwargs: Any) -> Any:
    x, base = unpack("math.log", args, kwargs, ("x", "base"), 1)
    x = _number("math.log", x)
    try:
        if base is _MISSING:
            return _finite("math.log", math.log(x))
        return _finite("math.log", math.log(x, _number("math.log", base)))
    except (ValueError, ZeroDivisionError):
        raise CallError("math.log: math domain error") from None
    except OverflowError:
        raise CallError("math.log: result out of range") from None


_UNARY: Final = [
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atanh",
    "cos",
    "cosh",
    "degrees",
    "exp",
    "fabs",
    "gamma",
    "radians",
    "sin",
    "sinh",
    "sqrt",
    "tan",
    "tanh",
]
_BINARY: Final[dict[str, tuple[Callable[[float, float], float], tuple[str, str]]]] = {
    "atan2": (math.atan2, ("y", "x")),
    "copysign": (math.copysign, ("x", "y")),
    "hypot": (math.hypot, ("x", "y")),
    "mod": (math.fmod, ("x", "y")),
    "pow": (math.pow, ("x", "y")),
    "remainder": (math.remainder, ("x", "y")),
}


def _math_functions() -> dict[str, Callable[..., Any]]:
    functions: dict[str, Callable[..., Any]] = {}
    for name in _UNARY:
        functions[name] = _float_function(name, getattr(math, name), ("x",))
    for name, (impl, names) in _BINARY.items():
        functions[name] = _float_function(name, impl, names)
    for name in ("floor", "ceil", "round"):
        functions[name] = _rounding_function(name)
    functions["log"] = _log
    return dict(sorted(functions.items()))


MATH_FUNCTIONS: Final = _math_functions()
"""``math`` functions by name (the list in docs/reference/program.md, minus the constants)."""
MATH_CONSTANTS: Final = {"e": math.e, "pi": math.pi}


# ------------------------------------------------------------------------------------------ json

JSON_MAX_DEPTH: Final = 100
"""Deepest document ``json.decode`` accepts (starlark-rust's decoder stops at 128)."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid number {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number out of range: {text[:32]}")
    return value


#: Digits of the longest integer json.decode can return (UINT64_MAX); JSON allows no leading zeros.
_MAX_INT_DIGITS: Final = len(str(UINT64_MAX))
#: A UTF-16 surrogate left alone by a ``\u`` escape (a pair decodes to one character).
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _bounded_int(text: str) -> int:
    # The length first: CPython refuses to parse more than 4,300 digits, in words of its own.
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise ValueError(f"integer out of range: {text[:32]}")
    value = int(text)
    if value < -INT64_MAX - 1 or value > UINT64_MAX:
        raise ValueError(f"integer out of range: {text[:32]}")
    return value


def _decoded_problem(value: Any, limit: int) -> str:
    """Why starlark-rust cannot take a document Python decoded to ``value``, or ``""``: nesting
    deeper than ``limit``, or a lone surrogate in a string (Python keeps it, serde_json refuses)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return "nesting too deep"
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return "lone surrogate in a \\u escape"
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, dict):
            stack.extend((key, depth + 1) for key in item)
            stack.extend((child, depth + 1) for child in item.values())
    return ""


def _strict_loads(text: str) -> Any:
    return json.loads(
        text, parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_bounded_int
    )


def json_check(*args: Any, **kwargs: Any) -> str:
    """``""`` when ``x`` is a JSON text starlark-rust's ``json.decode`` can safely decode,
    else the reason it cannot (finite numbers, 64-bit ints, depth at most 100, no lone
    surrogates)."""
    (text,) = unpack("json.decode", args, kwargs, ("x",), 1)
    if not isinstance(text, str):
        return f"json.decode: got {kind_of(text)}, want str"
    try:
        value = _strict_loads(text)
    except RecursionError:
        return "json.decode: nesting too deep"
    except ValueError as exc:
        return f"json.decode: {exc}"
    problem = _decoded_problem(value, JSON_MAX_DEPTH)
    return f"json.decode: {problem}" if problem else ""


def json_fail(*args: Any, **kwargs: Any) -> Any:
    """Raise the reason ``json_check`` gave."""
    (reason,) = unpack("json.decode", args, kwargs, ("reason",), 1)
    raise CallError(str(reason))


def json_encode_marked(*args: Any, **kwargs: Any) -> Any:
    """``json.encode`` of a value the sanitizer marked: always fails, naming the first problem."""
    (value,) = unpack("json.encode", args, kwargs, ("x",), 1)
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Overflow):
            raise CallError("json.encode: value nested too deeply")
        if isinstance(item, NonFiniteFloat):
            raise CallError(f"json.encode: cannot encode non-finite float {item.text}")
        if isinstance(item, NonStringKeys):
            raise CallError("json.encode: dict keys must be strings")
        if isinstance(item, Unsupported):
            raise CallError(f"json.encode: cannot encode {item.starlark_type}")
        if isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
    raise CallError("json.encode: value cannot be encoded")


def indent_text(text: str, prefix: str, indent: str) -> str:
    """Re-indent valid JSON like Go's ``json.Indent`` (literals kept verbatim)."""
    out: list[str] = []
    depth = 0
    pending_open = False
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch in " \t\r\n":
            i += 1
            continue
        if pending_open and ch not in "]}":
            pending_open = False
            depth += 1
            out.append("\n" + prefix + indent * depth)
        if ch == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
            continue
        if ch in "[{":
            out.append(ch)
            pending_open = True
        elif ch == ",":
            out.append(ch + "\n" + prefix + indent * depth)
        elif ch == ":":
            out.append(": ")
        elif ch in "]}":
            if pending_open:
                pending_open = False
            else:
                depth -= 1
                out.append("\n" + prefix + indent * depth)
            out.append(ch)
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def json_indent(*args: Any, **kwargs: Any) -> Any:
    """``json.indent(str, prefix="", indent="\\t")``."""
    text, prefix, indent = unpack("json.indent", args, kwargs, ("str", "prefix", "indent"), 1)
    prefix = "" if prefix is _MISSING else prefix
    indent = "\t" if indent is _MISSING else indent
    for label, value in (("str", text), ("prefix", prefix), ("indent", indent)):
        if not isinstance(value, str):
            raise CallError(f"json.indent: {label} must be str, got {kind_of(value)}")
    try:
        json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        raise CallError("json.indent: invalid JSON") from None
    return indent_text(text, prefix, indent)
