"""Shapes: serializable type descriptions, their model-facing notation, and argument binding.

A shape is JSON (see ``docs/ARCHITECTURE.md``)::

    {"t": "str"} | {"t": "int"} | {"t": "bool"} | {"t": "float"}
    {"t": "str", "enum": ["open", "closed"]}      (a string restricted to the listed values)
    {"t": "list", "of": SHAPE} | {"t": "dict", "of": SHAPE} | {"t": "opt", "of": SHAPE}
    {"t": "record", "fields": [{"name": "a", "shape": SHAPE}, ...]}
    {"t": "any"}                                  (any JSON-shaped value, shown as ``json``)

``bind`` checks one value against a shape and returns a fresh normalized, JSON-shaped copy (ints
given for floats become floats, tuples become lists, omitted/None optional record fields are
absent, ``None`` inside lists/dicts is kept). Failures raise ``BindError`` whose ``diagnostic``
is the text shown after ``invalid capability arguments: ``.

``bind`` trusts its shape: shapes received over the wire must pass ``validate_shape`` first
(which bounds their depth, so binding recursion is bounded by it). Pure Python: the host imports
this module too.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, Final

from .values import INT64_MAX, INT64_MIN, NonFiniteFloat, NonStringKeys, kind_of

__all__ = [
    "ANY",
    "MAX_DEFAULT_BYTES",
    "MAX_ENUM_VALUES",
    "MAX_ENUM_VALUE_BYTES",
    "MAX_SHAPE_DEPTH",
    "BindError",
    "ShapeError",
    "bind",
    "bind_arguments",
    "dict_item_path",
    "field_path",
    "list_item_path",
    "literal",
    "positional_diagnostic",
    "render",
    "render_enum",
    "render_field",
    "validate_shape",
]

MAX_SHAPE_DEPTH: Final = 64
"""Deepest shape ``validate_shape`` accepts (a scalar shape has depth 1)."""

MAX_ENUM_VALUES: Final = 256
"""Most values a string enum may list."""

MAX_ENUM_VALUE_BYTES: Final = 256
"""Longest (UTF-8 bytes) value a string enum may list."""

_ENUM_SHOWN = 8  # enum values quoted in one diagnostic before "..."

_SCALARS = frozenset({"str", "int", "bool", "float"})
#: The JSON-any kind: None, bool, int (int64), finite float, str, and lists and str-keyed dicts of
#: those (the state pack's values). Its notation is ``json``; a value still passes the call's
#: depth and byte limits (``values.check_value``) before it is bound.
ANY: Final = "any"
_WRAPPERS = frozenset({"list", "dict", "opt"})
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

Shape = Mapping[str, Any]


class ShapeError(ValueError):
    """A shape description is malformed."""


class BindError(Exception):
    """A value does not fit a shape; ``diagnostic`` says where and why."""

    def __init__(self, diagnostic: str) -> None:
        super().__init__(diagnostic)
        self.diagnostic = diagnostic


# ------------------------------------------------------------------------------------ validate


def validate_shape(obj: object, max_depth: int = MAX_SHAPE_DEPTH) -> None:
    """Check that ``obj`` is a well-formed shape no deeper than ``max_depth``.

    ``opt`` of ``opt`` is rejected; record field names are non-empty, unique strings.
    """
    stack: list[tuple[object, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise ShapeError(f"shape nested deeper than {max_depth}")
        if not isinstance(node, dict):
            raise ShapeError("shape must be an object")
        t = node.get("t")
        if not isinstance(t, str):
            raise ShapeError("shape needs a string 't'")
        if t == "str" and "enum" in node:
            if set(node) != {"t", "enum"}:
                raise ShapeError("str shape has extra keys")
            _validate_enum(node["enum"])
        elif t in _SCALARS or t == ANY:
            if set(node) != {"t"}:
                raise ShapeError(f"{t} shape has extra keys")
        elif t in _WRAPPERS:
            if set(node) != {"t", "of"}:
                raise ShapeError(f"{t} shape must have exactly 't' and 'of'")
            inner = node["of"]
            if t == "opt" and isinstance(inner, dict) and inner.get("t") == "opt":
                raise ShapeError("opt of opt")
            stack.append((inner, depth + 1))
        elif t == "record":
            if set(node) != {"t", "fields"}:
                raise ShapeError("record shape must have exactly 't' and 'fields'")
            fields = node["fields"]
            if not isinstance(fields, list):
                raise ShapeError("record fields must be a list")
            seen: set[str] = set()
            for field in fields:
                if not isinstance(field, dict) or set(field) - {"default"} != {"name", "shape"}:
                    raise ShapeError("record field must have exactly 'name' and 'shape' (and a 'default')")
                name = field["name"]
                if not isinstance(name, str) or not name:
                    raise ShapeError("record field name must be a non-empty string")
                if name in seen:
                    raise ShapeError(f"duplicate record field {name!r}")
                seen.add(name)
                stack.append((field["shape"], depth + 1))
                if "default" in field:
                    _validate_default(name, field["shape"], field["default"])
        else:
            raise ShapeError(f"unknown shape kind {t!r}")


#: A field's default as shown in signatures (``days: int = 1``), in UTF-8 bytes at most.
MAX_DEFAULT_BYTES = 256


def _validate_default(name: str, shape: object, default: object) -> None:
    """A ``default`` makes its field optional (the shape is ``opt``); it is a value of the inner
    shape, short enough to show. Only its display depends on it: an omitted field is absent on the
    wire and the host's constructor applies the default itself."""
    if not isinstance(shape, dict) or shape.get("t") != "opt" or default is None:
        raise ShapeError(f"field {name!r}: a default needs an opt shape and a value other than None")
    try:
        bind(shape["of"], default, name)
    except (BindError, KeyError, TypeError) as exc:
        raise ShapeError(f"field {name!r}: the default does not fit the field's type ({exc})") from None
    if len(literal(default).encode("utf-8", errors="surrogatepass")) > MAX_DEFAULT_BYTES:
        raise ShapeError(f"field {name!r}: the default is longer than {MAX_DEFAULT_BYTES} bytes when shown")


