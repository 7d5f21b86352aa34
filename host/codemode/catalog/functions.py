"""Plain typed functions as capability handlers (docs/reference/capabilities.md, "Handlers").

A handler is one of two forms:

* **the handler form** ``(ctx, subject, args: In) -> Out`` or ``(ctx, subject) -> Out``: exactly two
  or three positional parameters whose first two are either unannotated, annotated ``Any`` or
  ``object``, or annotated ``codemode.CallContext`` and ``codemode.Subject`` (in that order);
  ``args`` is the whole input, a dataclass. This is the form codemode always had.
* **a plain function**, anything else: ``def lookup(city: str, days: int = 1) -> Forecast``. Each
  parameter is one input field (its annotation the field's type, its default the field's default);
  a parameter annotated ``codemode.CallContext`` receives the call's context and one annotated
  ``codemode.Subject`` the trusted caller, whatever their names, and neither is an input field.

The result type of either form is a dataclass, a TypedDict, a pydantic model, a plain JSON type
(``str``, ``int``, ``float``, ``bool``, ``list[T]``, ``dict[str, T]``, ``T | None``) or ``None``
(the call then returns ``{}``). A plain function is wrapped in a ``(ctx, subject, args)`` handler,
so the pipeline (rebind, authorize, dispatch) is the same for both.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Any

from ..common.passed import passed_kind
from .types import HandlerTypes, OutputError, PlainValue, Shape, TypeProblem, compile_type, to_plain

__all__ = ["compile_handler", "is_handler_form"]

#: How the pipeline's ``(ctx, subject, args)`` becomes a plain function's (positional, keywords).
_Arguments = Callable[..., tuple[tuple[Any, ...], dict[str, Any]]]

_LOOSE = (inspect.Parameter.empty, Any, object)
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _label(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__qualname__', None) or getattr(fn, '__name__', None) or type(fn).__name__}()"


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn).__call__
    try:
        return typing.get_type_hints(target)
    except Exception as exc:
        raise TypeProblem(f"{_label(fn)}: cannot resolve its annotations: {exc}") from None


def is_handler_form(params: list[inspect.Parameter], hints: Mapping[str, Any]) -> bool:
    """Whether a signature is the ``(ctx, subject[, args])`` handler form (module docstring).

    Args:
        params: the function's parameters.
        hints: its resolved annotations.

    Returns:
        True for the handler form, False for a plain function.
    """
    if len(params) not in (2, 3) or any(p.kind not in _POSITIONAL for p in params):
        return False
    for param, kind in zip(params[:2], ("ctx", "subject"), strict=True):
        hint = hints.get(param.name, inspect.Parameter.empty)
        if hint not in _LOOSE and passed_kind(hint) != kind:
            return False
    return True


def compile_handler(fn: Callable[..., Any]) -> tuple[HandlerTypes, Callable[..., Any]]:
    """The shapes and types of a handler of either form, and the ``(ctx, subject[, args])`` callable
    the pipeline runs (``fn`` itself for the handler form with a dataclass result).

    Args:
        fn: a function, method or callable object.

    Returns:
        ``(input shape, output shape, input type, output type)`` and the handler to call.

    Raises:
        TypeProblem: one line naming the function (and the parameter) whose annotation is missing or
            outside the type model.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise TypeProblem(f"handler has no inspectable signature: {exc}") from None
    params = list(sig.parameters.values())
    hints = _hints(fn)
    if "return" not in hints:
        raise TypeProblem(f"{_label(fn)}: no return annotation")
    out_shape, out_tp, convert = _result(fn, hints["return"])
    if is_handler_form(params, hints):
        if len(params) == 3:
            in_tp = hints.get(params[2].name)
            if in_tp is None:
                raise TypeProblem(f"{_label(fn)}: parameter {params[2].name!r} has no type annotation")
            if not (isinstance(in_tp, type) and dataclasses.is_dataclass(in_tp)):
                name = getattr(in_tp, "__name__", in_tp)
                raise TypeProblem(
                    f"{_label(fn)}: parameter {params[2].name!r}: input type {name} must be a dataclass "
                    "(or annotate each input as its own parameter)"
                )
            in_shape = compile_type(in_tp, inputs=True)
        else:
            in_tp, in_shape = None, {"t": "record", "fields": []}
        handler = fn if convert is None else _converting(fn, convert, None)
        return (in_shape, out_shape, in_tp, out_tp), handler
    return _plain_function(fn, params, hints, out_shape, out_tp, convert)


