"""An operation's declared defaults (``default`` of a parameter's or a body property's schema): an
optional argument whose default is a value of its type shows it in the signature
(``done: bool = False``) and the host sends it when a call leaves the argument out, as the API
would assume it. A default of another type, ``null``, or of a structured value is ignored (the
argument stays plain optional): documents are third-party and a wrong default must not change a call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["declared_default"]

#: The first of the pair :func:`declared_default` returns when there is no usable default.
_NONE: tuple[bool, Any] = (False, None)


def _fits(shape: Mapping[str, Any], value: Any) -> bool:
    kind = shape.get("t")
    if kind == "opt":
        return value is not None and _fits(shape["of"], value)
    if kind == "str":
        return isinstance(value, str) and ("enum" not in shape or value in shape["enum"])
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "list":
        return isinstance(value, list) and all(_fits(shape["of"], item) for item in value)
    return False  # records and dicts: structured defaults are left to the API


def declared_default(schema: Any, shape: Mapping[str, Any]) -> tuple[bool, Any]:
    """The default ``schema`` declares for an optional argument of ``shape``.

    Args:
        schema: the parameter's or property's schema (its own ``default`` key; a ``$ref`` beside it
            is not followed).
        shape: the argument's compiled shape (optional: ``{"t": "opt", ...}``).

    Returns:
        ``(True, value)`` when the default is a value of the shape, else ``(False, None)``.
    """
    if not isinstance(schema, Mapping) or "default" not in schema or shape.get("t") != "opt":
        return _NONE
    value = schema["default"]
    if not _fits(shape, value):
        return _NONE
    return True, list(value) if isinstance(value, list) else value
