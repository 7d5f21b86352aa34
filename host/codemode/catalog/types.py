"""The type model: handler annotations compiled once into shapes.

A Python annotation (the table in docs/reference/capabilities.md) is compiled into a serializable
*shape* (``codemode_worker.shapes``, so the worker can bind without host code); from it this module can

* render the model-facing notation (inputs use ``T | None``; outputs use ``{field: T, opt?: U}``),
* build the exact typed input (dataclass instances) from a canonical map,
* convert a handler's output into a plain bounded value.

Binding itself (normalizing an untrusted value with path diagnostics) is the shared pure function
``codemode_worker.shapes.bind``; the host runs its own copy on whatever the worker sends.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

from codemode_worker.shapes import ANY, MAX_ENUM_VALUES, render, render_field

from ..common.passed import passed_kind

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "Construct",
    "FieldDoc",
    "HandlerTypes",
    "OutputError",
    "PlainRecord",
    "PlainValue",
    "Shape",
    "TypeProblem",
    "compile_type",
    "construct",
    "constructor",
    "describe_fields",
    "signature",
    "to_plain",
    "without_defaults",
]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

#: A serializable type shape (``codemode_worker.shapes``): ``{"t": "record", "fields": [...]}``.
Shape = dict[str, Any]


class TypeProblem(Exception):
    """An annotation outside the supported type model."""


class OutputError(Exception):
    """A handler returned a value that does not fit its declared output type (host-log detail)."""


_SCALARS: dict[Any, str] = {str: "str", int: "int", bool: "bool", float: "float"}


def compile_type(tp: Any, _stack: tuple[type, ...] = (), *, inputs: bool = False) -> Shape:
    """Compile an annotation into a shape.

    Args:
        tp: the annotation (a scalar, ``Literal`` of strings, ``T | None``, ``list``, ``dict`` with
            ``str`` keys, or a dataclass of those).
        _stack: the dataclasses being compiled around this one (recursion detection; internal).
        inputs: the type is a capability's input, where a field's default makes it optional (see
            :func:`_field`); an output's defaults change nothing (the handler always produces it).

    Returns:
        The shape.

    Raises:
        TypeProblem: the annotation is outside the type model (the message names what).
    """
    if tp in _SCALARS:
        return {"t": _SCALARS[tp]}
    if tp is Any:  # JSON-any (``json`` in signatures): any plain value, within the value limits
        return {"t": ANY}
    if inputs and passed_kind(tp) is not None:
        # A Subject (or CallContext) the program could write would be a caller it chose.
        raise TypeProblem(
            f"{_name(tp)} is passed by the host, never an input: annotate a parameter of a plain "
            f"function exactly {_name(tp)} to receive it"
        )
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        if not args or not all(type(a) is str for a in args):
            raise TypeProblem(f"unsupported {_name(tp)} (only Literal of strings is allowed)")
        if len(args) > MAX_ENUM_VALUES:
            raise TypeProblem(f"Literal lists more than {MAX_ENUM_VALUES} values")
        return {"t": "str", "enum": list(dict.fromkeys(args))}
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1 or len(args) != 2:
            raise TypeProblem(f"unsupported union {_name(tp)} (only T | None is allowed)")
        inner = compile_type(rest[0], _stack, inputs=inputs)
        return inner if inner["t"] == "opt" else {"t": "opt", "of": inner}
    if origin is list:
        if len(args) != 1:
            raise TypeProblem("list needs one element type")
        return {"t": "list", "of": compile_type(args[0], _stack, inputs=inputs)}
    if origin is dict:
        if len(args) != 2:
            raise TypeProblem("dict needs key and value types")
        if args[0] is not str:
            raise TypeProblem(f"unsupported dict key type {_name(args[0])} (keys must be str)")
        return {"t": "dict", "of": compile_type(args[1], _stack, inputs=inputs)}
    if not inputs and (typing.is_typeddict(tp) or _is_model(tp)):
        return _result_record(tp, _stack)
    if typing.is_typeddict(tp) or _is_model(tp):
        raise TypeProblem(f"{_name(tp)} is accepted only as a result type: use a dataclass for inputs")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if tp in _stack:
            raise TypeProblem(f"recursive type {tp.__name__}")
        hints = _hints(tp)
        fields = []
        for f in dataclasses.fields(tp):
            if not f.init:
                raise TypeProblem(f"field {tp.__name__}.{f.name} is not an init field")
            try:
                shape = compile_type(hints[f.name], (*_stack, tp), inputs=inputs)
            except TypeProblem as exc:
                raise TypeProblem(f"{tp.__name__}.{f.name}: {exc}") from None
            fields.append(_field(tp, f, shape) if inputs else {"name": f.name, "shape": shape})
        return {"t": "record", "fields": fields}
    raise TypeProblem(f"unsupported type {_name(tp)}")


def _is_model(tp: Any) -> bool:
    """A pydantic model class (pydantic is imported only if it is installed)."""
    if not isinstance(tp, type):
        return False
    try:
        from pydantic import BaseModel
    except ImportError:  # pragma: no cover - pydantic ships with codemode (FastAPI)
        return False
    return issubclass(tp, BaseModel)


def _result_record(tp: Any, stack: tuple[type, ...]) -> Shape:
    """The record shape of a TypedDict or a pydantic model used as a result type: its keys (fields)
    in declaration order; a key that may be missing (``NotRequired``, ``total=False``; a model field
    with a default) is optional."""
    if tp in stack:
        raise TypeProblem(f"recursive type {tp.__name__}")
    if _is_model(tp):
        members = [(n, f.annotation, f.is_required()) for n, f in tp.model_fields.items()]
    else:
        members = _typed_dict_keys(tp)
    fields = []
    for name, hint, needed in members:
        try:
            shape = compile_type(hint, (*stack, tp))
        except TypeProblem as exc:
            raise TypeProblem(f"{tp.__name__}.{name}: {exc}") from None
        if not needed and shape["t"] != "opt":
            shape = {"t": "opt", "of": shape}
        fields.append({"name": name, "shape": shape})
    return {"t": "record", "fields": fields}


def _typed_dict_keys(tp: Any) -> list[tuple[str, Any, bool]]:
    """(key, type, required) of a TypedDict. ``Required``/``NotRequired`` are read off the
    annotations themselves: under ``from __future__ import annotations`` Python 3.11 cannot see them
    when it builds ``__required_keys__``."""
    try:
        hints = typing.get_type_hints(tp, include_extras=True)
    except Exception as exc:
        raise TypeProblem(f"cannot resolve annotations of {tp.__name__}: {exc}") from None
    out = []
    for name, hint in hints.items():
        needed = name in tp.__required_keys__
        while typing.get_origin(hint) in (typing.Required, typing.NotRequired, typing.Annotated):
            if typing.get_origin(hint) is not typing.Annotated:
                needed = typing.get_origin(hint) is typing.Required
            hint = typing.get_args(hint)[0]
        out.append((name, hint, needed))
    return out


def _field(tp: type, f: dataclasses.Field[Any], shape: Shape) -> dict[str, Any]:
    """A record field; a field with a default other than None may be omitted (its shape becomes
    ``opt``) and carries the default, shown in signatures and applied when the call omits it."""
    if f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        return {"name": f.name, "shape": shape}
    optional = shape if shape["t"] == "opt" else {"t": "opt", "of": shape}
    if default is None:
        return {"name": f.name, "shape": optional}
    try:
        plain = to_plain(shape if shape["t"] != "opt" else shape["of"], default, f.name)
    except OutputError as exc:
        raise TypeProblem(
            f"{tp.__name__}.{f.name}: the default {default!r} is not a value of its type ({exc})"
        ) from None
    return {"name": f.name, "shape": optional, "default": plain}


def without_defaults(shape: Shape) -> Shape:
    """``shape`` as the worker gets it: defaults are the host's to show and apply, so the wire
    shape is the one the protocol always had (an omitted field is simply absent).

    Args:
        shape: a compiled shape, possibly with field defaults.

    Returns:
        The same shape with every ``default`` removed.
    """
    t = shape["t"]
    if t == "record":
        fields = [{"name": f["name"], "shape": without_defaults(f["shape"])} for f in shape["fields"]]
        return {"t": "record", "fields": fields}
    if t in ("list", "dict", "opt"):
        return {"t": t, "of": without_defaults(shape["of"])}
    return shape


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or repr(tp)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    cached = _HINTS.get(cls)
    if cached is None:
        try:
            cached = typing.get_type_hints(cls)
        except Exception as exc:  # unresolvable forward reference
            raise TypeProblem(f"cannot resolve annotations of {cls.__name__}: {exc}") from None
        _HINTS[cls] = cached
    return cached


def construct(tp: Any, value: Any) -> Any:
    """Build the typed value for an already-bound canonical value (trusted: it came from ``bind``).

    Args:
        tp: the annotation the value was bound to.
        value: the canonical value.

    Returns:
        The typed value (dataclass instances for records).
    """
    return constructor(tp)(value)


#: A planned constructor: canonical value in, typed value out.
Construct = Callable[[Any], Any]

_CONSTRUCTORS: dict[Any, Construct] = {}


def _same(value: Any) -> Any:
    return value


def _to_float(value: Any) -> Any:
    return None if value is None else float(value)


def constructor(tp: Any) -> Construct:
    """``construct(tp, ·)`` planned once per type: the type is inspected here, not on every call.
    A plan is published only once complete (another thread never sees one being built).

    Args:
        tp: the annotation.

    Returns:
        The constructor for values of ``tp`` (cached, except for unhashable annotations).
    """
    try:
        known = _CONSTRUCTORS.get(tp)
    except TypeError:  # an unhashable annotation: plan it every time
        return _plan(tp, {})
    if known is None:
        planning: dict[Any, Construct] = {}
        known = _plan(tp, planning)
        _CONSTRUCTORS.update(planning)
        _CONSTRUCTORS[tp] = known
    return known


def _planned(tp: Any, planning: dict[Any, Construct]) -> Construct:
    try:
        known = _CONSTRUCTORS.get(tp) or planning.get(tp)
    except TypeError:
        known = None
    return known if known is not None else _plan(tp, planning)


def _plan(tp: Any, planning: dict[Any, Construct]) -> Construct:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _planned(next(a for a in typing.get_args(tp) if a is not type(None)), planning)
    if origin is list:
        each = _planned(typing.get_args(tp)[0], planning)
        return lambda value: None if value is None else [each(v) for v in value]
    if origin is dict:
        each = _planned(typing.get_args(tp)[1], planning)
        return lambda value: None if value is None else {k: each(v) for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        fields: list[tuple[str, Construct, bool]] = []

        def build(value: Any) -> Any:
            if value is None:
                return None
            # An omitted field is None, or the dataclass's own default when it has one.
            return tp(
                **{
                    name: each(value[name]) if name in value else None
                    for name, each, has_default in fields
                    if name in value or not has_default
                }
            )

        planning[tp] = build  # a dataclass that refers to itself finds its own (unpublished) plan
        hints = _hints(tp)
        fields.extend(
            (
                f.name,
                _planned(hints[f.name], planning),
                f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING,
            )
            for f in dataclasses.fields(tp)
        )
        return build
    if tp is float:
        return _to_float
    return _same


class PlainRecord(dict[str, Any]):
    """A handler result that is a plain map (from a shape-declared capability): ``to_plain`` then
    accepts maps for the record shapes at and below it. Dataclass-typed handlers never get this."""


@dataclass(frozen=True)
class PlainValue:
    """A capability function's result (``codemode.catalog.functions``): ``to_plain`` accepts maps
    for the record shapes anywhere in it (a TypedDict, a dumped pydantic model).

    Attributes:
        value: the function's result.
    """

    value: Any


def to_plain(shape: Shape, obj: Any, path: str = "result", _plain: bool = False) -> Any:
    """Convert handler output into a plain JSON-shaped value following the output shape.

    Depth and byte bounds are checked afterwards by the caller.

    Args:
        shape: the output shape.
        obj: the handler's value.
        path: where ``obj`` is, for the error message (``result.items[2]``).
        _plain: maps are accepted for records (below a :class:`PlainRecord`; internal).

    Returns:
        The plain value (``None`` optional record fields left out).

    Raises:
        OutputError: anything that does not fit (wrong types, NaN/inf, ints outside int64,
            missing required fields, a string outside its enum).
    """
    if isinstance(obj, PlainValue):
        return to_plain(shape, obj.value, path, True)
    kind = shape["t"]
    if kind == ANY:
        return _plain_any(obj, path)
    if kind == "opt":
        return None if obj is None else to_plain(shape["of"], obj, path, _plain)
    if kind == "str":
        if isinstance(obj, str):
            if "enum" in shape and obj not in shape["enum"]:
                raise OutputError(f"{path}: value outside the declared enum")
            return obj
    elif kind == "bool":
        if isinstance(obj, bool):
            return obj
    elif kind == "int":
        if isinstance(obj, int) and not isinstance(obj, bool):
            if not INT64_MIN <= obj <= INT64_MAX:
                raise OutputError(f"{path}: int outside int64")
            return int(obj)
    elif kind == "float":
        if isinstance(obj, int | float) and not isinstance(obj, bool):
            out = float(obj)
            if not math.isfinite(out):
                raise OutputError(f"{path}: non-finite float")
            return out
    elif kind == "list":
        if isinstance(obj, list | tuple):
            return [to_plain(shape["of"], v, f"{path}[{i}]", _plain) for i, v in enumerate(obj)]
    elif kind == "dict":
        if isinstance(obj, dict):
            out_d: dict[str, Any] = {}
            for k, v in obj.items():
                if not isinstance(k, str):
                    raise OutputError(f"{path}: non-str key")
                out_d[k] = to_plain(shape["of"], v, f"{path}[{k!r}]", _plain)
            return out_d
    elif kind == "record" and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out_r: dict[str, Any] = {}
        for field in shape["fields"]:
            name = field["name"]
            if not hasattr(obj, name):
                raise OutputError(f"{path}.{name}: missing")
            converted = to_plain(field["shape"], getattr(obj, name), f"{path}.{name}", _plain)
            if converted is not None or field["shape"]["t"] != "opt":
                out_r[name] = converted
        return out_r
    elif kind == "record" and (isinstance(obj, PlainRecord) or (_plain and isinstance(obj, Mapping))):
        # Shape-declared capabilities (e.g. compiled from JSON Schema) return plain maps: declared
        # fields are kept and checked, undeclared keys are dropped.
        out_m: dict[str, Any] = {}
        for field in shape["fields"]:
            name = field["name"]
            fs = field["shape"]
            if name not in obj or obj[name] is None:
                if fs["t"] == "opt":
                    continue
                raise OutputError(f"{path}.{name}: missing")
            out_m[name] = to_plain(fs, obj[name], f"{path}.{name}", True)
        return out_m
    raise OutputError(f"{path}: expected {kind}, got {type(obj).__name__}")


def _plain_any(obj: Any, path: str) -> Any:
    """A JSON-shaped copy of ``obj`` (the ``json`` kind): None, bool, int64, finite float, str,
    lists (or tuples) and str-keyed dicts of those."""
    if obj is None or isinstance(obj, str | bool):
        return obj
    if isinstance(obj, int):
        if not INT64_MIN <= obj <= INT64_MAX:
            raise OutputError(f"{path}: int outside int64")
        return int(obj)
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise OutputError(f"{path}: non-finite float")
        return float(obj)
    if isinstance(obj, list | tuple):
        return [_plain_any(v, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise OutputError(f"{path}: non-str key")
            out[k] = _plain_any(v, f"{path}[{k!r}]")
        return out
    raise OutputError(f"{path}: expected a JSON value, got {type(obj).__name__}")


_NO_DEFAULT: Any = object()


@dataclass(frozen=True)
class FieldDoc:
    """One field of a ``describe_api`` answer's ``input`` or ``output`` list.

    Attributes:
        name: the field name.
        type: its notation.
        required: whether a call must give it (input) or it is always present (output).
        default: the value used when an input omits it (absent when it has none).
    """

    name: str
    type: str
    required: bool
    default: Any = _NO_DEFAULT

    def to_dict(self) -> dict[str, Any]:
        """The field as ``describe_api`` answers it.

        Returns:
            ``{name, type, required}``, plus ``default`` when the field has one.
        """
        out = {"name": self.name, "type": self.type, "required": self.required}
        if self.default is not _NO_DEFAULT:
            out["default"] = self.default
        return out


def describe_fields(record: Shape, *, output: bool) -> list[FieldDoc]:
    """Flat ``{name, type, required}`` items of a root record, in declaration order.

    Inputs keep ``| None`` in the type of an optional field (a field with a default shows its
    inner type and the default); outputs show the inner type and mark optionality by
    ``required: false`` (nested optional output fields use ``name?:``).

    Args:
        record: a root record shape.
        output: whether it is an output (else an input).

    Returns:
        One :class:`FieldDoc` per field.
    """
    items = []
    for f in record["fields"]:
        fs = f["shape"]
        required = fs["t"] != "opt"
        if output:
            items.append(FieldDoc(f["name"], render(fs if required else fs["of"], output=True), required))
        elif "default" in f:  # may be omitted: the type without "| None", and the default
            items.append(FieldDoc(f["name"], render(fs["of"]), False, f["default"]))
        else:
            items.append(FieldDoc(f["name"], render(fs), required))
    return items


def signature(name: str, record: Shape) -> str:
    """A capability's call signature: ``records.lookup(*, key: str, limit: int | None)`` or
    ``records.status()``.

    Args:
        name: the dotted capability name.
        record: its input record shape.

    Returns:
        The signature text (keyword-only parameters).
    """
    if not record["fields"]:
        return f"{name}()"
    params = ", ".join(render_field(f) for f in record["fields"])
    return f"{name}(*, {params})"


#: (input shape, output shape, input type, output type) of a handler.
HandlerTypes = tuple[Shape, Shape, Any, Any]