def _result(fn: Callable[..., Any], tp: Any) -> tuple[Shape, Any, Callable[[Any], Any] | None]:
    """The result's shape, its type, and how a result becomes a plain value (None: as it is)."""
    if tp is None or tp is type(None):
        return {"t": "record", "fields": []}, tp, lambda _result: PlainValue({})
    try:
        shape = compile_type(tp)
    except TypeProblem as exc:
        raise TypeProblem(f"{_label(fn)}: result: {exc}") from None
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return shape, tp, None
    return shape, tp, lambda result: PlainValue(_dump(result))


def _dump(value: Any) -> Any:
    """A pydantic model as its plain dict (nested models too); anything else as it is."""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return dump()
    return value


def _plain_function(
    fn: Callable[..., Any],
    params: list[inspect.Parameter],
    hints: Mapping[str, Any],
    out_shape: Shape,
    out_tp: Any,
    convert: Callable[[Any], Any] | None,
) -> tuple[HandlerTypes, Callable[..., Any]]:
    fields: list[tuple[str, Any, Any]] = []  # (name, annotation, dataclasses.field or MISSING)
    positional: list[tuple[str, str | None]] = []  # positional-only: (name, passed kind)
    keywords: list[tuple[str, str | None]] = []
    for p in params:
        where = f"{_label(fn)}: parameter {p.name!r}"
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeProblem(f"{where}: *args and **kwargs are not supported (name each input)")
        if p.name not in hints:
            raise TypeProblem(f"{where} has no type annotation")
        hint = hints[p.name]
        kind = passed_kind(hint)
        (positional if p.kind == p.POSITIONAL_ONLY else keywords).append((p.name, kind))
        if kind is not None:
            if p.default is not p.empty:
                raise TypeProblem(f"{where}: the {kind} parameter takes no default")
            continue
        try:
            shape = compile_type(hint, inputs=True)
        except TypeProblem as exc:
            raise TypeProblem(f"{where}: {exc}") from None
        if p.default is p.empty:
            fields.append((p.name, hint, dataclasses.MISSING))
            continue
        if p.default is not None:
            try:
                to_plain(shape if shape["t"] != "opt" else shape["of"], p.default, p.name)
            except OutputError as exc:
                raise TypeProblem(
                    f"{where}: the default {p.default!r} is not a value of its type ({exc})"
                ) from None
        fresh = functools.partial(copy.deepcopy, p.default)  # a list default is never shared between calls
        fields.append((p.name, hint, dataclasses.field(default_factory=fresh)))
    in_tp = dataclasses.make_dataclass(
        f"{getattr(fn, '__name__', 'capability')}_arguments",
        [(name, hint) if spec is dataclasses.MISSING else (name, hint, spec) for name, hint, spec in fields],
    )
    in_shape = compile_type(in_tp, inputs=True)
    run = _converting(fn, convert, _arguments(positional, keywords))
    return (in_shape, out_shape, in_tp, out_tp), run


def _arguments(
    positional: list[tuple[str, str | None]], keywords: list[tuple[str, str | None]]
) -> _Arguments:
    """How the pipeline's ``(ctx, subject, args)`` becomes the function's own arguments."""

    def pick(name: str, kind: str | None, ctx: Any, subject: Any, args: Any) -> Any:
        if kind == "ctx":
            return ctx
        if kind == "subject":
            return subject
        return getattr(args, name)

    def arguments(ctx: Any, subject: Any, args: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (
            tuple(pick(n, k, ctx, subject, args) for n, k in positional),
            {n: pick(n, k, ctx, subject, args) for n, k in keywords},
        )

    return arguments


def _converting(
    fn: Callable[..., Any], convert: Callable[[Any], Any] | None, arguments: _Arguments | None
) -> Callable[..., Any]:
    """``fn`` as a ``(ctx, subject[, args])`` handler (sync or async like ``fn``), its result
    converted by ``convert``. ``arguments`` maps the pipeline's arguments to the function's
    ``(positional, keywords)`` (None: passed as they are)."""

    def finish(result: Any) -> Any:
        return convert(result) if convert is not None else result

    def split(*call: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return arguments(*call) if arguments is not None else (call, {})

    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):  # noqa: B004

        async def run_async(*call: Any) -> Any:
            positional, keywords = split(*call)
            return finish(await fn(*positional, **keywords))

        return functools.update_wrapper(run_async, fn)

    def run_sync(*call: Any) -> Any:
        positional, keywords = split(*call)
        return finish(fn(*positional, **keywords))

    return functools.update_wrapper(run_sync, fn)
