"""The fast path to rego-cpp: its C API called directly through regopy's own ctypes handle.

Part of :mod:`codemode.authz.rego`, which decides when to use it (``DIRECT`` is None when this
regopy does not expose every function the path needs; the public regopy API is used then). Two
things make it fast and keep results exact:

- the input document is built on rego-cpp's input stack one C call per value (about 2x faster than
  ``regopy.Input``), refusing what rego-cpp cannot represent exactly (NUL in a string, integers
  outside int64, non-finite floats, non-string keys, deep nesting);
- the evaluation's output is read as rego-cpp's own JSON text, so ``true``, ``false``, undefined and
  other values stay distinct for the caller to classify.

The evaluation releases the GIL; the per-value calls keep it (see ``_RELEASES_GIL``). An interpreter
must never be used by two threads at once: callers pass their own thread's interpreter.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from typing import Any

import regopy

from .. import PolicyError

__all__ = [
    "DIRECT",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_INPUT_DEPTH",
    "NUL_MESSAGE",
    "PUSH",
    "SURROGATE_MESSAGE",
    "DirectApi",
    "evaluate",
    "load_direct_api",
    "make_pusher",
    "plain",
]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
NUL_MESSAGE = "rego: input string contains NUL, which the evaluator cannot represent"
SURROGATE_MESSAGE = "rego: input string is not valid Unicode (lone surrogate)"
MAX_INPUT_DEPTH = 64

_LIB_FUNCTIONS = (
    "regoNewInput",
    "regoFreeInput",
    "regoInputString",
    "regoInputInt",
    "regoInputFloat",
    "regoInputBoolean",
    "regoInputNull",
    "regoInputObjectItem",
    "regoInputObject",
    "regoInputArray",
    "regoSetInput",
    "regoBundleQuery",
    "regoBundleQueryEntrypoint",
    "regoOutputOk",
    "regoOutputJSONSize",
    "regoOutputJSON",
    "regoFreeOutput",
)


# The evaluation itself releases the GIL (other threads run meanwhile). Every other call is a few
# microseconds of C: releasing and re-taking the GIL around each of them (one per input value) would
# make threads hand the GIL back and forth dozens of times per decision, so they keep it.
_RELEASES_GIL = frozenset({"regoBundleQuery", "regoBundleQueryEntrypoint"})


class DirectApi:
    """The rego-cpp C functions the fast path calls, with regopy's own argument and result types."""

    def __init__(self, lib: Any) -> None:
        keep_gil = ctypes.PyDLL(lib._name, handle=lib._handle)
        for name in _LIB_FUNCTIONS:
            declared = getattr(lib, name)
            if declared.argtypes is None:
                raise LookupError(name)
            if name in _RELEASES_GIL:
                fn = declared
            else:
                fn = getattr(keep_gil, name)
                fn.argtypes = declared.argtypes
                fn.restype = declared.restype
            setattr(self, name, fn)


def load_direct_api() -> Any | None:
    """Direct access to rego-cpp through regopy's ctypes handle, if this regopy has every function the
    fast path needs. None means: use the public regopy API."""
    try:
        from regopy import rego_shared

        api = DirectApi(rego_shared.rego)
        probe = regopy.Interpreter()
        if not isinstance(getattr(probe, "_impl", None), int):
            return None
        return api
    except Exception:
        return None


DIRECT = load_direct_api()


def make_pusher(lib: Any) -> Callable[[int, Any, int], int]:
    """A function that builds a value on rego-cpp's input stack (children first, then the container)
    and returns the OR of the C return codes (0 = all went well).

    It is the hot path of every decision (one C call per value), so the C functions are bound to locals
    and dispatch is on the exact type; subclasses (an ``IntEnum``, a ``str`` subclass, a tuple) are
    normalized to the plain type first. Anything rego-cpp cannot represent exactly raises PolicyError.
    """
    put_str = lib.regoInputString
    put_int = lib.regoInputInt
    put_float = lib.regoInputFloat
    put_bool = lib.regoInputBoolean
    put_null = lib.regoInputNull
    put_item = lib.regoInputObjectItem
    put_object = lib.regoInputObject
    put_array = lib.regoInputArray
    isfinite = math.isfinite

    def push(handle: int, value: Any, depth: int) -> int:
        t = type(value)
        if t is str:
            if "\x00" in value:
                raise PolicyError(NUL_MESSAGE)
            return int(put_str(handle, value.encode()))  # a lone surrogate raises UnicodeEncodeError
        if t is dict:
            if depth >= MAX_INPUT_DEPTH:
                raise PolicyError("rego: input is nested too deeply")
            rc = 0
            for k, v in value.items():
                if type(k) is not str:
                    if not isinstance(k, str):
                        raise PolicyError("rego: input object keys must be strings")
                    k = k[:]
                if "\x00" in k:
                    raise PolicyError(NUL_MESSAGE)
                rc |= put_str(handle, k.encode())
                rc |= push(handle, v, depth + 1)
                rc |= put_item(handle)
            return int(rc | put_object(handle, len(value)))
        if t is bool:
            return int(put_bool(handle, value))
        if t is int:
            if not INT64_MIN <= value <= INT64_MAX:
                raise PolicyError("rego: input integer outside the int64 range")
            return int(put_int(handle, value))
        if t is list:
            if depth >= MAX_INPUT_DEPTH:
                raise PolicyError("rego: input is nested too deeply")
            rc = 0
            for v in value:
                rc |= push(handle, v, depth + 1)
            return int(rc | put_array(handle, len(value)))
        if value is None:
            return int(put_null(handle))
        if t is float:
            if not isfinite(value):
                raise PolicyError("rego: input float is not finite")
            return int(put_float(handle, value))
        return push(handle, plain(value), depth)

    return push


def plain(value: Any) -> Any:
    """A subclass instance → the plain JSON type it stands for; anything else → PolicyError."""
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return value[:]
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list | tuple):
        return list(value)
    raise PolicyError(f"rego: input value of type {type(value).__name__} is not JSON")


PUSH = make_pusher(DIRECT) if DIRECT is not None else None


def evaluate(
    lib: Any, runner: int, bundle: int, entrypoint: bytes | None, document: dict[str, Any]
) -> tuple[bool, str]:
    """Evaluate ``document`` with interpreter ``runner`` on compiled ``bundle`` (at ``entrypoint``,
    or the bundle's query when None): (rego-cpp's ok flag, its output text)."""
    handle = lib.regoNewInput()
    if not handle:
        raise PolicyError("rego: could not build the input document")
    try:
        assert PUSH is not None
        try:
            failed = PUSH(handle, document, 0) or lib.regoSetInput(runner, handle)
        except UnicodeEncodeError:
            raise PolicyError(SURROGATE_MESSAGE) from None
        if failed:
            raise PolicyError("rego: could not build the input document")
    finally:
        lib.regoFreeInput(handle)
    if entrypoint is not None:
        out = lib.regoBundleQueryEntrypoint(runner, bundle, entrypoint)
    else:
        out = lib.regoBundleQuery(runner, bundle)
    if not out:
        raise PolicyError("rego: evaluation failed")
    try:
        ok = bool(lib.regoOutputOk(out))
        size = lib.regoOutputJSONSize(out)
        buf = ctypes.create_string_buffer(size)
        if lib.regoOutputJSON(out, buf, size):
            raise PolicyError("rego: could not read the evaluator output")
        return ok, buf.value.decode("utf-8", errors="replace")
    finally:
        lib.regoFreeOutput(out)