def _validate_enum(values: object) -> None:
    if not isinstance(values, list) or not values:
        raise ShapeError("str enum must be a non-empty list")
    if len(values) > MAX_ENUM_VALUES:
        raise ShapeError(f"str enum lists more than {MAX_ENUM_VALUES} values")
    seen: set[str] = set()
    for value in values:
        if type(value) is not str:
            raise ShapeError("str enum values must be strings")
        if len(value.encode("utf-8", errors="surrogatepass")) > MAX_ENUM_VALUE_BYTES:
            raise ShapeError(f"str enum value longer than {MAX_ENUM_VALUE_BYTES} bytes")
        if value in seen:
            raise ShapeError(f"duplicate str enum value {value!r}")
        seen.add(value)


# -------------------------------------------------------------------------------------- render


def _quoted(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def render_enum(values: list[str]) -> str:
    """``"open" | "closed"``: the notation of a string enum."""
    return " | ".join(_quoted(v) for v in values)


def _record_key(name: str) -> str:
    return name if _IDENTIFIER.match(name) else json.dumps(name, ensure_ascii=False)


def render(shape: Shape, *, output: bool = False) -> str:
    """Model-facing notation: ``str``, ``list[T]``, ``dict[str, T]``, ``T | None``,
    ``{a: T, b: U | None}``; a record field with a default reads ``size: int = 10``. The one place
    the notation is written: the host's describe and signatures use it too.

    Args:
        shape: the shape.
        output: write an output's notation: an optional record field reads ``name?: T``, and
            defaults are not shown (an output has none).

    Returns:
        The notation.

    Raises:
        ShapeError: an unknown shape kind.
    """
    t = shape["t"]
    if t == "str" and "enum" in shape:
        return render_enum(shape["enum"])
    if t in _SCALARS:
        return str(t)
    if t == ANY:
        return "json"
    if t == "list":
        return f"list[{render(shape['of'], output=output)}]"
    if t == "dict":
        return f"dict[str, {render(shape['of'], output=output)}]"
    if t == "opt":
        return f"{render(shape['of'], output=output)} | None"
    if t == "record":
        inner = ", ".join(render_field(f, _record_key(f["name"]), output=output) for f in shape["fields"])
        return "{" + inner + "}"
    raise ShapeError(f"unknown shape kind {t!r}")


def render_field(field: dict[str, Any], key: str | None = None, *, output: bool = False) -> str:
    """``name: T``, or ``name: T = <default>`` for an input field with a default (which may be
    omitted), or ``name?: T`` for an optional output field."""
    key = field["name"] if key is None else key
    if output and field["shape"]["t"] == "opt":
        return f"{key}?: {render(field['shape']['of'], output=True)}"
    if output:
        return f"{key}: {render(field['shape'], output=True)}"
    if "default" in field:
        return f"{key}: {render(field['shape']['of'])} = {literal(field['default'])}"
    return f"{key}: {render(field['shape'])}"


def literal(value: Any) -> str:
    """A plain value as a Starlark literal (``True``, ``None``, ``"text"``, ``[1, 2]``, ``{"k": 1}``)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    raise ShapeError(f"not a plain value: {type(value).__name__}")


# ----------------------------------------------------------------------------------------- paths


def _escape_key(key: str) -> str:
    out: list[str] = []
    for ch in key:
        if ch == "\\":
            out.append("\\\\")
        elif ch == "'":
            out.append("\\'")
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            if code <= 0xFF:
                out.append(f"\\x{code:02x}")
            elif code <= 0xFFFF:
                out.append(f"\\u{code:04x}")
            else:
                out.append(f"\\U{code:08x}")
    return "".join(out)


def field_path(path: str, name: str) -> str:
    """Path of a record field: ``name`` at the root, ``filter.owner`` below it."""
    return f"{path}.{name}" if path else name


def list_item_path(path: str, index: int) -> str:
    """Path of a list item: ``tags[1]``."""
    return f"{path}[{index}]"


def dict_item_path(path: str, key: str) -> str:
    """Path of a dict item: ``labels['env']`` (``\\`` and ``'`` escaped, non-printables as
    ``\\xNN``/``\\uNNNN``)."""
    return f"{path}['{_escape_key(key)}']"


def _argument(path: str) -> str:
    return f'argument "{path}"' if path else "arguments"


# ------------------------------------------------------------------------------------------ bind


def _type_error(shape: Shape, value: object, path: str) -> BindError:
    return BindError(f"{_argument(path)} must be {render(shape)}, got {kind_of(value)}")


def _accepts_kind(shape: Shape, value: object) -> bool:
    """Whether ``value`` is of the kind ``shape`` binds (its contents are not checked)."""
    t = shape["t"]
    if t == ANY:
        return True
    if t == "str":
        return type(value) is str
    if t == "int":
        return type(value) is int
    if t == "bool":
        return type(value) is bool
    if t == "float":
        return type(value) in (int, float) or isinstance(value, NonFiniteFloat)
    if t == "list":
        return isinstance(value, (list, tuple))
    return isinstance(value, (dict, NonStringKeys))


def _enum_choices(values: list[str]) -> str:
    shown = ", ".join(_quoted(v) for v in values[:_ENUM_SHOWN])
    return shown + (", ..." if len(values) > _ENUM_SHOWN else "")


def _bind_float(shape: Shape, value: object, path: str) -> float:
    if isinstance(value, NonFiniteFloat):
        raise BindError(f"{_argument(path)} must be a finite float")
    if type(value) is float:
        if not math.isfinite(value):
            raise BindError(f"{_argument(path)} must be a finite float")
        return value
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:
            raise BindError(f"{_argument(path)} must be a finite float") from None
    raise _type_error(shape, value, path)


def _bind_record(shape: Shape, value: object, path: str) -> dict[str, Any]:
    if isinstance(value, NonStringKeys):
        raise BindError(f"{_argument(path)} keys must be str")
    if not isinstance(value, dict):
        raise _type_error(shape, value, path)
    if not all(type(key) is str for key in value):
        raise BindError(f"{_argument(path)} keys must be str")
    fields = shape["fields"]
    declared = {f["name"] for f in fields}
    for key in value:
        if key not in declared:
            raise BindError(f'unknown argument "{field_path(path, key)}"')
    out: dict[str, Any] = {}
    for field in fields:
        name = field["name"]
        field_shape = field["shape"]
        child = field_path(path, name)
        optional = field_shape["t"] == "opt"
        if name not in value:
            if optional:
                continue
            raise BindError(f'missing required argument "{child}"')
        item = value[name]
        if item is None and optional:
            continue
        out[name] = bind(field_shape, item, child)
    return out


def bind(shape: Shape, value: object, path: str) -> Any:
    """Bind one value to ``shape``; ``path`` names it in diagnostics (``""`` for the root)."""
    t = shape["t"]
    if t == "str":
        if type(value) is not str:
            raise _type_error(shape, value, path)
        if "enum" in shape and value not in shape["enum"]:
            raise BindError(f"{_argument(path)} must be one of {_enum_choices(shape['enum'])}")
        return value
    if t == "int":
        if type(value) is not int:
            raise _type_error(shape, value, path)
        if value < INT64_MIN or value > INT64_MAX:
            raise BindError(f"{_argument(path)} overflows int64")
        return value
    if t == "bool":
        if type(value) is not bool:
            raise _type_error(shape, value, path)
        return value
    if t == "float":
        return _bind_float(shape, value, path)
    if t == "opt":
        if value is None:
            return None
        inner = shape["of"]
        if not _accepts_kind(inner, value):
            raise _type_error(shape, value, path)  # names the whole ``T | None``
        return bind(inner, value, path)
    if t == "list":
        if not isinstance(value, (list, tuple)):
            raise _type_error(shape, value, path)
        of = shape["of"]
        return [bind(of, item, list_item_path(path, i)) for i, item in enumerate(value)]
    if t == "dict":
        if isinstance(value, NonStringKeys):
            raise BindError(f"{_argument(path)} keys must be str")
        if not isinstance(value, dict):
            raise _type_error(shape, value, path)
        if not all(type(key) is str for key in value):
            raise BindError(f"{_argument(path)} keys must be str")
        of = shape["of"]
        return {key: bind(of, item, dict_item_path(path, key)) for key, item in value.items()}
    if t == "record":
        return _bind_record(shape, value, path)
    if t == ANY:
        return _bind_any(value, path)
    raise ShapeError(f"unknown shape kind {t!r}")


def _bind_any(value: object, path: str) -> Any:
    """A fresh JSON-shaped copy of ``value`` (tuples become lists); its depth is bounded by the
    call's value limits, checked before binding."""
    if value is None or type(value) in (str, bool):
        return value
    if type(value) is int:
        assert isinstance(value, int)
        if value < INT64_MIN or value > INT64_MAX:
            raise BindError(f"{_argument(path)} overflows int64")
        return value
    if type(value) is float or isinstance(value, NonFiniteFloat):
        if isinstance(value, NonFiniteFloat) or not math.isfinite(value):
            raise BindError(f"{_argument(path)} must be a finite float")
        return value
    if isinstance(value, (list, tuple)):
        return [_bind_any(item, list_item_path(path, i)) for i, item in enumerate(value)]
    if isinstance(value, NonStringKeys):
        raise BindError(f"{_argument(path)} keys must be str")
    if isinstance(value, dict):
        if not all(type(key) is str for key in value):
            raise BindError(f"{_argument(path)} keys must be str")
        return {key: _bind_any(item, dict_item_path(path, key)) for key, item in value.items()}
    raise BindError(f"{_argument(path)} must be json, got {kind_of(value)}")


def bind_arguments(shape: Shape, kwargs: Mapping[str, object]) -> dict[str, Any]:
    """Bind keyword arguments to a root record shape; return a fresh normalized map."""
    if shape["t"] != "record":
        raise ShapeError("arguments shape must be a record")
    result: dict[str, Any] = _bind_record(shape, dict(kwargs), "")
    return result


def positional_diagnostic(name: str, shape: Shape) -> str:
    """Diagnostic for a call that passed positional arguments to capability ``name``."""
    fields = shape.get("fields", []) if shape.get("t") == "record" else []
    required = [f["name"] for f in fields if f["shape"]["t"] != "opt"]
    shown = required or [f["name"] for f in fields[:1]]
    if not shown:
        return f"positional arguments are not accepted; call {name}() without arguments"
    keywords = ", ".join(f"{field}=..." for field in shown)
    return f"positional arguments are not accepted; call {name}({keywords}) with keywords"
